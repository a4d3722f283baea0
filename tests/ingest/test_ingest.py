"""POST /api/v1/ingest: the whole error contract, idempotency, and what a good batch stores."""

from __future__ import annotations

import gzip
import json

import pytest

from dashboard.evidence.models import CompileEvent, EventLog, GradReport
from dashboard.tenancy.models import Project, ProjectToken, Rank, Run
from tests import claims
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


def stored_counts() -> tuple[int, ...]:
    return (
        Run.objects.count(),
        Rank.objects.count(),
        claims.count(),
        GradReport.objects.count(),
        CompileEvent.objects.count(),
    )


def test_accepts_a_batch_and_stores_every_event(post):
    events = [
        {"t": "rank_start", "host": "node7", "pid": 42, "versions": {"torch": "2.13.0"}},
        {
            "t": "compile",
            "frame": "train.py:10:forward",
            "index": 0,
            "step": 0,
            "hashes": {"dynamo": {"raw": "a" * 16, "norm": "b" * 16}},
            "times": {"entire_frame_compile_time_s": 1.5},
        },
        {"t": "grad", "step": 0, "fps": [1, 2, (1 << 64) - 1], "nonfinite": 0},
        {"t": "step", "step": 0, "step_time": 0.25},
    ]
    response = post(make_batch(events=events, rank=2))
    assert response.status_code == 200, response.content
    assert response.json() == {"accepted": 4, "duplicate": False, "want_blobs": [], "detail": []}
    run = Run.objects.get(key="run-a")
    assert (run.world_size, run.torch_version, run.last_step) == (3, "2.13.0", 0)
    rank = Rank.objects.get(run=run, rank=2)
    assert (rank.host, rank.pid) == ("node7", 42)
    assert GradReport.objects.get().fps == [1, 2, -1]  # u64 max keeps its bits as bigint -1
    event = CompileEvent.objects.get()
    assert (event.frame, event.graph_norm, event.compile_time) == ("train.py:10:forward", "b" * 16, 1.5)


def test_runtime_autotuning_lands_in_the_event_log(post):
    runtime = {
        "t": "compile_runtime",
        "frame": "train.py:10:forward",
        "compile_id": "0/0",
        "times": {"runtime_autotune_time_s": 0.061},
    }
    assert post(make_batch(events=[runtime])).status_code == 200
    assert EventLog.objects.get(t="compile_runtime").body["times"] == {"runtime_autotune_time_s": 0.061}
    bad = post(make_batch(seq=1, events=[dict(runtime, times={"runtime_autotune_time_s": -1})]))
    assert bad.status_code == 400 and bad.json()["path"].startswith("events[0].times")


def test_gzip_body(post):
    response = post(make_batch(), gzip_=True)
    assert response.status_code == 200
    assert GradReport.objects.count() == 1


def test_resend_is_a_duplicate_and_stores_nothing_twice(post):
    body = make_batch()
    assert post(body).json()["duplicate"] is False
    before = stored_counts()
    again = post(body)
    assert again.status_code == 200
    assert again.json() == {"accepted": 0, "duplicate": True, "want_blobs": [], "detail": []}
    assert stored_counts() == before


def test_same_session_seq_with_other_content_is_409(post):
    post(make_batch())
    before = stored_counts()
    response = post(make_batch(events=[{"t": "grad", "step": 0, "fps": [9]}]))
    assert response.status_code == 409
    assert response.json()["path"] == "seq"
    assert stored_counts() == before


