"""The pages' raw SQL (the aggregates the ORM would spell badly): one cursor helper, and the other
apps' tables by their models' names, never spelled out. Statements name a table as a placeholder,
`{compile_events}`, `{graph_breaks}`, `{step_reports}`, `{grad_slots}` or `{grad_reports}`, which `rows` fills in."""

from __future__ import annotations

from typing import Any

from django.db import connection

from dashboard.evidence.models import CompileEvent, GradReport, GraphBreakEvent, StepReport
from dashboard.ledger.models import GradSlot

TABLES = {
    "{compile_events}": CompileEvent._meta.db_table,
    "{graph_breaks}": GraphBreakEvent._meta.db_table,
    "{step_reports}": StepReport._meta.db_table,
    "{grad_slots}": GradSlot._meta.db_table,
    "{grad_reports}": GradReport._meta.db_table,
}


def rows(statement: str, params: list[Any] | dict[str, Any]) -> list[tuple[Any, ...]]:
    for placeholder, table in TABLES.items():
        statement = statement.replace(placeholder, table)
    with connection.cursor() as cur:
        cur.execute(statement, params)
        found: list[tuple[Any, ...]] = cur.fetchall()
        return found
