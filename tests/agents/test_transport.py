"""Sender against a local stub server: retries, ordering, Retry-After, spool, upload, offline."""

import gzip
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from agents import protocol
from agents.config import resolve
from agents.graph_texts import GraphTexts
from agents.spool import list_batches
from agents.transport import StepClock, Transport, kept_interval
from tests.canned import Canned

from .conftest import REPO, events_of, read_spool


@pytest.fixture(autouse=True)
def fast_flush(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_FLUSH_INTERVAL", "0.05")
    monkeypatch.setenv("LOCKSTEP_HEARTBEAT", "1000")


def _transport(tmp_path, url, **kw):
    cfg = resolve(url=url, token="tok", run="run-1", rank=2, world_size=4, spool_dir=str(tmp_path / "spool"), **kw)
    return Transport(cfg)


def _steps(batches):
    return [e.step for e in events_of(batches) if isinstance(e, protocol.Step)]


def _send_steps(t, steps, pause=0.0):
    for s in steps:
        t.put(protocol.Step(step=s))
        if pause:
            time.sleep(pause)


def test_500_then_200_delivers_once_in_seq_order(tmp_path, stub):
    stub.script = [(500, {})]
    t = _transport(tmp_path, stub.url)
    _send_steps(t, range(20), pause=0.02)
    t.close(timeout=10)
    seqs = [b.seq for b in stub.accepted]
    assert seqs == list(range(len(seqs))) and len(seqs) >= 2
    assert _steps(stub.accepted) == list(range(20))
    assert stub.requests[0][1].seq == 0 and stub.accepted[0].seq == 0  # the failed batch was retried
    assert all(b.session == t.session and b.rank == 2 and b.run.key == "run-1" for b in stub.accepted)
    assert not list_batches(str(tmp_path / "spool"))


def test_retry_after_is_honoured(tmp_path, stub):
    stub.script = [(429, {"Retry-After": "1"})]
    t = _transport(tmp_path, stub.url)
    _send_steps(t, [0])
    t.close(timeout=10)
    (t0, first), (t1, second) = stub.requests[:2]
    assert first.seq == second.seq == 0
    assert t1 - t0 >= 0.95
    assert _steps(stub.accepted) == [0]


def test_a_second_close_never_shortens_the_first(tmp_path, stub):
    """A SIGTERM handler closing again during an exit's close (torchrun stops the peers of a failed
    rank) must not give up on the network before the close already under way would have."""
    stub.script = [(503, {"Retry-After": "1"})]
    t = _transport(tmp_path, stub.url)
    _send_steps(t, [0])
    first = threading.Thread(target=t.close, kwargs={"timeout": 8})
    first.start()
    time.sleep(0.3)  # the first answer (503, retry in 1 s) is in
    t.close(timeout=0.2)
    first.join()
    assert _steps(stub.accepted) == [0]
    assert not list_batches(str(tmp_path / "spool"))


def test_a_batch_the_server_proves_malformed_is_quarantined_with_its_answer(tmp_path, stub):
    """Only a 400 naming a field (or 409/415/422) lets a batch leave the spool, and it is kept."""
    stub.script = [(400, {}, {"error": "step must be >= 0", "path": "events[0].step"})]
    t = _transport(tmp_path, stub.url)
    _send_steps(t, [0])
    _wait(lambda: t.stats["quarantined_batches"] == 1)
    _send_steps(t, [1])
    t.close(timeout=10)
    dropped = [e for e in events_of(stub.accepted) if isinstance(e, protocol.Dropped)]
    assert dropped and dropped[0].count == 1 and dropped[0].reason == "quarantined"
    assert _steps(stub.accepted) == [1] and len(stub.requests) == 2  # never resent
    quarantine = tmp_path / "spool" / "quarantine"
    [answer] = quarantine.glob("*.answer")
    assert "events[0].step" in answer.read_text() and answer.read_text().startswith("HTTP 400")
    [kept] = [p for p in quarantine.iterdir() if p.suffix != ".answer"]
    assert _steps([protocol.decode_batch(kept.read_bytes())]) == [0]


@pytest.mark.parametrize("status", [401, 403, 404, 408, 400])
def test_refusals_that_prove_nothing_keep_the_batch_and_retry(tmp_path, stub, status):
    """A rotated token, a proxy's 404, a 400 without a field: the batch stays and goes out later."""
    stub.script = [(status, {"Retry-After": "0"}, {"error": "not here"})] * 3
    t = _transport(tmp_path, stub.url)
    _send_steps(t, range(6), pause=0.02)
    t.close(timeout=10)
    assert _steps(stub.accepted) == list(range(6))
    assert t.stats["dropped_events"] == 0 and not (tmp_path / "spool" / "quarantine").exists()
    assert not read_spool(str(tmp_path / "spool"))


@pytest.fixture
def elsewhere():
    """Another server, on another port, that answers anything as ingest would: where a redirect points."""
    server = Canned(200, {"Content-Type": "application/json"}, json.dumps({"accepted": 1}).encode())
    yield server
    server.close()


@pytest.mark.parametrize("status", [307, 308, 302])
def test_a_redirect_keeps_the_batch_and_takes_the_token_nowhere(tmp_path, stub, elsewhere, status):
    """A redirect is not the server taking the batch, and it is never followed (was: a 307 or 308
    dropped the batch from the spool; a 302 was followed as a GET, with the token, to the other server)."""
    stub.script = [(status, {"Location": elsewhere.url + "/api/v1/ingest"})] * 2
    t = _transport(tmp_path, stub.url)
    _send_steps(t, range(6), pause=0.02)
    t.close(timeout=10)
    assert [b.seq for _, b in stub.requests[:3]] == [0, 0, 0]  # redirected twice, then taken
    assert _steps(stub.accepted) == list(range(6)) and t.stats["dropped_events"] == 0
    assert elsewhere.requests == []  # neither the batch nor the Authorization header went there


@pytest.mark.parametrize(
    "content_type, body",
    [("text/html", b"<html><form action='/sso'>Sign in</form></html>"), ("application/json", b'{"ok": true}')],
)
def test_a_200_that_is_not_an_ingest_reply_keeps_the_batch(tmp_path, content_type, body):
    """A login portal or a proxy answering 200 with a page of its own has not stored anything (was: the
    batch counted as delivered and left the spool)."""
    portal = Canned(200, {"Content-Type": content_type}, body)
    try:
        t = _transport(tmp_path, portal.url)
        _send_steps(t, range(4))
        t.close(timeout=1)
    finally:
        portal.close()
    assert portal.requests and t.stats["sent_batches"] == 0 and t.stats["dropped_events"] == 0
    assert _steps(read_spool(str(tmp_path / "spool"))[2]) == list(range(4))


def test_a_413_splits_the_batch_until_it_fits(tmp_path, stub):
    """A proxy's body limit mid-job: the batch goes out in halves (derived sessions, so a resend
    of a half is still a duplicate), nothing is lost."""
    stub.max_events = 3
    t = _transport(tmp_path, stub.url)
    _send_steps(t, range(20))
    t.close(timeout=10)
    assert sorted(_steps(stub.accepted)) == list(range(20))
    assert any(len(b.events) > 3 for _, b in stub.requests)  # it was refused whole first
    assert all(len(b.events) <= 3 for b in stub.accepted) and not list_batches(str(tmp_path / "spool"))


def _wait(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_gzip_for_large_bodies(tmp_path, stub):
    t = _transport(tmp_path, stub.url)
    for s in range(300):
        t.put(protocol.Grad(step=s, fps=[(1 << 64) - 1] * 16))
    t.close(timeout=10)
    grads = [e for e in events_of(stub.accepted) if isinstance(e, protocol.Grad)]
    assert [g.step for g in grads] == list(range(300)) and grads[0].fps[0] == (1 << 64) - 1


def test_server_down_spools_then_upload_delivers(tmp_path, stub):
    t = _transport(tmp_path, "http://127.0.0.1:9")  # nothing listens on the discard port
    _send_steps(t, range(10), pause=0.02)
    t.close(timeout=1)
    spooled = read_spool(str(tmp_path / "spool"))[2]
    assert _steps(spooled) == list(range(10))
    cmd = [sys.executable, "-m", "agents", "upload", str(tmp_path / "spool"), "--url", stub.url, "--token", "tok"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "uploaded" in out.stdout and "0 failed" in out.stdout
    assert [b.seq for b in stub.accepted] == [b.seq for b in spooled]
    assert _steps(stub.accepted) == list(range(10))
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and len(stub.accepted) == len(spooled)  # idempotent


def test_upload_keeps_what_the_server_refused_and_says_why(tmp_path, stub):
    t = _transport(tmp_path, None, offline=True)
    _send_steps(t, [0])
    t.close(timeout=2)
    stub.script = [(401, {"Retry-After": "0"}, {"error": "missing or invalid bearer token"})] * 5
    cmd = [sys.executable, "-m", "agents", "upload", str(tmp_path / "spool"), "--url", stub.url]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "1 failed (1 kept in the spool, 0 quarantined)" in out.stdout
    assert "1 batches stay in the spool" in out.stderr and "HTTP 401" in out.stderr
    assert list_batches(str(tmp_path / "spool"))  # kept for a later attempt
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and _steps(stub.accepted) == [0]


def test_upload_quarantines_a_malformed_batch_and_splits_an_oversized_one(tmp_path, stub):
    t = _transport(tmp_path, None, offline=True)
    _send_steps(t, range(8))
    t.close(timeout=2)
    stub.max_events = 2
    cmd = [sys.executable, "-m", "agents", "upload", str(tmp_path / "spool"), "--url", stub.url]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(_steps(stub.accepted)) == list(range(8)) and not list_batches(str(tmp_path / "spool"))
    t = _transport(tmp_path, None, offline=True)
    _send_steps(t, [9])
    t.close(timeout=2)
    stub.script = [(409, {}, {"error": "other content", "path": "seq"})]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "quarantined: HTTP 409" in out.stderr
    assert len(list((tmp_path / "spool" / "quarantine").iterdir())) == 2


def test_offline_writes_only_the_spool(tmp_path, stub):
    t = _transport(tmp_path, stub.url, offline=True)
    _send_steps(t, range(5))
    t.close(timeout=5)
    assert stub.requests == []
    assert _steps(read_spool(str(tmp_path / "spool"))[2]) == list(range(5))


def test_unwritable_spool_does_not_raise(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = resolve(offline=True, run="r", spool_dir=str(blocker / "spool"))
    t = Transport(cfg)
    _send_steps(t, range(3))
    t.close(timeout=2)
    assert t.stats["dropped_events"] >= 3


def test_spool_cap_drops_and_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_SPOOL_MAX_BYTES", "300")
    t = _transport(tmp_path, None, offline=True)
    for s in range(20):
        t.put(protocol.Grad(step=s, fps=[1] * 16))
        time.sleep(0.01)
    t.close(timeout=2)
    total = sum(os.path.getsize(p) for p in list_batches(str(tmp_path / "spool")))
    assert total <= 300 and t.stats["dropped_events"] > 0


def test_detail_request_answered_from_ring(tmp_path, stub):
    stub.detail = [3]
    cfg = resolve(url=stub.url, run="r", spool_dir=str(tmp_path / "spool"))
    t = Transport(cfg, on_detail=lambda steps: [protocol.Detail(step=s, params={"w": 5}) for s in steps])
    _send_steps(t, [3])
    time.sleep(0.5)
    stub.detail = []
    t.close(timeout=5)
    details = [e for e in events_of(stub.accepted) if isinstance(e, protocol.Detail)]
    assert details and details[0].step == 3 and details[0].params == {"w": 5}


def test_a_weights_request_in_the_reply_reaches_the_tracker(tmp_path, stub):
    stub.extra = {"weights_at": [7, 9]}
    asked: list[list[int]] = []
    t = Transport(resolve(url=stub.url, run="r", spool_dir=str(tmp_path / "spool")), on_weights=asked.append)
    _send_steps(t, [3])
    t.close(timeout=5)
    assert asked and asked[0] == [7, 9]


def test_unencodable_event_is_dropped_alone(tmp_path, stub):
    t = _transport(tmp_path, stub.url)
    t.put(protocol.RankStart(versions={"torch": object()}))
    _send_steps(t, [1])
    t.close(timeout=5)
    events = events_of(stub.accepted)
    assert _steps(stub.accepted) == [1]
    assert any(isinstance(e, protocol.Dropped) and e.reason == "unencodable" for e in events)


def test_an_event_the_protocol_does_not_list_is_dropped_alone(tmp_path, stub):
    t = _transport(tmp_path, stub.url)
    _send_steps(t, [1])
    t.put(protocol.RunInfo(key="not-an-event", world_size=1))  # a struct, but no wire event: refused by the batch
    _send_steps(t, [2])
    t.close(timeout=5)
    assert _steps(stub.accepted) == [1, 2]
    assert any(isinstance(e, protocol.Dropped) and e.reason == "unencodable" for e in events_of(stub.accepted))


def test_server_killed_and_restarted_mid_run_loses_and_duplicates_nothing(tmp_path, monkeypatch):
    from agents import transport

    from .conftest import Stub

    monkeypatch.setattr(transport, "BACKOFF_MAX", 0.5)
    first = Stub()
    port = first.server.server_address[1]
    t = _transport(tmp_path, first.url)
    _send_steps(t, range(0, 30), pause=0.01)
    time.sleep(0.3)
    first.close()  # killed mid-run: the next batches fail and are spooled
    _send_steps(t, range(30, 60), pause=0.01)
    time.sleep(0.5)
    second = Stub(port)  # restarted on the same address
    try:
        _send_steps(t, range(60, 90), pause=0.01)
        start = time.monotonic()
        t.close(timeout=15)
        assert time.monotonic() - start < 10
        batches = {}
        for b in first.accepted + second.accepted:
            # what the server stores: one copy per (session, seq); a repeat must be the same batch
            assert batches.setdefault((b.session, b.seq), b) == b
        steps = [e.step for _, b in sorted(batches.items()) for e in b.events if isinstance(e, protocol.Step)]
        assert steps == list(range(90))  # exact: nothing lost, nothing twice, in order
        assert sorted(seq for _, seq in batches) == list(range(len(batches)))
        assert second.accepted and not list_batches(str(tmp_path / "spool"))
    finally:
        second.close()


def test_ranks_flush_together_on_the_wall_clock(tmp_path, stub, monkeypatch):
    """Two ranks started 0.13 s apart still flush at the same instants (multiples of the interval),
    so a node relay's window catches both: their batches pair up instead of staying 0.13 s apart."""
    monkeypatch.setenv("LOCKSTEP_FLUSH_INTERVAL", "0.4")
    first = _transport(tmp_path / "a", stub.url)
    time.sleep(0.13)
    second = _transport(tmp_path / "b", stub.url)
    for step in range(30):
        first.put(protocol.Step(step=step))
        second.put(protocol.Step(step=step))
        time.sleep(0.05)
    first.close(timeout=10)
    second.close(timeout=10)
    arrivals = {
        t.session: [when for when, batch in stub.requests if batch.session == t.session] for t in (first, second)
    }
    ours, theirs = arrivals[first.session], arrivals[second.session]
    assert len(ours) >= 3 and len(theirs) >= 3
    paired = [when for when in ours if min(abs(when - other) for other in theirs) < 0.06]
    assert len(paired) >= len(ours) - 1, (ours, theirs)  # the last batch of each goes out at close


def test_graph_texts_the_server_asks_for_are_uploaded(tmp_path, stub):
    texts = GraphTexts()
    held, other = "graph():\n  relu(x)", "graph():\n  tanh(x)"
    texts.keep(protocol.blob_hash(held), held)
    texts.keep(protocol.blob_hash(other), other)
    texts.keep("f" * 32, "x" * (protocol.MAX_BLOB_BYTES + 1))  # more than the server takes: never kept
    stub.want_blobs = [protocol.blob_hash(held), "0" * 32, "f" * 32]  # "0"*32: a text this rank never had
    cfg = resolve(url=stub.url, token="tok", run="run-1", rank=2, world_size=4, spool_dir=str(tmp_path / "spool"))
    t = Transport(cfg, on_blobs=texts.bodies)
    _send_steps(t, [0])
    t.close(timeout=10)
    assert stub.accepted and stub.blobs
    assert {(b.hash, b.text) for b in stub.blobs} == {(protocol.blob_hash(held), held)}


def test_graph_texts_keep_the_newest_within_their_budget():
    texts = GraphTexts(budget=10)
    digests = [protocol.blob_hash(text) for text in ("aaaa", "bbbb", "cccc")]
    for digest, text in zip(digests, ("aaaa", "bbbb", "cccc")):
        texts.keep(digest, text)
    bodies = texts.bodies(digests)
    sent = [b.hash for body in bodies for b in protocol.decode_blobs(gzip.decompress(body)).blobs]
    assert sent == digests[1:]  # the oldest went to make room


def test_the_spool_cap_is_the_folders_when_ranks_share_it(tmp_path):
    """Issue 17, item 8: every rank of a node spools into one folder by default; the cap holds for all of them."""
    from agents.spool import Spool

    folder = str(tmp_path / "shared")
    rank0, rank1 = Spool(folder, 1000), Spool(folder, 1000)
    assert rank0.write("r0000000-a-000000000000.json", b"x" * 100)
    assert rank1.write("r0000001-b-000000000000.json", b"x" * 100)
    assert rank0.write("r0000000-a-000000000001.json", b"x" * 500)
    assert rank1.write("r0000001-b-000000000001.json", b"x" * 500) is None  # 1200 bytes would exceed the cap
    rank0.remove(os.path.join(folder, "r0000000-a-000000000001.json"))
    assert rank1.write("r0000001-b-000000000001.json", b"x" * 500)
    assert sum(os.path.getsize(p) for p in list_batches(folder)) == 700


def test_rank_0_says_once_on_stderr_why_nothing_gets_through(tmp_path, stub, capsys):
    """A wrong token (401 every time): rank 0's process says what failed, where the batches wait and
    how to send them, once; another rank says nothing (every rank would only repeat it)."""
    stub.script = [(401, {"Retry-After": "0"}, {"error": "unknown token"})] * 1000
    for rank in (0, 2):
        cfg = resolve(
            url=stub.url, token="bad", run="run-1", rank=rank, world_size=4, spool_dir=str(tmp_path / f"s{rank}")
        )
        t = Transport(cfg)
        _send_steps(t, range(4), pause=0.05)
        t.close(timeout=1)
    err = capsys.readouterr().err
    spool = tmp_path / "s0"
    assert err.count("lockstep: ") == 1, err
    assert f"cannot deliver to {stub.url} (HTTP 401: " in err and "unknown token" in err
    assert f"batches wait in {spool} " in err and f"python -m agents upload {spool} " in err
    assert read_spool(str(spool))  # and they do wait there


def test_rank_0_says_once_on_stderr_that_the_server_refuses_its_run_and_what_to_set(tmp_path, stub, capsys):
    """A run wider than the server's LOCKSTEP_MAX_RANKS: every batch is refused for good (400 naming the
    field); rank 0 says so once, with the server's words (what its operator sets)."""
    error = (
        "world_size 16384 exceeds this server's LOCKSTEP_MAX_RANKS (4096): its operator sets LOCKSTEP_MAX_RANKS=16384"
    )
    stub.script = [(400, {}, {"error": error, "path": "run.world_size"})] * 1000
    cfg = resolve(url=stub.url, token="t", run="run-1", rank=0, world_size=16384, spool_dir=str(tmp_path / "s0"))
    t = Transport(cfg)
    _send_steps(t, range(4), pause=0.05)
    t.close(timeout=1)
    err = capsys.readouterr().err
    assert err.count("lockstep: ") == 1, err
    assert "the server refused a batch for good (HTTP 400: " in err and "LOCKSTEP_MAX_RANKS=16384" in err


def test_the_step_clock_reads_seconds_per_step_from_the_flushes():
    clock = StepClock()
    clock.observe(None, 0.0)
    assert clock.seconds(0.0) == 0.0  # no step counter: unknown
    for flush in range(5):  # flushes every 0.5 s, a step every 1 s
        clock.observe(flush // 2, flush * 0.5)
    assert clock.seconds(2.0) == 1.0
    assert clock.seconds(5.0) == 3.0  # no step for 3 s: at least that long
    clock.observe(0, 6.0)  # counted again from the start
    assert clock.seconds(6.0) == 0.0


@pytest.mark.parametrize(
    "asked,step_s,kept",
    [
        (None, 1.0, 0.5),
        (1.0, 1.0, 0.5),  # a 1 s ask to a job at 1 step/s spares no batch: each step's report is not held back
        (1.0, 0.85, 0.5),  # within the margin: a node's ranks stay on one side
        (2.0, 1.0, 2.0),  # a longer ask folds two steps into a batch: followed
        (1.0, 0.1, 1.0),  # fast steps: ten steps a batch instead of five
        (1.0, 0.0, 1.0),  # steps not known yet: the server's
        (0.25, 0.0, 0.5),  # never shorter than the agent's own
    ],
)
def test_an_asked_interval_is_kept_only_where_it_spares_batches(asked, step_s, kept):
    assert kept_interval(0.5, asked, step_s) == kept


def test_the_agent_follows_an_asked_interval_only_past_its_steps(tmp_path, stub, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_FLUSH_INTERVAL", "0.1")
    step = [0]
    cfg = resolve(url=stub.url, token="tok", run="run-1", rank=2, world_size=4, spool_dir=str(tmp_path / "spool"))
    t = Transport(cfg, step=lambda: step[0])
    stub.extra = {"flush_interval_s": 0.3}  # shorter than the steps: it would only hold them back
    for s in range(8):  # a step every 0.4 s
        step[0] = s
        t.put(protocol.Step(step=s))
        time.sleep(0.4)
    assert t.server_interval == 0.3 and t.flush_interval == 0.1
    stub.extra = {"flush_interval_s": 1.6}
    sent = t.stats["sent_batches"]
    step[0] += 1
    t.put(protocol.Step(step=step[0]))
    deadline = time.monotonic() + 5
    while t.stats["sent_batches"] == sent and time.monotonic() < deadline:
        time.sleep(0.02)
    assert t.server_interval == 1.6 and t.flush_interval == 1.6
    t.close(timeout=10)
    assert _steps(stub.accepted) == list(range(9))
