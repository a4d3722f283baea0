"""The node relay on its own: what it accepts from an agent, and what it does when the server stalls."""

from __future__ import annotations

import gzip
import socket
import threading
import time

import msgspec
import pytest

from agents import protocol, relay


def test_a_gzip_body_becomes_its_exact_json_trimmed():
    body = b'{"v":1,"seq":3}'
    assert relay.read_batch(gzip.compress(body + b"\n"), "gzip") == body
    assert relay.read_batch(b"  " + body, "") == body


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v":1},{"v":1,"rank":0}',  # a second batch riding along would shift every other agent's answer
        b'{"v":1}]}',
        b'[{"v":1}]',
        b'"text"',
        b"{not json",
    ],
)
def test_anything_but_one_json_object_is_refused(raw):
    with pytest.raises(ValueError):  # msgspec.DecodeError is one
        relay.read_batch(raw, "")


def test_truncated_and_unknown_encodings_are_refused():
    with pytest.raises(ValueError):
        relay.read_batch(gzip.compress(b'{"v":1}')[:-6], "gzip")
    with pytest.raises(ValueError):
        relay.read_batch(b'{"v":1}', "br")


def test_a_bulk_body_round_trips_the_batches_byte_for_byte():
    batches = [b'{"v":1,"rank":0}', b'{"v":1,"rank":1,"events":[]}']
    assert protocol.decode_bulk(protocol.bulk_body(batches)) == batches


def test_an_agent_told_to_retry_is_not_sent_again_by_the_relay():
    """A server too slow to answer: the waiting agent hears 504 + Retry-After before its own timeout
    and will resend, so the relay drops its copy instead of sending it behind the stuck request."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def hang() -> None:  # accepts, reads, never answers
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=hang, daemon=True).start()
    upstream = f"http://127.0.0.1:{listener.getsockname()[1]}"
    r = relay.Relay(upstream, window=0.01, upstream_timeout=1.5, answer_timeout=0.5)
    try:
        answers = []
        first = threading.Thread(target=lambda: answers.append(r.submit("Bearer t", b'{"v":1,"seq":0}')))
        first.start()
        time.sleep(0.2)  # the first batch is out and stuck
        second = r.submit("Bearer t", b'{"v":1,"seq":1}')
        first.join()
        assert second.status == 504 and second.headers["Retry-After"] == relay.RETRY_AFTER
        assert answers[0].status == 504
        time.sleep(2.0)  # the stuck request timed out; the second batch was abandoned, not sent
        assert len(accepted) == 1
    finally:
        r.close()
        listener.close()
        for conn in accepted:
            conn.close()


def test_json_nested_too_deeply_is_refused_cleanly():
    with pytest.raises(ValueError):
        relay.read_batch(b'{"v":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "")


@pytest.mark.parametrize("length", ["-1", "12x", "99999999999"])
def test_a_bad_or_oversized_content_length_is_answered_at_once(length):
    """Issue 17, item 6: "-1" used to make the relay read until the agent hung up."""
    r = relay.Relay("http://127.0.0.1:9", window=0.01)
    server = relay.make_server("127.0.0.1", 0, r)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(server.server_address, timeout=5) as conn:
            conn.sendall(f"POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{".encode())
            status = conn.recv(4096).split(b"\r\n", 1)[0]
        assert status.split()[1] in (b"400", b"413"), status
    finally:
        server.shutdown()
        server.server_close()
        r.close()


def _grads_batch(rank: int, fps: int = 7) -> protocol.Batch:
    return protocol.Batch(
        v=1,
        run=protocol.RunInfo(key="tree", world_size=64),
        rank=rank,
        session=f"tree-session-{rank}",
        seq=1,
        events=[protocol.Grads.pack(0, [[fps, 3]], ts=1e9 + rank)],
    )


def test_a_rack_relay_reads_both_bulk_forms_as_the_batches_their_agents_sent():
    from agents import agreement

    raws = [protocol.encode(_grads_batch(r)) for r in range(4)]
    old = protocol.bulk_body(raws)
    packed, batches = relay.read_bulk(gzip.compress(old), "gzip")
    assert not packed and [raw for _, raw in batches] == raws and all(b is not None for b, _ in batches)
    packed, batches = relay.read_bulk(agreement.pack([protocol.decode_batch(r) for r in raws]), "")
    assert packed and [raw for _, raw in batches] == raws
    with pytest.raises(ValueError):
        relay.read_bulk(b'{"v":2,"batches":[{"run":3,"rank":0,"session":"abcdefgh","seq":0}]}', "")


def test_a_downstream_bulk_is_answered_batch_by_batch():
    from agents.transport import Reply

    ok = Reply(200, protocol.encode(protocol.IngestReply(accepted=1)), {})
    bad = Reply(400, b'{"error":"rank 9 is outside world_size 8","path":"rank"}', {})
    busy = Reply(503, b'{"error":"overloaded"}', {"Retry-After": "2"})
    answer = relay.bulk_answer([ok, bad, busy], packed=True)
    reply = msgspec.json.decode(answer.body, type=protocol.BulkReply)
    assert answer.status == 200 and [r.accepted for r in reply.results] == [1, 0, 0]
    assert [(r.index, r.status, bytes(r.answer), r.retry_after) for r in reply.refused] == [
        (1, 400, bad.body, ""),
        (2, 503, busy.body, "2"),
    ]
    assert relay.bulk_answer([ok, busy, bad], packed=False) is bad  # an older relay sends each alone
    assert relay.bulk_answer([ok, busy], packed=False) is busy  # and hands a 503 to all its agents
    assert b"refused" not in relay.bulk_answer([ok, ok], packed=False).body


def test_a_server_that_predates_packed_bodies_gets_version_1():
    from agents.transport import Reply

    old_server = Reply(400, b'{"error":"Expected `int` <= 1","path":"v"}', {})
    assert relay._unpacked_upstream(old_server)
    assert not relay._unpacked_upstream(Reply(400, b'{"error":"x","path":"batches[0].rank"}', {}))
