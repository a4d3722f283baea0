"""Baselines: run B is compared with run A step by step on the agreed (consensus) fingerprints.

Only consensus rows are compared, so the comparison costs O(slots), never O(slots x ranks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import transaction

from dashboard.detection import detail, lifecycle, subjects
from dashboard.detection.consensus import Consensus
from dashboard.detection.models import Alert, Baseline
from dashboard.detection.rules import GradSlotView
from dashboard.detection.rules.baseline_divergence import baseline_divergence
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Rank, Run

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def reference(run: Run, step: int, group: str) -> tuple[tuple[int, ...] | None, str | None]:
    """The baseline run's agreed fingerprints for this step and group, and the baseline's key."""
    link = Baseline.objects.select_related("baseline").filter(run=run).first()
    if link is None:
        return None, None
    slot = GradSlot.objects.filter(run=link.baseline, step=step, group=group, settled_at__isnull=False).first()
    ref = (slot.consensus or {}).get("reference") if slot else None
    return (tuple(ref) if ref is not None else None), link.baseline.key


def first_difference(run: Run, baseline: Run) -> GradSlotView | None:
    """The first settled step (in order) where the two runs' consensus differs, as a slot view."""
    theirs = {
        (s.step, s.group): s.consensus.get("reference")
        for s in GradSlot.objects.filter(run=baseline, settled_at__isnull=False).only("step", "group", "consensus")
    }
    for slot in GradSlot.objects.filter(run=run, settled_at__isnull=False).order_by("step", "group"):
        other = theirs.get((slot.step, slot.group))
        mine = slot.consensus.get("reference")
        if other is not None and mine is not None and list(other) != list(mine):
            agreed = Consensus(reference=tuple(mine), dissenters=(), tie=False)
            return GradSlotView(slot.step, slot.group, {}, agreed, run.world_size, tuple(other), baseline.key)
    return None


def choose(run: Run, base: Run, user: User | None = None) -> Baseline:
    """Make `base` the baseline of `run` (`tasks.choose_baseline` also queues the comparison)."""
    if base.id == run.id:
        raise ValueError("a run cannot be its own baseline")
    link, _ = Baseline.objects.update_or_create(run=run, defaults={"baseline": base, "chosen_by": user})
    return link


def suggest(run: Run, base: Run) -> None:
    """Make `base` the baseline of `run` unless one was chosen already (the demo's second job)."""
    Baseline.objects.get_or_create(run=run, defaults={"baseline": base})


def compare(run: Run) -> list[int]:
    """Raise the run's baseline_divergence alert from its settled history (resolving alerts against a
    former baseline); alert ids to deliver."""
    link = Baseline.objects.select_related("baseline").filter(run=run).first()
    with transaction.atomic():
        current = subjects.baseline_prefix(link.baseline.key) if link else None
        stale = [
            (a.kind, a.subject)
            for a in Alert.objects.filter(run=run, kind="baseline_divergence", state="firing")
            if current is None or not a.subject.startswith(current)
        ]
        view = first_difference(run, link.baseline) if link else None
        findings = list(baseline_divergence(view)) if view else []
        changed = lifecycle.apply(run, findings, stale, None)
        if view is not None and view.baseline_key is not None:
            name_buckets(run, view.baseline_key, view.group, view.step)
        return changed


def name_buckets(run: Run, baseline_key: str, group: str, step: int) -> None:
    """At the first differing step, name the buckets' parameters from this run's layout (the
    baseline run's agents are gone, so per-parameter values cannot be asked for)."""
    alert = Alert.objects.filter(
        run=run, kind="baseline_divergence", subject=subjects.baseline(baseline_key, group)
    ).first()
    rank = Rank.objects.filter(run=run).order_by("rank").values_list("rank", flat=True).first()
    if alert is not None and alert.step == step and rank is not None:
        detail.name_buckets(alert, group, rank)