@pytest.mark.parametrize(
    "mutate, path",
    [
        (lambda b: b["events"][0].update(step="three"), "events[0].step"),
        (lambda b: b["events"][0].update(step=-1), "events[0].step"),
        (lambda b: b["events"][0].update(fps=[1 << 64]), "events[0]"),
        (lambda b: b["events"].append({"t": "no_such_event"}), "events[1].t"),
        (lambda b: b.update(rank=3), "rank"),
        (lambda b: b.update(rank=-1), "rank"),
        (lambda b: b.update(v=2), "v"),
        (lambda b: b["run"].pop("key"), "run.key"),
        (lambda b: b["run"].update(key="bad key/with spaces"), "run.key"),
        (lambda b: b.update(seq="0"), "seq"),
    ],
)
def test_invalid_batch_is_400_with_the_failing_path(post, mutate, path):
    body = make_batch(events=[{"t": "grad", "step": 0, "fps": [1]}])
    mutate(body)
    response = post(body)
    assert response.status_code == 400, response.content
    assert response.json()["path"] == path
    assert response.json()["error"]
    assert stored_counts() == (0, 0, 0, 0, 0)


def test_all_or_nothing_when_a_later_event_is_bad(post):
    events = [{"t": "grad", "step": 0, "fps": [1]}, {"t": "compile", "frame": "x", "index": "first"}]
    response = post(make_batch(events=events))
    assert response.status_code == 400
    assert response.json()["path"] == "events[1].index"
    assert stored_counts() == (0, 0, 0, 0, 0)


@pytest.mark.parametrize("raw", [b"{not json", b" ", b"[]", b"null", b'{"v": 1}'])
def test_malformed_json_is_400(post, raw):
    response = post(raw)
    assert response.status_code == 400
    assert "error" in response.json()


def test_truncated_gzip_is_400(post):
    raw = gzip.compress(json.dumps(make_batch()).encode())[:-10]
    response = post(raw, headers={"HTTP_CONTENT_ENCODING": "gzip"})
    assert response.status_code == 400
    assert "gzip" in response.json()["error"]
    assert stored_counts() == (0, 0, 0, 0, 0)


def test_world_size_change_within_run_is_400(post):
    post(make_batch(world_size=3))
    response = post(make_batch(world_size=4, seq=1))
    assert response.status_code == 400
    assert response.json()["path"] == "run.world_size"


def test_missing_or_bad_token_is_401(post):
    assert post(make_batch(), token_=None).status_code == 401
    response = post(make_batch(), token_="lst_not-a-real-token")
    assert response.status_code == 401
    assert "token" in response.json()["error"]
    assert stored_counts() == (0, 0, 0, 0, 0)


def test_a_key_another_project_took_first_is_a_separate_run(post):
    """Run keys are per project: project B posting `shared-key` first neither blocks project A's
    job of that key nor mixes their rows."""
    theirs = ProjectToken.issue(Project.objects.create(name="other"))
    assert post(make_batch(run="shared-key", session="sess-other-0"), token_=theirs).status_code == 200
    response = post(make_batch(run="shared-key"))
    assert response.status_code == 200 and response.json()["accepted"] > 0
    runs = Run.objects.filter(key="shared-key")
    assert runs.count() == 2 and len({run.project_id for run in runs}) == 2
    assert all(claims.count(run=run) == 1 for run in runs)


def test_too_large_is_413(post, settings):
    settings.LOCKSTEP_MAX_BODY = 2048
    big = make_batch(events=[{"t": "grad", "step": i, "fps": [i] * 16} for i in range(200)])
    assert post(big).status_code == 413
    bomb = json.dumps(make_batch()).encode() + b" " * 100_000  # inflates past the limit
    response = post(bomb, gzip_=True)
    assert response.status_code == 413
    assert stored_counts() == (0, 0, 0, 0, 0)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_wrong_content_type_is_415(post, content_type):
    response = post(make_batch(), content_type=content_type)
    assert response.status_code == 415
    assert stored_counts() == (0, 0, 0, 0, 0)


def test_unsupported_content_encoding_is_415(post):
    response = post(make_batch(), headers={"HTTP_CONTENT_ENCODING": "br"})
    assert response.status_code == 415


def test_get_is_405(client, token):
    assert client.get("/api/v1/ingest", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 405


def test_tokens_are_stored_hashed(token):
    stored = ProjectToken.objects.get()
    assert token not in (stored.digest, stored.prefix)
    assert stored.digest == ProjectToken.digest_of(token)
