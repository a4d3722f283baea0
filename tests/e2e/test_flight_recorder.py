"""Flight Recorder on a real 3-rank gloo hang (demo/hang_job.py, rank 1's DataLoader never delivers):
hang_forecast asks the ranks for dumps in their ingest replies, the agents send them while ranks 0
and 2 are blocked in all_reduce, and torch's analysis in the Celery worker names rank 1 as the one
missing from the collective the others entered; the summary reaches the websocket in the alert."""

from __future__ import annotations

import time

import pytest

from dashboard.evidence.models import FlightRecord
from tests.e2e.jobs import alert_feed, member_session, project_with_token, running, torchrun, wait_for_run
from tests.stack import unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

TIMEOUT_S = 20


def test_a_forecast_brings_the_dumps_and_torchs_analysis_names_the_missing_rank(stack, tmp_path):
    project, token = project_with_token("fr-hang")
    feed = alert_feed(stack, member_session(project, "fr-hang"))
    run_key = unique("fr-hang")
    job = torchrun(
        stack, token, run_key, "demo/hang_job.py", ["--stall", "data", "--timeout", str(TIMEOUT_S)], tmp_path / "spool"
    )
    with running(job):
        wait_for_run(stack, token, run_key, job)
        feed.wait_for({"hang_forecast"}, timeout=120, run=run_key)
        deadline = time.monotonic() + TIMEOUT_S
        fr = None
        while time.monotonic() < deadline and not fr:
            fr = feed.latest(run_key)["hang_forecast"]["details"].get("flight_recorder")
            time.sleep(0.2)
        job.communicate(timeout=120)
    assert fr, feed.latest(run_key)["hang_forecast"]
    assert fr["answered"] == [0, 1, 2] and fr["error"] == "", fr
    m = fr["mismatch"]
    assert m["missing_ranks"] == [1] and m["op"] == "gloo:all_reduce" and m["expected_ranks"] == [0, 1, 2], fr
    ranks = fr["ranks"]
    assert ranks["0"]["entered"]["seq"] == ranks["2"]["entered"]["seq"] == m["seq"]
    assert ranks["1"]["entered"]["seq"] < m["seq"] and ranks["1"]["completed"]["seq"] == ranks["1"]["entered"]["seq"]
    assert (
        ranks["0"]["entered"]["where"].startswith("demo/hang_job.py:")
        or "hang_job.py:" in ranks["0"]["entered"]["where"]
    )
    assert "rank 1 never did" in fr["message"] and "ranks 0, 2 entered gloo:all_reduce" in fr["message"]
    assert set(FlightRecord.objects.filter(run__key=run_key).values_list("rank", flat=True)) == {0, 1, 2}
