"""A node-local relay: the ranks of one node post their batches here, it forwards them in bulk.

    python -m agents relay --listen 127.0.0.1:7070      # upstream: $LOCKSTEP_URL
    LOCKSTEP_URL=http://127.0.0.1:7070 torchrun ... -m agents run train.py

At 1024 ranks every agent posting its own batch twice a second is 2,000 requests/s, each paying
HTTP, a transaction and a commit on the server. The relay gathers what the ranks of a node send
within a short window and forwards it as one `POST /api/v1/ingest/bulk` (`protocol.Bulk`): one
request and one transaction per node instead of one per rank (docs/scale-out.md has the numbers).

It keeps nothing: an agent's POST is answered only with the server's answer to its own batch,
so a batch the server did not accept stays in that agent's spool and is resent, exactly as
without a relay (the relay restarting, or the server being down, loses nothing). Batches go
upstream byte for byte, so a resend through the relay or straight to the server is the same
batch. One bad batch does not sink its neighbours: when the server refuses a bulk request with a
4xx, each batch is sent on its own and gets its own answer. The server's backpressure passes
through: each batch's answer carries its `flush_interval_s`, a 429 or 503 its Retry-After, and
the agents slow their flushes themselves.

A tree: node relays may point at a rack (or pod) relay, which takes their bulk requests (`Bulk` or
`Packed`) as well as single batches, merges what arrives in its window into one request upstream
and answers each node relay with the answers to exactly its batches (`bulk_answer`): one request
per window per rack. Upstream, batches travel packed (`agents.agreement`): what many ranks agree
on goes once with the ranks that hold it, dissent rank by rank; an upstream that predates packed
bodies is sent version 1 from then on. Graph-text uploads (`/api/v1/blobs`) pass through unchanged. Standard library and msgspec only, like the rest of the agent.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec

from agents import agreement, protocol
from agents.transport import Reply, exchange

log = logging.getLogger("lockstep.relay")

INGEST, BULK, BLOBS = "/api/v1/ingest", "/api/v1/ingest/bulk", "/api/v1/blobs"
WINDOW_S = 0.05
MAX_BATCHES = 64
MAX_BULK_BYTES = protocol.MAX_BODY_BYTES // 2
UPSTREAM_TIMEOUT = 8.0  # under the agent's own 10 s (transport.HTTP_TIMEOUT): it hears "retry" from us first
ANSWER_TIMEOUT = 9.5
RETRY_AFTER = "1"
BODY_TIMEOUT_S = 30.0  # seconds an agent has to send its request


@dataclass
class _Waiting:
    """One agent's batch, waiting for the server's answer to it."""

    token: str
    batch: bytes  # its exact JSON (inflated)
    decoded: protocol.Batch | None = None  # the batch, when it may travel packed (`agreement.packable`)
    done: threading.Event = field(default_factory=threading.Event)
    answer: Reply | None = None
    abandoned: bool = False  # the agent was told to retry: it will resend, so this copy is not sent
    arrived: float = field(default_factory=time.monotonic)

    def reply(self, answer: Reply) -> None:
        self.answer = answer
        self.done.set()


def _error(status: int, message: str, retry: bool = False) -> Reply:
    return Reply(status, json.dumps({"error": message}).encode(), {"Retry-After": RETRY_AFTER} if retry else {})


class Relay:
    """The window, the upstream sender (one thread: while a request is out, the next one fills up)."""

    def __init__(
        self,
        upstream: str,
        window: float = WINDOW_S,
        max_batches: int = MAX_BATCHES,
        upstream_timeout: float = UPSTREAM_TIMEOUT,
        answer_timeout: float = ANSWER_TIMEOUT,
        packs: bool = True,
    ):
        self.upstream = upstream.rstrip("/")
        self.window = window
        self.max_batches = max_batches
        self.upstream_timeout = upstream_timeout
        self.answer_timeout = answer_timeout
        self.packs = packs  # upstream takes `protocol.Packed`; off for good once it says it does not
        self._waiting: list[_Waiting] = []
        self._cv = threading.Condition()
        self._closed = False
        self.sent = {"bulk": 0, "single": 0, "batches": 0, "bytes": 0}  # bytes: gzip bodies sent upstream
        self._thread = threading.Thread(target=self._run, name="lockstep-relay", daemon=True)
        self._thread.start()

    def submit(self, token: str, batch: bytes, decoded: protocol.Batch | None = None) -> Reply:
        return self.submit_all(token, [(decoded, batch)])[0]

    def submit_all(self, token: str, batches: list[tuple[protocol.Batch | None, bytes]]) -> list[Reply]:
        """Each batch's answer from upstream (a node relay's bulk request brings several): they wait in
        the window with every other batch, and may go upstream in different requests."""
        items = [_Waiting(token, raw, decoded) for decoded, raw in batches]
        with self._cv:
            self._waiting.extend(items)
            self._cv.notify()
        deadline = time.monotonic() + self.answer_timeout
        return [self._answer(item, deadline) for item in items]

    def _answer(self, item: _Waiting, deadline: float) -> Reply:
        if not item.done.wait(max(0.0, deadline - time.monotonic())):
            with self._cv:
                item.abandoned = True
            if not item.done.is_set():
                return _error(504, "relay: no answer from the server in time; retry", retry=True)
        return (
            item.answer if item.answer is not None else _error(502, "relay: the server's answer was lost", retry=True)
        )

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            group = self._next_group()
            if group is None:
                return
            try:
                self._forward(group)
            except Exception as exc:  # a bug must not strand the waiting agents
                log.exception("relay: forwarding failed")
                for item in group:
                    if not item.done.is_set():
                        item.reply(_error(503, f"relay error: {exc}", retry=True))

    def _next_group(self) -> list[_Waiting] | None:
        """Wait for a first batch, then until it has waited `window` (batches that queued while a
        request was out go at once); take the batches of one token."""
        with self._cv:
            while not self._waiting and not self._closed:
                self._cv.wait()
            if self._closed and not self._waiting:
                return None
            deadline = self._waiting[0].arrived + self.window
            while (
                len(self._waiting) < self.max_batches and (left := deadline - time.monotonic()) > 0 and not self._closed
            ):
                self._cv.wait(left)
            self._waiting = [item for item in self._waiting if not item.abandoned]
            if not self._waiting:
                return []
            token = self._waiting[0].token
            group: list[_Waiting] = []
            size = 0
            for item in list(self._waiting):
                if item.token == token and len(group) < self.max_batches and size + len(item.batch) <= MAX_BULK_BYTES:
                    group.append(item)
                    size += len(item.batch)
            if not group:  # one batch bigger than a bulk body may be: it goes alone
                group = [self._waiting[0]]
            for item in group:
                self._waiting.remove(item)
            return group

    def _forward(self, group: list[_Waiting]) -> None:
        if not group:
            return
        if len(group) == 1:
            self._single(group[0])
            return
        packs = self.packs
        if packs:  # agreement once (`agents.agreement`); the answers come in the packed order
            entries = [item.decoded or item.batch for item in group]
            placed = agreement.order(entries)
            group = [group[i] for i in placed]
            data = agreement.pack([entries[i] for i in placed])
        else:
            data = protocol.bulk_body([item.batch for item in group])
        body = gzip.compress(data, 6)
        answer = _post(self.upstream + BULK, group[0].token, body, "gzip", self.upstream_timeout)
        self.sent["bulk"] += 1
        self.sent["bytes"] += len(body)
        if answer.status == 200:
            self._answered(group, msgspec.json.decode(answer.body, type=protocol.BulkReply))
        elif packs and _unpacked_upstream(answer):
            log.warning("relay: upstream takes no packed bulk bodies (an older server or relay); sending version 1")
            self.packs = False
            self._forward(group)
        elif 400 <= answer.status < 500 and answer.status != 429:
            log.warning(
                "relay: server refused a bulk of %d batches (%d); sending each alone", len(group), answer.status
            )
            for item in group:
                self._single(item)
        else:  # 429, 5xx, unreachable: every batch stays with its agent, which resends it
            for item in group:
                item.reply(answer)

    def _answered(self, group: list[_Waiting], reply: protocol.BulkReply) -> None:
        """Each batch its result; one that an upstream relay got refused on its own, that refusal."""
        refused = {r.index: r for r in reply.refused}
        self.sent["batches"] += len(group) - len(refused)
        for i, (item, result) in enumerate(zip(group, reply.results, strict=True)):
            if i in refused:
                r = refused[i]
                item.reply(Reply(r.status, bytes(r.answer), {"Retry-After": r.retry_after} if r.retry_after else {}))
            else:
                item.reply(Reply(200, msgspec.json.encode(result), {"Content-Type": "application/json"}))

    def _single(self, item: _Waiting) -> None:
        body = gzip.compress(item.batch, 6)
        answer = _post(self.upstream + INGEST, item.token, body, "gzip", self.upstream_timeout)
        self.sent["single"] += 1
        self.sent["bytes"] += len(body)
        self.sent["batches"] += answer.status == 200
        item.reply(answer)


def _post(url: str, token: str, data: bytes, encoding: str, timeout: float = UPSTREAM_TIMEOUT) -> Reply:
    """POST upstream with the agent's own Authorization; an unreachable server is a 503 with
    Retry-After (the agent keeps the batch)."""
    reply = exchange(
        url, data, {k: v for k, v in (("Content-Encoding", encoding), ("Authorization", token)) if v}, timeout
    )
    if reply.status == 0:
        log.warning("relay: server unreachable: %s", reply.error)
        return _error(503, f"relay: server unreachable ({reply.error}); retry later", retry=True)
    return reply


def _unpacked_upstream(answer: Reply) -> bool:
    """A 400 about the body's version: the upstream predates `protocol.Packed`."""
    if answer.status != 400:
        return False
    try:
        return bool(msgspec.json.decode(answer.body).get("path") == "v")
    except (msgspec.DecodeError, AttributeError):
        return False


