"""Each setting has one source: dashboard/settings.py reads the environment, limits the agent shares
come from the wire protocol, and the Celery beat schedule is one table the workers can run."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from django.conf import settings

from agents import protocol

ROOT = Path(__file__).resolve().parents[2]
# Another engineer owns the development stack's process management (it starts servers with their own environment).
NOT_CHECKED = {ROOT / "dashboard" / "settings.py", *(ROOT / "dashboard" / "devstack").rglob("*.py")}


def _environment_reads(path: Path) -> list[int]:
    """Lines that touch `os.environ` or call `os.getenv`, but for the entry points'
    `os.environ.setdefault("DJANGO_SETTINGS_MODULE", ...)`: how Django finds the settings."""
    tree = ast.parse(path.read_text())
    entry_point = {
        id(node.func.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "setdefault"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "DJANGO_SETTINGS_MODULE"
    }
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv"} and id(node) not in entry_point
    )


def test_only_the_settings_module_reads_the_environment():
    offences = []
    for path in sorted([*ROOT.glob("dashboard/**/*.py"), *ROOT.glob("ingest/**/*.py")]):
        if path in NOT_CHECKED or "migrations" in path.parts:
            continue
        offences += [f"{path.relative_to(ROOT)}:{line}" for line in _environment_reads(path)]
    assert not offences, "read django.conf.settings instead:\n" + "\n".join(offences)


def test_the_environment_check_sees_a_read(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import os\nos.environ.setdefault("DJANGO_SETTINGS_MODULE", "x")\nLIMIT = os.environ.get("X")\n')
    assert _environment_reads(probe) == [3]


@pytest.mark.skipif("LOCKSTEP_MAX_BODY" in os.environ, reason="the environment overrides the default")
def test_body_limit_defaults_to_the_wire_protocols():
    assert settings.LOCKSTEP_MAX_BODY == protocol.MAX_BODY_BYTES


def test_beat_schedule_is_one_table_of_registered_tasks():
    from dashboard.celery import app

    app.loader.import_default_modules()
    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert tasks == {
        "dashboard.detection.tasks.sweep",
        "dashboard.delivery.tasks.sweep",
        "dashboard.evidence.tasks.prune_raw",
    }
    assert tasks <= set(app.tasks)
    assert app.conf.beat_schedule == settings.CELERY_BEAT_SCHEDULE
