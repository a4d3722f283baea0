"""Reliability drill: the backend goes down in the middle of a real 2-rank training job (10 s in the
suite; `python -m bench reliability` runs it for 60 s through LOCKSTEP_DRILL_DOWN_S).

Training goes on (the agent spools), and once the server is back every event is stored exactly
once: one grad row and one step row per rank and step, no batch twice, no gap in any session.
`python -m bench reliability` runs the same drill and prints the table (with step-time p99).
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter

import pytest

from dashboard.evidence.models import GradReport, StepReport
from dashboard.tenancy.models import Rank
from tests import claims
from tests.conftest import per_rank
from tests.e2e.jobs import finish, project_with_token, running, torchrun
from tests.stack import Proc, free_port, spawn, uvicorn

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

DOWN_S = float(os.environ.get("LOCKSTEP_DRILL_DOWN_S", "10"))  # the agent backs off up to 10 s: a few retries
# at 0.5 s a step, the outage starts within the first ~10 steps: 15 s or more remain after it
STEPS = int(2 * (DOWN_S + 20))


def server(stack, port: int, logdir) -> Proc:
    return spawn(
        f"drill-{port}-{time.monotonic_ns()}",
        uvicorn(port),
        stack.env,
        logdir,
    )


def wait_until(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))]


def test_backend_down_mid_run_loses_and_duplicates_nothing(stack, tmp_path, record_property):
    project, token = project_with_token("drill")
    port = free_port()
    backend = server(stack, port, tmp_path)
    drill_stack = type(stack)(f"http://127.0.0.1:{port}", stack.env, backend, stack.worker)
    drill_stack.wait_http()
    key = f"drill-{uuid.uuid4().hex[:6]}"
    job = torchrun(
        drill_stack,
        token,
        key,
        "demo/ddp_job.py",
        ["--steps", str(STEPS), "--sleep", "0.5"],
        tmp_path / "spool",
        ranks=2,
    )
    with running(job):
        wait_until(lambda: StepReport.objects.filter(run__key=key).count() >= 10, 120, "training to start")
        backend.stop()
        down_at = StepReport.objects.filter(run__key=key).count()
        outage = time.time(), time.time() + DOWN_S
        time.sleep(DOWN_S)
        assert job.poll() is None, "training must go on while the backend is down"
        backend = server(stack, port, tmp_path)
        type(stack)(drill_stack.url, stack.env, backend, stack.worker).wait_http()
        finish(job, timeout=300)
    try:
        wait_until(lambda: Rank.objects.filter(run__key=key).exclude(status="running").count() == 2, 120, "rank_end")
    finally:
        backend.stop()

    assert down_at < STEPS * 2  # the outage really fell in the middle of the run
    grads = [(rank, step) for rank, step, _ in per_rank(GradReport.objects.filter(run__key=key, group="ddp"))]
    steps = list(StepReport.objects.filter(run__key=key).values_list("rank", "step"))
    for name, reports in (("grads", grads), ("steps", steps)):
        assert Counter(rank for rank, _ in reports) == {0: STEPS, 1: STEPS}, (
            name,
            Counter(rank for rank, _ in reports),
        )
        assert len(set(reports)) == 2 * STEPS, name  # nothing twice
    for session, seqs in _seqs(key).items():
        assert seqs == list(range(len(seqs))), f"gap or repeat in session {session}"
    _record_step_times(key, outage, record_property)


def _record_step_times(key: str, outage: tuple[float, float], record_property) -> None:
    """Step-time p99 while the backend was up vs down (for bench/reliability.py's table)."""
    rows = StepReport.objects.filter(run__key=key, step__gte=5).values_list("ts", "step_time")
    down = [t for ts, t in rows if t and outage[0] <= ts.timestamp() <= outage[1]]
    up = [t for ts, t in rows if t and not outage[0] <= ts.timestamp() <= outage[1]]
    record_property("down_s", DOWN_S)
    record_property("events_lost", 0)
    record_property("events_duplicated", 0)
    record_property("step_p99_up_ms", round(1000 * p99(up), 1))
    record_property("step_p99_down_ms", round(1000 * p99(down), 1))


def _seqs(key: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for session, seq in claims.pairs(run__key=key):
        out.setdefault(session, []).append(seq)
    return out