def bulk_answer(answers: list[Reply], packed: bool) -> Reply:
    """A downstream relay's answer to its bulk request, from each batch's: all accepted, a `BulkReply`.
    Otherwise a relay that sent a packed body hears of each refused batch on its own (`BulkReply.refused`);
    an older one gets the first 4xx (it then sends each batch alone; those accepted are duplicates),
    or the first 429/5xx, which it hands to all its agents (they resend)."""
    failed = [(i, a) for i, a in enumerate(answers) if a.status != 200]
    if failed and not packed:
        own = [a for _, a in failed if 400 <= a.status < 500 and a.status != 429]
        return (own or [failed[0][1]])[0]
    results = [
        msgspec.json.decode(a.body, type=protocol.IngestReply) if a.status == 200 else _PLACEHOLDER for a in answers
    ]
    refused = [protocol.Refused(i, a.status, msgspec.Raw(a.body), a.headers.get("Retry-After", "")) for i, a in failed]
    return Reply(200, msgspec.json.encode(protocol.BulkReply(results, refused)), {"Content-Type": "application/json"})


_PLACEHOLDER = protocol.IngestReply(accepted=0)


def read_bulk(raw: bytes, encoding: str) -> tuple[bool, list[tuple[protocol.Batch | None, bytes]]]:
    """A downstream relay's bulk body: whether it was packed, and each batch (decoded where it may
    travel packed) with its exact JSON, in the order the answers follow."""
    body = protocol.inflate(raw, encoding, protocol.MAX_BODY_BYTES)
    if protocol.bulk_version(body) == protocol.PACKED_VERSION:
        return True, [
            (batch, data) if batch is not None else _packable(_one_object(data))
            for batch, data in agreement.unpack(protocol.decode_packed(body))
        ]
    return False, [_packable(_one_object(data)) for data in protocol.decode_bulk(body)]


