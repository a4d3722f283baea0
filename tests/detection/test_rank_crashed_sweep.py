"""rank_crashed through the real ingest endpoint, PostgreSQL and the periodic check (`runs.check`)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.delivery import notify
from dashboard.detection import runs, settle, subjects
from dashboard.detection.models import Alert
from dashboard.evidence.models import EventLog
from dashboard.ledger.models import GradSlot
from dashboard.tenancy.models import Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

KEY = "fxk4gqcsmvwzj3uxt2l5z3c6b5nqzvq3z3jx3a7y2kq5t3gqkq4a"
FRAME = "model/net.py:40:forward"
END = {
    "t": "rank_end",
    "status": "error",
    "exit_code": 1,
    "reason": "RuntimeError: illegal memory access",
    "exc_type": "RuntimeError",
    "where": "model/net.py:88 forward",
}
OK = {"t": "rank_end", "status": "ok", "exit_code": 0}


def job(post, run: str, crash_rank: int | None, world_size: int = 2, end: dict = END, others: dict = OK) -> Run:
    """Every rank completes step 2 (rank 1's gradient diverging), compiles FRAME in step 3 (loading it
    from the cache) and ends: `crash_rank` in that step with END, the others with `others` (cleanly)."""
    now = timezone.now().timestamp()
    for rank in range(world_size):
        events = [
            {"t": "rank_start", "host": "node1", "device": "cpu", "ts": now - 10},
            {"t": "grad", "step": 2, "fps": [1, 2 + (rank == 1)], "ts": now - 2},
            {
                "t": "compile",
                "frame": FRAME,
                "index": 0,
                "step": 3,
                "cache": {"inductor": "hit"},
                "cache_keys": {"inductor": KEY},
                "ts": now - 1,
            },
            {**(end if rank == crash_rank else others), "ts": now},
        ]
        response = post(make_batch(run=run, rank=rank, world_size=world_size, events=events))
        assert response.status_code == 200, response.content
    return Run.objects.get(key=run)


def test_a_crashed_rank_is_alerted_after_every_rank_ended(post):
    run = job(post, "crashy", crash_rank=1)
    assert run in runs.active_runs()  # every rank ended, but the sweep still has to see the crash
    runs.check(run)
    alert = Alert.objects.get(kind="rank_crashed")
    assert (alert.ranks, alert.subject, alert.severity, alert.frame, alert.step) == (
        [1],
        subjects.error(3, alert.details["exc_type"], alert.details["reason"]),
        "critical",
        FRAME,
        3,
    )
    assert alert.message.startswith("Rank 1 crashed: RuntimeError: illegal memory access")
    assert f"right after loading cached Inductor artifact {KEY[:12]}… of frame {FRAME}" in alert.message
    assert alert.details["last_compile"]["outcome"] == "hit" and alert.details["exit_code"] == 1
    assert not Alert.objects.filter(kind="rank_silent").exists()


def test_the_rank_end_body_names_the_exception_and_where(post):
    run = job(post, "crashy", crash_rank=1)
    assert EventLog.objects.filter(run=run, t="rank_end", rank=1).exists()  # ingest keeps the rank_end body
    runs.check(run)
    alert = Alert.objects.get(kind="rank_crashed")
    assert alert.message.startswith(
        "Rank 1 crashed: RuntimeError: illegal memory access at model/net.py:88 forward (step 3)"
    )
    assert (alert.details["exc_type"], alert.details["where"]) == ("RuntimeError", "model/net.py:88 forward")


def test_the_crash_inhibits_the_ranks_other_alerts(post):
    run = job(post, "crashy", crash_rank=1, world_size=3)  # three: a majority says rank 1's gradients are off
    settle.settle_grad(GradSlot.objects.get(run=run).id)
    divergence = Alert.objects.get(kind="grad_divergence")
    assert divergence.ranks == [1] and notify.message(divergence)["alert"]["inhibited"] is False
    runs.check(run)
    assert notify.message(divergence)["alert"]["inhibited"] is True


def test_clean_endings_raise_nothing_and_leave_the_sweep(post):
    run = job(post, "fine", crash_rank=None)
    assert run not in runs.active_runs()
    runs.check(run)
    assert not Alert.objects.filter(kind="rank_crashed").exists()


def test_a_crash_long_ago_leaves_the_sweep(post):
    run = job(post, "old", crash_rank=0)
    Run.objects.filter(id=run.id).update(last_seen=timezone.now() - runs.CRASH_WINDOW - timedelta(seconds=1))
    assert run not in runs.active_runs()


GLOO = (  # a survivor's all_reduce after its peer died, as torch 2.x raises it (the beach: a box without an emoji font)
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:23979. This is typically caused by a remote worker crashing. Check the logs of the remote "
    "worker before reporting an error. GLHF! \U0001f3d6\ufe0f"
)


def test_an_error_with_terminal_codes_and_control_characters_reads_as_plain_text(post):
    """Rank 0 crashes; rank 1's all_reduce raises gloo's error as a C++ logger prints it to a terminal
    (colour codes, a carriage return, a bell, a C1 control, a private-use character, gloo's own
    pictograph): stored and shown as the words only, nothing a browser draws as an empty box."""
    raw = f"\x1b[1;31mRuntimeError\x1b[0m: {GLOO}\r\n\x07\x9b\ue000"
    lost = {**END, "reason": raw, "exc_type": "\x1b[31mRuntimeError\x1b[0m", "where": "\x1b[2mc10d.py:3252 wait"}
    run = job(post, "gloo-tty", crash_rank=0, others=lost)
    runs.check(run)
    alert = Alert.objects.get(kind="rank_crashed", ranks=[1])
    words = "RuntimeError: " + GLOO.removesuffix("\U0001f3d6\ufe0f")
    assert alert.message.startswith(f"Rank 1 crashed: {words}\n?"), alert.message
    assert alert.details["reason"] == f"{words}\n?" and alert.details["exc_type"] == "RuntimeError"
    assert alert.details["where"] == "c10d.py:3252 wait" and alert.details["consequence_of"] == 0
    shown = alert.message + alert.subject + json.dumps(alert.details, ensure_ascii=False)
    assert not [c for c in shown if c != "\n" and (ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or ord(c) > 0xFFFF)]
    assert "\ufffd" not in shown and "\ufe0f" not in shown
