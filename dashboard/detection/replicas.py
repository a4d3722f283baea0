"""Which parameters are replicas, so that their gradients and weights are compared across ranks.

The agent says so for the parameters torch's DistributedDataParallel (or a replicated DTensor)
manages. Many data-parallel loops are not that class: a hand-written all-reduce, Megatron-LM's or
DeepSpeed's own data parallelism, Horovod. Their parameters reach the server as group "local",
and what they do tells them apart: gradients averaged across ranks reach the optimizer identical
on every rank. So a "local" group is compared from the first step at which every rank reported
the same gradient fingerprints with a nonzero norm (zero gradients agree for any model, so they
prove nothing); ranks whose gradients never agree (independent models, ensembles, pipeline stages,
expert or tensor shards) are never compared. That step's grad slot keeps the evidence
(`consensus.replicas`), so later slots find it with one index probe.
"""

from __future__ import annotations

from collections.abc import Mapping

from dashboard.evidence.reads import GradRow, grad_reports, grad_rows
from dashboard.ledger.models import GradSlot
from dashboard.ledger.slots import PARAM_PREFIX, replicated
from dashboard.tenancy.models import Run


def averaged(reports: Mapping[int, GradRow], world_size: int) -> bool:
    """Every rank reported, alike, gradients that are not all zero: they were averaged across ranks."""
    if len(reports) < world_size:
        return False
    rows = list(reports.values())
    return len({r.fps for r in rows}) == 1 and all(r.norm is not None and r.norm > 0 for r in rows)


def compared(run: Run, step: int, group: str) -> bool:
    """Whether the group's slot at `step` compares ranks: the agent's word, or evidence of averaging
    at this step or an earlier one."""
    if replicated(group):
        return True
    grads = group.removeprefix(PARAM_PREFIX)
    shown = GradSlot.objects.filter(
        run=run, group=grads, step__lte=step, settled_at__isnull=False, consensus__replicas=True
    ).exists()
    return shown or averaged(grad_reports(grad_rows(run.id, step, grads)), run.world_size)