def _packable(batch: bytes) -> tuple[protocol.Batch | None, bytes]:
    """The batch decoded when it may travel packed; one the relay cannot decode goes as sent (the server answers it)."""
    try:
        return agreement.packable(batch), batch
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None, batch


def read_batch(raw: bytes, encoding: str) -> bytes:
    """The agent's body as one JSON object, inflated and trimmed (so its bytes are the batch's identity)."""
    return _one_object(protocol.inflate(raw, encoding, protocol.MAX_BODY_BYTES))


def _one_object(data: bytes) -> bytes:
    batch = data.strip()
    if not batch.startswith(b"{"):
        raise ValueError("body must be one JSON object")
    try:
        msgspec.json.decode(batch)  # exactly one JSON value: nothing can ride along into the bulk body
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    return batch


class _Handler(BaseHTTPRequestHandler):
    relay: Relay
    protocol_version = "HTTP/1.1"  # keep-alive for agents
    timeout = BODY_TIMEOUT_S  # a connection that stalls (headers or body) is dropped, its thread freed

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        declared = self.headers.get("Content-Length") or "0"
        if not (declared.isascii() and declared.isdigit()):  # "-1" would read to EOF: a hang
            self.close_connection = True
            self._send(_error(400, "relay: invalid Content-Length"))
            return
        length = int(declared)
        if length > protocol.MAX_BODY_BYTES:
            self.close_connection = True
            self._send(_error(413, f"body exceeds {protocol.MAX_BODY_BYTES} bytes"))
            return
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            self.close_connection = True
            return
        token = self.headers.get("Authorization", "")
        if self.path == BLOBS:
            self._send(_post(self.relay.upstream + BLOBS, token, raw, self.headers.get("Content-Encoding", "")))
        elif self.path == INGEST:
            try:
                batch = read_batch(raw, self.headers.get("Content-Encoding", ""))
            except ValueError as exc:  # protocol.BodyError carries its status; malformed JSON is a 400
                self._send(_error(getattr(exc, "status", 400), f"relay: {exc}"))
                return
            self._send(self.relay.submit(token, batch, _packable(batch)[0]))
        elif self.path == BULK:  # a node relay below this one (a rack's relay)
            try:
                packed, batches = read_bulk(raw, self.headers.get("Content-Encoding", ""))
            except ValueError as exc:  # as above; msgspec's errors and agreement.PackError are ValueErrors
                self._send(_error(getattr(exc, "status", 400), f"relay: {exc}"))
                return
            self._send(bulk_answer(self.relay.submit_all(token, batches), packed))
        else:
            self._send(_error(404, f"relay: no such endpoint {self.path}"))

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/healthz":
            self._send(
                Reply(200, json.dumps({"ok": True, **self.relay.sent}).encode(), {"Content-Type": "application/json"})
            )
        else:
            self._send(_error(404, f"relay: no such endpoint {self.path}"))

    def _send(self, answer: Reply) -> None:
        self.send_response(answer.status)
        headers = {"Content-Type": "application/json", **answer.headers}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(answer.body)))
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.debug("relay: " + format, *args)


def make_server(host: str, port: int, relay: Relay) -> ThreadingHTTPServer:
    """The relay's HTTP server (not started): one thread per agent connection."""
    server = ThreadingHTTPServer((host, port), type("Handler", (_Handler,), {"relay": relay}))
    server.daemon_threads = True
    return server


def serve(listen: str, upstream: str, window: float = WINDOW_S, max_batches: int = MAX_BATCHES) -> None:
    host, _, port = listen.rpartition(":")
    relay = Relay(upstream, window, max_batches)
    server = make_server(host or "127.0.0.1", int(port), relay)
    print(f"lockstep relay on http://{host or '127.0.0.1'}:{server.server_address[1]} -> {relay.upstream}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        relay.close()
