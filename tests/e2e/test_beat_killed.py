"""The beat of a Celery worker started with `-B` (as `manage.py up` and docs/operating.md start it) killed
with SIGKILL (issue 51, item 6; was: the pool came back, beat did not, and every sweep stopped without a
word). The worker starts a new beat, and the sweeps go on: a rank that falls silent afterwards is alerted
(`rank_silent` comes from the sweep alone) and the sweep's age on /metrics stays within a few periods."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.detection import sweep_clock
from dashboard.detection.models import Alert
from dashboard.devstack.processes import alive
from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.stack import Proc, unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

BEAT = re.compile(r"beat runs as pid (\d+)")  # the worker's own line (dashboard/beat_schedule.py)


def beat_pid(worker: Proc) -> int:
    """The pid of the worker's current beat, from the last line its worker logged about it."""
    found = BEAT.findall(worker.log.read_text(errors="replace"))
    assert found, f"the worker never said where its beat runs:\n{worker.tail()}"
    return int(found[-1])


def wait_for_new_beat(worker: Proc, killed: int, timeout: float = 15) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (pid := beat_pid(worker)) != killed:
            return pid
        time.sleep(0.2)
    raise AssertionError(f"no new beat after {timeout} s:\n{worker.tail()}")


def sweep_age(client) -> float:
    text = client.get("/metrics").content.decode()
    families = text_string_to_metric_families(text)
    [age] = [s.value for f in families for s in f.samples if s.name == "lockstep_sweep_age_seconds"]
    return age


def test_the_sweeps_go_on_after_the_beat_is_killed(stack, client, settings, record_property):
    settings.LOCKSTEP_METRICS_PUBLIC = True
    killed = beat_pid(stack.worker)
    os.kill(killed, signal.SIGKILL)
    started = time.monotonic()
    revived = wait_for_new_beat(stack.worker, killed)
    record_property("beat_back_s", round(time.monotonic() - started, 1))
    assert not alive(killed) and alive(revived)

    _, token = project_with_token("beat-killed")
    run_key = unique("bk-run")

    def report(rank: int, seq: int, events: list[dict]) -> None:
        batch = make_batch(run=run_key, rank=rank, world_size=2, seq=seq, events=events)
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        assert client.post("/api/v1/ingest", batch, content_type="application/json", **headers).status_code == 200

    for rank in (0, 1):
        report(rank, 0, [{"t": "grad", "step": 0, "fps": [1, 2]}])
    deadline = time.monotonic() + 60
    silent = Alert.objects.filter(run__key=run_key, kind="rank_silent")
    seq = 0
    while not silent.exists():  # rank 0 says nothing more; rank 1 keeps its heartbeats coming
        assert time.monotonic() < deadline, f"no rank_silent within 60 s:\n{stack.worker.tail()}"
        seq += 1
        report(1, seq, [{"t": "heartbeat"}])
        time.sleep(1)
    assert silent.get().ranks == [0]
    assert sweep_age(client) < sweep_clock.stale_after()
    record_property("rank_silent_after_s", round(time.monotonic() - started, 1))
