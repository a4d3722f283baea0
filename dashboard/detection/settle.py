"""Settle one slot: consensus, rules, alerts. Idempotent: a settled slot with no new reports is a no-op."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from dashboard.delivery import notify
from dashboard.detection import alerts, slots
from dashboard.detection.consensus import consensus
from dashboard.detection.rules import CompileSlotView, GradSlotView, evaluate
from dashboard.models import Alert, CompileSlot, GradSlot


def settle_compile(slot_id: int) -> list[Alert]:
    with transaction.atomic():
        slot = CompileSlot.objects.select_for_update().select_related("run").filter(id=slot_id).first()
        if slot is None or not slot.pending:
            return []
        reports = slots.compile_reports(slot)
        state = slots.rank_state(slot.run, slot.first_seen)
        view = CompileSlotView(slot.frame, slot.index, reports, state.accountable(), slot.run.world_size)
        hashes = {r: e.graph_norm for r, e in reports.items() if e.graph_norm}
        verdict = consensus(hashes) if hashes else None
        _mark(slot, len(reports), verdict)
        fresh = alerts.record_all(slot.run, evaluate(view))
        transaction.on_commit(lambda: notify.alerts(fresh))
    return fresh


def settle_grad(slot_id: int) -> list[Alert]:
    with transaction.atomic():
        slot = GradSlot.objects.select_for_update().select_related("run").filter(id=slot_id).first()
        if slot is None or not slot.pending:
            return []
        reports = slots.grad_reports(slot)
        verdict = consensus({r: tuple(g.fps) for r, g in reports.items()}) if reports else None
        view = GradSlotView(slot.step, slot.group, reports, verdict, slot.run.world_size)
        _mark(slot, len(reports), verdict)
        fresh = alerts.record_all(slot.run, evaluate(view))
        transaction.on_commit(lambda: notify.alerts(fresh))
    return fresh


def _mark(slot, n_reports: int, verdict) -> None:
    slot.settled_at = timezone.now()
    slot.settled_n = max(slot.reported, n_reports)
    slot.dissenters = list(verdict.dissenters) if verdict else []
    slot.consensus = {"reference": _jsonable(verdict.reference), "tie": verdict.tie} if verdict else {}
    slot.save(update_fields=["settled_at", "settled_n", "dissenters", "consensus"])


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value
