"""The periodic check reads a run's compile rows again only once its compiles changed (or after
`compile_marks.REREAD_S`): a real model at 100,000 ranks leaves millions of them, and the check
runs every 2 s. Through the real door, writers and PostgreSQL, in-process."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.detection import compile_marks, runs
from dashboard.detection.models import RunTally
from dashboard.tenancy.models import Run

pytestmark = pytest.mark.django_db

FRAME = "train.py:1:forward"


def compile_(index: int, seconds: float) -> dict:
    return {
        "t": "compile",
        "frame": FRAME,
        "index": index,
        "step": index,
        "times": {"entire_frame_compile_time_s": seconds},
    }


def graph_break() -> dict:
    return {"t": "graph_break", "frame": FRAME, "reason": "data-dependent branch", "step": 0}


def compile_reads(run: Run) -> int:
    """Statements one check of the run sends to the compile rows' table."""
    with CaptureQueriesContext(connection) as seen:
        runs.check(run)
    return sum("evidence_compileevent" in q["sql"] for q in seen.captured_queries)


def test_the_check_reads_the_compile_rows_again_only_once_compiles_arrived(send, monkeypatch):
    for rank in range(3):
        send(rank, compile_(0, 2.0), {"t": "step", "step": 0})
    run = Run.objects.get(key="run-a")
    assert compile_reads(run) > 0
    assert compile_reads(run) == 0  # nothing new: the aggregates read before
    assert RunTally.objects.get(run=run).compile_seconds == pytest.approx(6.0)
    send(1, compile_(1, 3.0), {"t": "step", "step": 1})  # a recompile: its slot counts it
    assert compile_reads(run) > 0
    tally = RunTally.objects.get(run=run)
    assert (tally.compile_seconds, tally.recompiles) == (pytest.approx(9.0), 1)


def test_what_no_slot_counts_is_read_within_the_reread_interval(send, monkeypatch):
    for rank in range(3):
        send(rank, compile_(0, 2.0), {"t": "step", "step": 0})
    run = Run.objects.get(key="run-a")
    compile_reads(run)
    send(0, graph_break())  # a graph break alone moves no compile slot
    assert compile_reads(run) == 0 and RunTally.objects.get(run=run).graph_breaks == 0
    monkeypatch.setattr(compile_marks, "REREAD_S", 0.0)
    assert compile_reads(run) > 0
    assert RunTally.objects.get(run=run).graph_breaks == 1


def compile_of(frame: str, ops: int) -> dict:
    return {"t": "compile", "frame": frame, "step": 0, "counts": {"graph_op_count": ops}}


def test_a_rank_is_judged_eager_only_on_compiles_read_after_it_was_seen_past_them(send, monkeypatch):
    """A rank's empty wrapper compile came first; its model's real graph came with the steps after it,
    in batches whose compile count was lost (a process stopped between its commit and its count): the
    kept aggregates predate the rank's progress, and must not be judged against it."""
    from dashboard.detection.models import Alert
    from ingest import writers

    send(1, compile_of("train.py:20:forward", 12))  # the model's slot is open: rank 0's adds no slot
    send(0, compile_of("train.py:9:step via contextlib.__init__", 0))
    run = Run.objects.get(key="run-a")
    runs.check(run)  # kept: rank 0 has compiled only an empty graph, at step 0, and has not passed it
    monkeypatch.setattr(writers, "_count_compiles", lambda of_run: None)
    send(0, compile_of("train.py:20:forward", 12), {"t": "step", "step": 0})
    send(0, {"t": "step", "step": 1})
    runs.check(run)
    assert not Alert.objects.filter(run=run, kind="ineffective_compile").exists()
