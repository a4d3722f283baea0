"""Settle one slot: consensus, rules, alert lifecycle. Idempotent: a settled slot with no new
reports is a no-op, and all of it commits in one transaction with the slot's new state.

A settle holds its slot's advisory lock (`locks`), not the slot's row: ingest goes on counting
reports into the row meanwhile, and a report counted after the settle read the slot leaves it
pending again (`reported` above `settled_n`), so the sweep settles it once more."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboard.detection import baseline, detail, lifecycle, locks, ranks, replicas, subjects
from dashboard.detection.consensus import Consensus, consensus_of_groups
from dashboard.detection.models import Alert
from dashboard.detection.rules import CompileSlotView, Finding, GradSlotView, clean_subjects, evaluate, position
from dashboard.evidence import reads
from dashboard.ledger.models import CompileSlot, GradSlot
from dashboard.ledger.slots import replicated
from dashboard.tenancy.models import Rank


def settle_compile(slot_id: int) -> list[int]:
    """Returns the ids of alerts that changed (to deliver after commit)."""
    with transaction.atomic():
        locks.hold(locks.SETTLE_COMPILE, slot_id)  # not the slot's row: ingest counts reports into it meanwhile
        slot = CompileSlot.objects.select_related("run").filter(id=slot_id).first()
        if slot is None or not slot.pending:
            return []
        stored = reads.compile_reports(slot.run_id, slot.frame, slot.index)
        reports = stored.by_rank()
        step = min((e.step for _, e in stored.groups if e.step is not None), default=None)
        state = ranks.rank_state(slot.run, step, slot.first_seen, settings.LOCKSTEP_SILENT_AFTER)
        waited = (timezone.now() - slot.first_seen).total_seconds()
        if (
            len(reports) < slot.run.world_size
            and waited < settings.LOCKSTEP_SILENT_AFTER
            and state.behind(set(reports))
        ):
            return []  # stays pending: the sweep comes back once the slow ranks moved on
        view = CompileSlotView(
            slot.frame,
            slot.index,
            reports,
            state.accountable,
            slot.run.world_size,
            rank_info=ranks.start_facts(slot.run),
            graph_breaks=reads.break_reasons(slot.run_id, slot.frame),
            times=stored.times,
        )
        hashes = [(ranks, e.graph_norm) for ranks, e in stored.groups if e.graph_norm]
        changed, _ = _conclude(slot, view, consensus_of_groups(hashes) if hashes else None, len(reports))
        return changed


def settle_grad(slot_id: int) -> list[int]:
    with transaction.atomic():
        locks.hold(locks.SETTLE_GRAD, slot_id)
        slot = GradSlot.objects.select_related("run").filter(id=slot_id).first()
        if slot is None or not slot.pending:
            return []
        rows = reads.grad_rows(slot.run_id, slot.step, slot.group)
        reports = reads.grad_reports(rows)
        if not replicas.compared(slot.run, slot.step, slot.group):
            return _set_aside(slot, len(reports))
        verdict = consensus_of_groups((ranks, row.fps) for ranks, row in rows) if reports else None
        ref, ref_key = baseline.reference(slot.run, slot.step, slot.group)
        off_baseline = verdict is not None and ref is not None and tuple(verdict.reference) != tuple(ref)
        layout = _layout(slot.run_id, verdict) if verdict and (verdict.dissenters or off_baseline) else {}
        view = GradSlotView(slot.step, slot.group, reports, verdict, slot.run.world_size, ref, ref_key, layout)
        if reports and all(r.nonfinite for r in reports.values()):  # NaN everywhere: whose loss went first?
            view.nonfinite_losses = reads.first_nonfinite_losses(slot.run_id, slot.step)
        changed, findings = _conclude(slot, view, verdict, len(reports))
        if verdict is not None and not replicated(slot.group) and replicas.averaged(reports, slot.run.world_size):
            _keep_evidence(slot)
        if changed:  # an alert is new or changed: its first step may need naming (not on every later step)
            kinds = {f.kind for f in findings}
            if "grad_divergence" in kinds:
                _ask_for_parameters(slot, verdict)
            if kinds & WEIGHTS_CHANGED:
                _ask_for_weights(slot, kinds & WEIGHTS_CHANGED)
            if "baseline_divergence" in kinds and ref_key is not None:
                baseline.name_buckets(slot.run, ref_key, slot.group, slot.step)
        return changed


def _set_aside(slot: GradSlot, n_reports: int) -> list[int]:
    """A slot of parameters with no evidence of replication: settled, compared with nothing."""
    slot.settled_at = timezone.now()
    slot.settled_n = max(slot.reported, n_reports)
    slot.save(update_fields=["settled_at", "settled_n"])
    return []


def _keep_evidence(slot: GradSlot) -> None:
    """This step showed the "local" group's gradients averaged: later slots find it (`replicas.compared`)."""
    slot.consensus = {**slot.consensus, "replicas": True}
    slot.save(update_fields=["consensus"])


def _layout(run_id: int, verdict: Consensus[tuple[int, ...]]) -> dict[int, dict[str, Any]]:
    """The start facts (parameter names, buckets) of one reference rank, read only where ranks differ
    (from each other or from the baseline): the divergence rules name parameters from it."""
    rows = Rank.objects.filter(run_id=run_id).exclude(rank__in=[] if verdict.tie else verdict.dissenters)
    return dict(rows.filter(info__has_key="buckets").order_by("rank").values_list("rank", "info")[:1])


WEIGHTS_CHANGED = {"grad_divergence", "nonfinite_grad"}  # findings after which the replicas' weights differ


def _ask_for_weights(slot: GradSlot, kinds: set[str]) -> None:
    """A new divergence of the weights' inputs: every rank fingerprints its weights a step or two later."""
    alerts = Alert.objects.filter(
        run=slot.run, kind__in=kinds, subject=subjects.group(slot.group), state=Alert.State.FIRING, step=slot.step
    )
    alert = alerts.first()
    if alert is not None:
        detail.ask_for_weights(alert, slot.group, slot)


def _ask_for_parameters(slot: GradSlot, verdict: Consensus[tuple[int, ...]] | None) -> None:
    """First divergent step of the alert: ask the ranks for per-parameter fingerprints."""
    assert verdict is not None  # grad_divergence is found only where the ranks' fingerprints were compared
    alert = Alert.objects.filter(run=slot.run, kind="grad_divergence", subject=subjects.group(slot.group)).first()
    if alert is not None and alert.step == slot.step and "params" not in alert.details:
        reference = min(r for r in range(slot.run.world_size) if r not in verdict.dissenters)
        detail.request(alert, slot.group, verdict.dissenters, reference)


def _conclude(
    slot: CompileSlot | GradSlot,
    view: CompileSlotView | GradSlotView,
    verdict: Consensus[str] | Consensus[tuple[int, ...]] | None,
    n_reports: int,
) -> tuple[list[int], list[Finding]]:
    """Store the slot's consensus, run the rules, apply the findings: (alert ids to deliver, findings)."""
    slot.settled_at = timezone.now()
    slot.settled_n = max(slot.reported, n_reports)
    slot.dissenters = list(verdict.dissenters) if verdict else []
    slot.consensus = {"reference": _jsonable(verdict.reference), "tie": verdict.tie} if verdict else {}
    slot.save(update_fields=["settled_at", "settled_n", "dissenters", "consensus"])
    findings = evaluate(view)
    return lifecycle.apply(slot.run, findings, clean_subjects(view, findings), position(view)), findings


def _jsonable(value: str | tuple[int, ...]) -> str | list[int]:
    return list(value) if isinstance(value, tuple) else value
