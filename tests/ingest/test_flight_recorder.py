"""Flight Recorder (issue 15): torch's analysis of real dumps, the agent's bounding, the upload endpoint.

The dumps in tests/fixtures/flight_recorder/ are real: a 3-rank gloo job where rank 1 is late and
ranks 0 and 2 wait in the 4th all_reduce (tests/fixtures/make_flight_recorder_dumps.py made them)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest

from agents import flight_recorder, protocol
from dashboard.detection import flight

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"


def dumps() -> dict[int, dict]:
    return {r: json.loads((FIXTURES / f"rank_{r}.json").read_text())["dump"] for r in range(3)}


def test_torchs_analysis_names_the_rank_missing_from_the_collective_the_others_entered():
    result = flight.analyze(dumps(), world_size=3)
    assert result["error"] == ""
    m = result["mismatch"]
    assert m["missing_ranks"] == [1] and m["expected_ranks"] == [0, 1, 2]
    assert m["seq"] == 4 and m["op"] == "gloo:all_reduce" and m["pg"] == "0:default_pg"
    ranks = result["ranks"]
    assert ranks["0"]["entered"]["seq"] == 4 and ranks["2"]["entered"]["seq"] == 4
    assert ranks["1"]["entered"]["seq"] == 3
    assert ranks["0"]["completed"]["seq"] == 3 and ranks["1"]["completed"]["seq"] == 3
    assert ranks["0"]["entered"]["where"].endswith("make_flight_recorder_dumps.py:50 main")
    assert any("renamed '0'" in n for n in result["notes"])  # gloo's nameless config, repaired
    text = flight.headline(result)
    assert text.startswith("Flight Recorder: ranks 0, 2 entered gloo:all_reduce #4 of process group 0:default_pg")
    assert "rank 1 never did (rank 1's last is #3 gloo:all_reduce)" in text


def test_with_a_rank_that_did_not_answer_torch_still_analyses_the_others():
    d = dumps()
    del d[1]
    result = flight.analyze(d, world_size=3)
    assert result["error"] == "" and "1" not in result["ranks"]
    assert result["collectives"] >= 1


def test_hostile_ranks_text_is_never_evaluated_and_missing_keys_are_tolerated():
    d = dumps()
    for dump in d.values():
        dump["pg_config"] = {"": {"ranks": '\'__import__("os").system("touch /tmp/pwned-lockstep")\''}}
        for e in dump["entries"]:
            e.pop("frames", None)
        dump.pop("pg_status", None)
    result = flight.analyze(d, world_size=3)  # the config is dropped; default_pg is rebuilt from world_size
    assert not Path("/tmp/pwned-lockstep").exists()
    assert result["mismatch"]["missing_ranks"] == [1]
    assert result["ranks"]["0"]["completed"] is None  # no pg_status and gloo never marks an entry completed


def test_no_entries_says_the_recorder_was_off():
    result = flight.analyze({0: {"entries": []}, 1: {"error": "RuntimeError: no process group"}})
    assert "Flight Recorder off" in result["error"] and result["mismatch"] is None
    assert result["ranks"]["1"]["error"].startswith("RuntimeError")


def test_the_agent_bounds_a_dump_and_fills_keys_an_older_torch_lacks():
    raw = {
        "version": "2.4",
        "entries": [
            {
                "record_id": i,
                "collective_seq_id": i,
                "process_group": ("0", "default_pg"),
                "profiling_name": "nccl:all_reduce",
                "frames": [{"name": f"f{k}", "filename": "x.py", "line": k} for k in range(100)],
                "input_sizes": [[2, 3]],
                "time_discovered_started_ns": None,
            }
            for i in range(protocol.MAX_FR_ENTRIES + 50)
        ]
        + [{"no": "record id"}],
    }
    dump = flight_recorder.bounded(raw)
    assert len(dump.entries) == protocol.MAX_FR_ENTRIES and dump.entries[0].record_id == 50
    assert len(dump.entries[0].frames) == protocol.MAX_FR_FRAMES and dump.entries[0].frames[0].name == "f0"
    assert dump.pg_status == {} and dump.entries[0].state == ""
    record = protocol.FlightRecord(v=1, run="r", rank=0, session="s" * 8, ts=1.0, dump=dump)
    assert protocol.decode_flight_record(msgspec.json.encode(record)) == record


def test_without_a_process_group_the_agent_sends_why():
    body = json.loads(gzip.decompress(flight_recorder.body("r", 0, "session-1")))
    assert body["dump"]["error"].startswith("RuntimeError: no process group")


def test_old_agents_ignore_the_new_reply_field():
    class OldReply(msgspec.Struct):
        accepted: int
        duplicate: bool = False
        want_blobs: list[str] = []
        detail: list[int] = []

    reply = msgspec.json.encode(protocol.IngestReply(accepted=3, flight_recorder=True))
    assert msgspec.json.decode(reply, type=OldReply) == OldReply(accepted=3)


def test_the_buffer_default_is_set_only_when_unset(monkeypatch):
    from agents import config

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    assert config.resolve().fr_buffer_default == 2000
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")
    assert config.resolve().fr_buffer_default == 0
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE")
    monkeypatch.setenv("LOCKSTEP_FLIGHT_RECORDER", "0")
    assert not config.resolve().flight_recorder and config.resolve().fr_buffer_default == 0
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    assert flight_recorder.enable_default(100)
    import os

    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "100"
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")


@pytest.mark.django_db
def test_a_request_rides_the_next_reply_the_upload_answers_it_and_the_alert_and_page_show_it(
    client, post, token, project
):
    from django.contrib.auth.models import User

    from dashboard.detection.models import Alert
    from dashboard.evidence.models import FlightRecord
    from dashboard.ledger import flight as ledger_flight
    from dashboard.ledger.models import FlightRecorderRequest
    from dashboard.tenancy.models import Run
    from tests.conftest import make_batch

    for rank in range(3):
        assert "flight_recorder" not in post(make_batch(run="fr-run", rank=rank)).json()
    run = Run.objects.get(key="fr-run")
    alert = Alert.objects.create(
        run=run,
        kind="hang_forecast",
        subject="hang",
        severity="critical",
        ranks=[1],
        message="<b>hang</b>",
        details={"waiting": [0, 2]},
    )
    assert flight.ask(alert, {0, 1, 2}) and not flight.ask(alert, {0, 1, 2})  # once per revision
    reply = post(make_batch(run="fr-run", rank=1, seq=1)).json()
    assert reply["flight_recorder"] is True and reply["detail"] == []
    assert "flight_recorder" not in post(make_batch(run="fr-run", rank=1, seq=2)).json()  # handed out once
    for rank in (0, 2):
        assert post(make_batch(run="fr-run", rank=rank, seq=1)).json()["flight_recorder"] is True
    for rank in range(3):
        answer = _upload(client, token, rank)
        assert answer.status_code == 200, answer.content
        assert answer.json() == {"stored": True, "answered": 1}  # the one request of this rank
    assert _upload(client, token, 0).status_code == 409  # answered already: one dump per request
    bad = client.generic(
        "POST",
        "/api/v1/flight-recorder",
        b'{"v":1}',
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert bad.status_code == 400 and bad.json()["path"]
    assert FlightRecord.objects.filter(run=run).count() == 3
    assert all(r.answered_at for r in FlightRecorderRequest.objects.filter(alert_id=alert.id))
    record = FlightRecord.objects.get(run=run, rank=0)
    record.dump["entries"][-1]["frames"][2]["name"] = "<script>x</script>"  # user text from the job: shown escaped
    record.save()
    assert flight.summarize(alert.id, ledger_flight.latest_round(alert.id))
    alert.refresh_from_db()
    fr = alert.details["flight_recorder"]
    assert fr["answered"] == [0, 1, 2] and fr["mismatch"]["missing_ranks"] == [1] and alert.details["waiting"] == [0, 2]
    assert not flight.summarize(alert.id, ledger_flight.latest_round(alert.id))  # idempotent: no second revision
    user = User.objects.create_user("fr-viewer", password="pw")
    project.members.add(user)
    client.force_login(user)
    page = client.get("/runs/fr-run/").content.decode()
    assert "Flight Recorder" in page and "rank 1 never did" in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page and "<script>x</script>" not in page


def _upload(client, token: str, rank: int, run: str = "fr-run"):
    """Rank `rank`'s fixture dump, as the agent sends it, for `run`."""
    body = (FIXTURES / f"rank_{rank}.json").read_bytes().replace(b'"fr-fixture"', json.dumps(run).encode())
    return client.generic(
        "POST",
        "/api/v1/flight-recorder",
        gzip.compress(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        HTTP_CONTENT_ENCODING="gzip",
    )


def _hang(run_key: str):
    from dashboard.detection.models import Alert
    from dashboard.tenancy.models import Run

    return Alert.objects.create(
        run=Run.objects.get(key=run_key), kind="hang_forecast", subject="hang", severity="critical", ranks=[1]
    )


@pytest.mark.django_db
def test_a_dump_nobody_asked_for_is_a_409_and_nothing_is_stored(client, post, token):
    """Was: 20 unasked 1.9 MiB dumps, 42 MiB stored in 4.5 s. A dump answers a request handed out to
    its rank in an ingest reply, once; before that (asked but not handed out yet) and after it, a 409."""
    from dashboard.evidence.models import FlightRecord
    from dashboard.ledger.models import FlightRecorderRequest
    from tests.conftest import make_batch

    for rank in range(3):
        post(make_batch(run="fr-unasked", rank=rank))
    for _ in range(20):
        refused = _upload(client, token, 0, "fr-unasked")
        assert refused.status_code == 409 and refused.json()["path"] == "rank"
        assert "was asked for" in refused.json()["error"]
    alert = _hang("fr-unasked")
    assert flight.ask(alert, {0})
    assert _upload(client, token, 0, "fr-unasked").status_code == 409  # asked, not handed out yet
    assert not FlightRecord.objects.exists()
    assert post(make_batch(run="fr-unasked", rank=0, seq=1)).json()["flight_recorder"] is True
    assert _upload(client, token, 0, "fr-unasked").status_code == 200
    assert _upload(client, token, 0, "fr-unasked").status_code == 409  # one dump per request
    assert FlightRecord.objects.count() == 1 and FlightRecorderRequest.objects.get().answered_at


@pytest.mark.django_db
def test_dumps_count_against_the_projects_byte_quota_with_graph_texts(client, post, token, project, settings):
    """Was: no byte quota on dumps. A dump's bytes count with the graph texts' against
    LOCKSTEP_BLOB_QUOTA (507 past it) and LOCKSTEP_BLOB_QUOTA_DAY (429), nothing of it stored; and a
    project the dumps filled is asked for no graph text."""
    from dashboard.evidence.models import FlightRecord
    from dashboard.ledger.models import FlightRecorderRequest
    from ingest import blobs, quotas
    from tests.conftest import make_batch

    size = len((FIXTURES / "rank_0.json").read_bytes().replace(b'"fr-fixture"', b'"fr-quota"'))
    settings.LOCKSTEP_BLOB_QUOTA = size + 1000  # the first dump fits, a second does not
    for rank in range(3):
        post(make_batch(run="fr-quota", rank=rank))
    alert = _hang("fr-quota")
    assert flight.ask(alert, {0, 2})
    for rank in (0, 2):
        assert post(make_batch(run="fr-quota", rank=rank, seq=1)).json()["flight_recorder"] is True
    assert _upload(client, token, 0, "fr-quota").status_code == 200
    full = _upload(client, token, 2, "fr-quota")
    assert full.status_code == 507 and "LOCKSTEP_BLOB_QUOTA" in full.json()["error"]
    assert quotas.stored_bytes(project.id) == (size, size)
    assert list(FlightRecord.objects.values_list("rank", flat=True)) == [0]  # nothing of the refused one stored
    assert not FlightRecorderRequest.objects.get(rank=2).answered_at  # nor its request answered
    settings.LOCKSTEP_BLOB_QUOTA = 10 * size
    settings.LOCKSTEP_BLOB_QUOTA_DAY = size + 1000
    day = _upload(client, token, 2, "fr-quota")
    assert day.status_code == 429 and "LOCKSTEP_BLOB_QUOTA_DAY" in day.json()["error"]
    assert FlightRecord.objects.count() == 1
    run_id = FlightRecord.objects.get().run_id
    settings.LOCKSTEP_BLOB_QUOTA_DAY = size  # the one dump kept reaches it
    assert blobs.wanted({(project.id, run_id): [protocol.blob_hash("graph")]}) == set()  # the dumps filled it
    settings.LOCKSTEP_BLOB_QUOTA_DAY = 10 * size
    assert blobs.wanted({(project.id, run_id): [protocol.blob_hash("graph")]}) == {protocol.blob_hash("graph")}
