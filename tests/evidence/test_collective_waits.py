"""Waits in a collective that lasted STUCK_S are kept per (run, rank, step) as ingest writes the samples."""

from __future__ import annotations

import pytest

from agents import protocol
from dashboard.evidence import reads
from dashboard.evidence.models import CollectiveWait, EventLog
from dashboard.tenancy.models import Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def _sample(step: int | None, seconds: float, phase: str = "collective") -> dict:
    sample = {"t": "progress", "phase": phase, "phase_s": seconds, "op": "all_reduce", "ts": 1.0e9}
    return sample if step is None else {**sample, "step": step}


def test_the_longest_wait_per_step_is_kept_across_batches_and_the_short_ones_are_not(post):
    first = [_sample(250, 5.5), _sample(250, 6.0), _sample(250, protocol.STUCK_S - 0.5), _sample(251, 2.0)]
    assert post(make_batch(rank=1, seq=0, events=first)).status_code == 200
    later = [_sample(250, 7.0), _sample(750, 9.0, phase="step"), _sample(None, 8.0), _sample(750, 5.0)]
    assert post(make_batch(rank=1, seq=1, events=later)).status_code == 200
    assert post(make_batch(rank=1, seq=1, events=later)).status_code == 200  # a resend changes nothing
    assert post(make_batch(rank=2, seq=0, events=[_sample(250, 5.0)])).status_code == 200

    run = Run.objects.get()
    assert EventLog.objects.filter(run=run, t="progress").count() == 9  # every sample stays in the log
    assert reads.collective_waits(run.id, [250, 750]) == {250: {1: 7.0, 2: 5.0}, 750: {1: 5.0}}
    assert reads.collective_waits(run.id, [750]) == {750: {1: 5.0}}
    assert CollectiveWait.objects.count() == 3


def test_a_batch_refused_keeps_no_wait(post):
    events = [_sample(250, 6.0)]
    assert post(make_batch(rank=1, seq=0, events=events, world_size=3)).status_code == 200
    refused = post(make_batch(rank=1, seq=1, events=[_sample(300, 8.0)], world_size=5))  # another world size
    assert refused.status_code == 400
    assert list(CollectiveWait.objects.values_list("step", "seconds")) == [(250, 6.0)]
