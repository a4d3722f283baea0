"""What a page left open reads again (issue 52, item 1): the run's `now` (status, verdict, counts, ranks,
over or not), the runs list by key, and the progress push that neither shows an ended rank in its last
phase nor forgets a run whose last rank just ended."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from dashboard.delivery import notify, tasks
from dashboard.detection import runs
from dashboard.tenancy.models import Rank, Run
from tests.conftest import make_batch


def rank_rows_of(rows: list[dict[str, Any]]) -> runs.RankRows:
    """`runs.RankRows` from every rank's row, in Python: what `runs.rank_rows` asks PostgreSQL for."""
    steps = [r["last_step"] for r in rows if r["last_step"] is not None]
    gone = sorted((r for r in rows if r["status"] != "running"), key=lambda r: (r["status"] == "ok", r["rank"]))
    return runs.RankRows(
        reporting=len(rows),
        running=len(rows) - len(gone),
        last_step=max(steps, default=None),
        min_step=min(steps, default=None),
        ended=gone[: runs.STRIP_RANKS],
    )


pytestmark = pytest.mark.django_db


def bearer(token):
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@pytest.fixture
def running_run(post):
    for rank in range(3):
        events = [
            {"t": "rank_start", "host": f"node{rank}", "versions": {"torch": "2.13.0"}},
            {"t": "compile", "frame": "m.py:1:f", "index": 0, "compile_id": "0/0", "step": 0, "status": "ok"},
            {"t": "step", "step": 0},
        ]
        assert post(make_batch(run="r-open", rank=rank, events=events)).status_code == 200
    return Run.objects.get(key="r-open")


def end_rank(post, rank: int, status: str) -> None:
    end = {"t": "rank_end", "status": status, "exit_code": 1 if status == "error" else 0}
    assert post(make_batch(run="r-open", rank=rank, seq=1, events=[end])).status_code == 200


def test_now_follows_the_run_from_running_to_failed_and_over(client, token, post, running_run):
    before = client.get("/api/v1/runs/r-open/now", **bearer(token)).json()
    assert (before["status"], before["over"], before["ended"], before["verdict"]["kind"]) == (
        "running",
        False,
        None,
        "in_lockstep",
    )
    assert before["counts"]["compiles"] == 3 and before["counts"]["frames"] == 1
    assert [(r["rank"], r["status"], r["last_step"]) for r in before["ranks"]] == [(r, "running", 0) for r in range(3)]
    end_rank(post, 2, "error")
    failed = client.get("/api/v1/runs/r-open/now", **bearer(token)).json()
    assert (failed["status"], failed["over"], failed["verdict"]["kind"]) == ("failed", False, "failed")
    assert failed["ranks"][2]["status"] == "error"
    end_rank(post, 0, "ok")
    end_rank(post, 1, "ok")
    over = client.get("/api/v1/runs/r-open/now?page=x", **bearer(token)).json()
    assert over["over"] and over["ended"].startswith("The run ended after step 0; its last report came at ")
    assert client.get("/api/v1/runs/r-open/now?page=2", **bearer(token)).json()["ranks"] == []


def test_runs_list_by_key(client, token, post, running_run):
    for rank in range(2):
        assert post(make_batch(run="r-other", rank=rank, events=[{"t": "rank_start"}])).status_code == 200
    keys = lambda query: [r["key"] for r in client.get(f"/api/v1/runs{query}", **bearer(token)).json()["runs"]]  # noqa: E731
    assert sorted(keys("")) == ["r-open", "r-other"]
    assert keys("?key=r-open") == ["r-open"]
    assert sorted(keys("?key=r-open&key=r-other&key=nope")) == ["r-open", "r-other"]
    refused = client.get("/api/v1/runs?" + "&".join(f"key=k{i}" for i in range(501)), **bearer(token))
    assert refused.status_code == 400 and refused.json()["path"] == "key"


def test_progress_shows_ended_ranks_as_ended_and_an_ended_run_without_a_strip():
    ranks = [
        {"rank": 0, "last_step": 5, "status": "running"},
        {"rank": 1, "last_step": 3, "status": "error"},
        {"rank": 2, "last_step": 4, "status": "lost"},
        {"rank": 3, "last_step": 2, "status": "ok"},
        {"rank": 4, "last_step": 1, "status": "error"},  # its last sample is gone (older than SILENT_AFTER)
    ]
    row = {"for_s": 14.0, "since_step_s": 20.0, "op": "/tmp/torchinductor/x.py", "where": "w", "holding": True}
    strip = [{**row, "rank": r, "phase": "compiling", "step": 0} for r in (1, 0, 2)]
    shown = notify.ended_in_strip(strip, rank_rows_of(ranks).ended)
    assert [(r["rank"], r["phase"], r.get("ended"), r["step"], r["holding"]) for r in shown] == [
        (0, "compiling", None, 0, True),
        (1, "ended", "error", 3, False),
        (2, "ended", "lost", 4, False),
        (4, "ended", "error", 1, False),
        (3, "ended", "ok", 2, False),
    ]
    many = [{"rank": r, "last_step": 1, "status": "ok"} for r in range(100)]
    assert len(notify.ended_in_strip(strip, rank_rows_of(many).ended)) == runs.STRIP_RANKS
    run = Run(id=7, key="k", world_size=3, project_id=1)
    with mock.patch.object(notify, "_send", mock.Mock()) as send, mock.patch.object(notify.asyncio, "run"):
        notify.push_progress(run, rank_rows_of(ranks), strip)
        notify.push_progress(run, rank_rows_of([{**r, "status": "ok"} for r in ranks]), strip)
    live, ended = (call.args[0] for call in send.call_args_list)  # (run group, project group) each
    assert [r["phase"] for r in live[0][1]["message"]["strip"]] == ["compiling"] + ["ended"] * 4
    assert "strip" not in ended[0][1]["message"] and ended[0][1]["message"]["ranks_ended"] == 5


def test_the_sweep_pushes_a_run_whose_last_rank_just_ended(post, running_run):
    for rank in range(3):
        end_rank(post, rank, "ok")
    with mock.patch.object(notify, "push_progress") as push:
        tasks.sweep()
    [(run, ranks)] = [call.args for call in push.call_args_list]
    assert run.key == "r-open" and ranks.running == 0 and {r["status"] for r in ranks.ended} == {"ok"}


def test_the_push_reads_counts_and_the_ended_ranks_the_strip_shows(post):
    """PostgreSQL's answer (`runs.rank_rows`) is what every rank's row gives (`rank_rows_of`): the
    counts and steps over all ranks, by name only the first 64 that no longer run, failed ones first."""
    world = 160
    for rank in range(world):
        batch = make_batch(run="r-many", rank=rank, world_size=world, events=[{"t": "step", "step": rank % 9}])
        assert post(batch).status_code == 200
    run = Run.objects.get(key="r-many")
    statuses = {r: "ok" for r in range(0, world, 2)} | {r: "error" for r in range(1, 30, 4)} | {77: "lost"}
    for rank, status in statuses.items():
        Rank.objects.filter(run=run, rank=rank).update(status=status)
    rows = list(Rank.objects.filter(run=run).values("rank", "last_step", "status"))
    got = runs.rank_rows(run)
    assert got == rank_rows_of(rows)
    assert (got.reporting, got.running, got.last_step, got.min_step) == (world, world - len(statuses), 8, 0)
    assert len(got.ended) == runs.STRIP_RANKS and [r["status"] for r in got.ended[:9]] == ["error"] * 8 + ["lost"]
