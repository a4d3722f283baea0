"""Baselines: run B is compared with run A step by step on the agreed (consensus) fingerprints.

Only consensus rows are compared, so the comparison costs O(slots), never O(slots x ranks).
"""
from __future__ import annotations

from dashboard.models import Baseline, GradSlot
from ingest.models import Run


def reference(run: Run, step: int, group: str) -> tuple[tuple | None, str | None]:
    """The baseline run's agreed fingerprints for this step and group, and the baseline's key."""
    link = Baseline.objects.select_related("baseline").filter(run=run).first()
    if link is None:
        return None, None
    slot = GradSlot.objects.filter(run=link.baseline, step=step, group=group, settled_at__isnull=False).first()
    ref = (slot.consensus or {}).get("reference") if slot else None
    return (tuple(ref) if ref is not None else None), link.baseline.key


def first_difference(run: Run, baseline: Run) -> tuple[int, str, list[int]] | None:
    """(step, group, buckets) of the first settled step where the two runs' consensus differs."""
    theirs = {(s.step, s.group): s.consensus.get("reference")
              for s in GradSlot.objects.filter(run=baseline, settled_at__isnull=False).only("step", "group", "consensus")}
    for slot in GradSlot.objects.filter(run=run, settled_at__isnull=False).order_by("step", "group"):
        other = theirs.get((slot.step, slot.group))
        mine = slot.consensus.get("reference")
        if other is not None and mine is not None and list(other) != list(mine):
            return slot.step, slot.group, [i for i, (a, b) in enumerate(zip(mine, other)) if a != b]
    return None
