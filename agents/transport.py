"""Background delivery of events: batching, gzip, retries, spool, heartbeats (docs/design.md, Wire protocol).

The training thread only appends to a bounded in-memory queue; one daemon thread does all
network and disk I/O, so user code is never blocked on the network and never sees an error.
Every batch keeps its (session, seq) identity from creation to delivery: a batch that fails
is spooled with its exact body and later batches queue behind it, so the server receives
each session's batches in seq order and deduplicates repeats.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.client import HTTPMessage
from typing import IO

import msgspec

from agents import packing, protocol
from agents.config import Config
from agents.spool import GZIP_MAGIC, Spool, file_name, split_body, wire_body

log = logging.getLogger("lockstep.agent")

MAX_QUEUE = 200_000
MAX_BATCH_EVENTS = 5_000
BATCH_TARGET_BYTES = 2 * 1024 * 1024
BACKOFF_BASE = 0.25
BACKOFF_MAX = 10.0  # a returning backend is used within ~10 s; jitter spreads a cluster
HTTP_TIMEOUT = 10.0
MAX_SERVER_INTERVAL = 60.0  # a server's backpressure is honoured up to this flush interval
STEP_MARGIN = 1.25  # an asked interval up to this many of the job's steps spares the server no batch


def kept_interval(base: float, asked: float | None, step_s: float) -> float:
    """The flush interval to keep: the server's longer one only where it means fewer batches.

    With nothing else to report, an agent sends a batch per step at most, so an interval no longer
    than its steps (a 1 s ask to a job at 1 step/s) only holds each step's report back by up to
    that long and spares the server nothing; a server that still cannot keep up asks longer, and
    that is followed. The margin keeps a node's ranks, whose steps are alike, on one side of it:
    they flush on the same instants, and their relay forwards them together."""
    if asked is None or asked <= base or asked <= step_s * STEP_MARGIN:
        return base
    return asked


class StepClock:
    """Seconds per training step as the sender sees the step counter at its flushes (0 until a step
    has passed twice); while no step passes, at least the time since the last one."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.at = 0.0
        self.period = 0.0

    def observe(self, step: int | None, now: float) -> None:
        if step is None:
            return
        if self.step is None or step < self.step:  # first seen, or counted again from the start
            self.step, self.at, self.period = step, now, 0.0
        elif step > self.step:
            gap = (now - self.at) / (step - self.step)
            self.period = gap if not self.period else self.period + (gap - self.period) / 4
            self.step, self.at = step, now

    def seconds(self, now: float) -> float:
        return max(self.period, now - self.at) if self.period else 0.0


@dataclass
class Outcome:
    """Result of one POST: ok; retry (after `delay` or backoff; the batch stays); split (413: send
    it in halves); quarantine (the server proved it malformed: kept aside with the answer, never resent)."""

    kind: str
    delay: float | None = None
    reply: protocol.IngestReply | None = None
    detail: str = ""


@dataclass
class Reply:
    """What one POST got back: status (0: the server was not reached), body, and the headers a sender acts on."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""


class _Unfollowed(urllib.request.HTTPRedirectHandler):
    """A redirect is the answer (an HTTPError of its 3xx), never followed: the token must not go wherever
    it points (another port, another host), and a batch it sends elsewhere is not the server's."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> None:
        return None


_OPENER = urllib.request.build_opener(_Unfollowed())


def exchange(url: str, body: bytes, headers: dict[str, str], timeout: float = HTTP_TIMEOUT) -> Reply:
    """POST a JSON body and return the answer whatever it is (the agent and the node relay both send through this)."""
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", **headers}, method="POST"
    )
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return Reply(response.status, response.read(), _kept(response.headers))
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read() if e.fp else b"", _kept(e.headers))
    except (OSError, ValueError) as e:  # URLError, timeouts, connection resets
        return Reply(0, b"", error=str(e))


def _kept(headers: Message[str, str]) -> dict[str, str]:
    return {k: v for k in ("Content-Type", "Retry-After", "Location") if (v := headers.get(k))}


def _headers(token: str | None, body: bytes) -> dict[str, str]:
    headers = {}
    if body[:2] == b"\x1f\x8b":
        headers["Content-Encoding"] = "gzip"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def post(url: str, token: str | None, body: bytes, timeout: float = HTTP_TIMEOUT) -> Outcome:
    """POST one exact batch body (gzip detected by magic) and classify the answer."""
    return classify(exchange(url + "/api/v1/ingest", body, _headers(token, body), timeout))


BLOBS_NOT_NEEDED = (429, 507)  # a graph-text quota (ingest/blobs.py): the texts are dropped, never resent
PROVEN_MALFORMED = (409, 415, 422)  # and a 400 whose JSON error names the failing field


def classify(reply: Reply) -> Outcome:
    """Only ingest's own reply (a 2xx of its JSON shape) delivers a batch, and only the server's proof
    that it is malformed lets it leave the spool otherwise; any other answer (a rotated token's 401, a
    proxy's 404 or 413, a redirect, a login portal's 200 page, an outage) keeps it for a retry."""
    if reply.status == 0:
        return Outcome("retry", detail=reply.error)
    if 200 <= reply.status < 300 and (accepted := _ingest_reply(reply.body)) is not None:
        return Outcome("ok", reply=accepted)
    answer = f"HTTP {reply.status}: {reply.body[:300].decode('utf-8', 'replace')}"
    if "Location" in reply.headers:
        answer = f"HTTP {reply.status}: a redirect to {reply.headers['Location'][:300]}, not followed"
    if reply.status in PROVEN_MALFORMED or (reply.status == 400 and _names_a_field(reply.body)):
        return Outcome("quarantine", detail=answer)
    if reply.status == 413:
        return Outcome("split", detail=answer)
    return Outcome("retry", delay=_retry_after(reply.headers.get("Retry-After")), detail=answer)


def _ingest_reply(body: bytes) -> protocol.IngestReply | None:
    try:
        return msgspec.json.decode(body, type=protocol.IngestReply)
    except msgspec.MsgspecError:
        return None


def _names_a_field(body: bytes) -> bool:
    """Ingest's 400 says which field failed (`{"error": ..., "path": "events[3].step"}`); a proxy's does not."""
    try:
        answer = msgspec.json.decode(body)
    except msgspec.MsgspecError:
        return False
    return isinstance(answer, dict) and isinstance(answer.get("path"), str) and bool(answer["path"])


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, min(float(value), 3600.0)) if value else None
    except ValueError:
        return None


def encode_body(batch: protocol.Batch) -> bytes:
    return wire_body(protocol.encode(batch))


class Transport:
    """Queue + sender thread. `put` is cheap and thread-safe; `close` flushes with a deadline."""

    def __init__(
        self,
        cfg: Config,
        on_detail: Callable[[list[int]], list[protocol.Event]] | None = None,
        step: Callable[[], int | None] = lambda: None,
        on_blobs: Callable[[list[str]], list[bytes]] | None = None,
        progress: Callable[[bool], protocol.Event | None] | None = None,
        on_flight_recorder: Callable[[str], bytes] | None = None,
        on_weights: Callable[[list[int]], None] | None = None,
        peers_gone: Callable[[], list[protocol.Event]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.session = str(uuid.uuid4())
        self.run = protocol.RunInfo(key=cfg.run, world_size=cfg.world_size, name=cfg.run_name)
        self._on_detail = on_detail
        self._on_blobs = on_blobs
        self._step = step
        self._progress = progress
        self._on_flight_recorder = on_flight_recorder
        self._on_weights = on_weights
        self._peers_gone = peers_gone
        self._queue: collections.deque[protocol.Event] = collections.deque()
        self._cv = threading.Condition()
        self._seq = 0
        self._spool = Spool(cfg.spool_dir, cfg.spool_cap)
        self._backlog: collections.deque[str] = collections.deque()  # spooled paths awaiting upload
        self._dropped: dict[str, int] = {}
        self._failures = 0
        self._told = False  # rank 0 said once on stderr that batches are not getting through
        self._not_before = 0.0
        self._closing = False
        self._deadline = float("inf")
        self._last_heartbeat = time.monotonic()
        self.server_interval: float | None = None  # the server's backpressure (`IngestReply.flush_interval_s`)
        self._steps = StepClock()
        self.stats = {
            "sent_batches": 0,
            "spooled_batches": 0,
            "dropped_events": 0,
            "quarantined_batches": 0,
            "blobs_not_needed": 0,
        }
        self._thread = threading.Thread(target=self._run, name="lockstep-sender", daemon=True)
        self._thread.start()

    # producer side ----------------------------------------------------------------
    def put(self, event: protocol.Event) -> None:
        if len(self._queue) >= MAX_QUEUE:
            self._count_drop(1, "queue_full")
            return
        self._queue.append(event)
        if len(self._queue) >= MAX_BATCH_EVENTS:
            with self._cv:
                self._cv.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Deliver (or spool) everything queued, giving up on the network at the deadline. A second
        call (a SIGTERM handler during an exit's close) can extend the deadline, never shorten it."""
        with self._cv:
            deadline = time.monotonic() + max(0.0, timeout)
            self._deadline = max(self._deadline, deadline) if self._closing else deadline
            self._closing = True
            self._not_before = min(self._not_before, time.monotonic())  # the backend may be back: try now
            self._cv.notify()
        self._thread.join(max(0.0, self._deadline - time.monotonic()) + 2.0)

    # sender thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                with self._cv:
                    if not self._closing:
                        self._cv.wait(self._until_flush())
                    closing = self._closing
                self._steps.observe(self._step(), time.monotonic())
                self._maybe_heartbeat(closing)
                self._look_at_peers()
                self._cycle(closing)
                if closing and not self._queue:
                    if self._backlog and self._server() is not None and time.monotonic() < self._deadline:
                        wait = min(self._not_before, self._deadline) - time.monotonic()
                        time.sleep(min(max(wait, 0.01), 1.0))
                        continue
                    self._finish_close()
                    return
            except Exception as e:  # keep the sender alive whatever happens
                log.debug("lockstep sender error: %s", e)
                time.sleep(0.1)

    @property
    def flush_interval(self) -> float:
        """The configured interval, or the longer one the server's last reply asked for while it is
        loaded, where that means fewer batches (`kept_interval`)."""
        return kept_interval(self.cfg.flush_interval, self.server_interval, self._steps.seconds(time.monotonic()))

    def _until_flush(self) -> float:
        """Seconds to the next multiple of the flush interval on the wall clock (at least a tenth of it).

        The ranks of a node share that clock, so they flush together: a node relay then forwards
        their batches as one request, where their agreeing grad reports share rows on the server.
        The server's intervals are the agent's default doubled (`ingest.backpressure`), so ranks told
        different ones still meet at the longer one's multiples.
        """
        interval = self.flush_interval
        wait = interval - time.time() % interval
        return wait if wait >= interval / 10 else wait + interval

    def _maybe_heartbeat(self, closing: bool) -> None:
        if closing:
            return
        now = time.monotonic()
        heartbeat = now - self._last_heartbeat >= self.cfg.heartbeat
        if heartbeat:
            self._last_heartbeat = now
            self.put(protocol.Heartbeat(ts=time.time(), step=self._step()))
        sample = self._progress(heartbeat) if self._progress is not None else None
        if sample is not None:
            self.put(sample)

    def _look_at_peers(self) -> None:
        """Report the node's ranks whose process vanished (agents/peers.py), at every flush and as
        this process closes too: torchrun stops the others right after one dies, and the ones it
        stops are the ones that saw it go."""
        if self._peers_gone is None:
            return
        try:
            for event in self._peers_gone():
                self.put(event)
        except Exception as e:  # a watcher that fails once stops watching; delivery goes on
            log.debug("lockstep: peer watch failed, stopped: %s", e)
            self._peers_gone = None

    def _cycle(self, closing: bool) -> None:
        """Drain the backlog if allowed, then turn the queue into batches."""
        self._drain_backlog(closing)
        while self._queue:
            events = self._take_events()
            self._deliver(self._make_body(events), closing)
            if not closing and len(self._queue) < MAX_BATCH_EVENTS:
                break

    def _take_events(self) -> list[protocol.Event]:
        events: list[protocol.Event] = []
        if self._dropped:
            events.extend(protocol.Dropped(ts=time.time(), count=n, reason=r) for r, n in self._dropped.items())
            self._dropped.clear()
        while self._queue and len(events) < MAX_BATCH_EVENTS:
            events.append(self._queue.popleft())
        return events

    def _make_body(self, events: list[protocol.Event]) -> tuple[int, bytes, int]:
        """(seq, body, n_events). Oversized batches are split before they get a seq."""
        batch = protocol.Batch(
            v=protocol.PROTOCOL_VERSION,
            run=self.run,
            rank=self.cfg.rank,
            session=self.session,
            seq=self._seq,
            events=[],
        )
        try:
            batch.events = packing.compact(events)
            raw = protocol.encode(batch)
        except (TypeError, ValueError, msgspec.MsgspecError):
            events = self._encodable(events)
            batch.events = packing.compact(events)
            raw = protocol.encode(batch)
        if len(raw) > BATCH_TARGET_BYTES and len(events) > 1:
            half = len(events) // 2
            self._queue.extendleft(reversed(events[half:]))
            return self._make_body(events[:half])
        self._seq += 1
        return batch.seq, wire_body(raw), len(events)

    def _encodable(self, events: list[protocol.Event]) -> list[protocol.Event]:
        """Drop (and count) events that cannot be encoded or are not the protocol's, so one bad event can't
        sink a batch."""
        good = []
        for event in events:
            try:
                protocol.wire_events([event])
                protocol.encode(event)
                good.append(event)
            except (TypeError, ValueError, msgspec.MsgspecError):
                self._count_drop(1, "unencodable")
        return good

    def _server(self) -> str | None:
        """The server's URL while batches go to it; None offline."""
        return None if self.cfg.offline else self.cfg.url

    def _deliver(self, item: tuple[int, bytes, int], closing: bool) -> None:
        seq, body, n = item
        url = self._server()
        if url is None or self._backlog or time.monotonic() < self._not_before:
            self._to_spool(seq, body, n)
            return
        outcome = post(url, self.cfg.token, body, self._timeout(closing))
        name = file_name(self.cfg.rank, self.session, seq, body[:2] == GZIP_MAGIC)
        if outcome.kind == "split" and not self._spool_halves(body):
            outcome = Outcome("retry", detail=outcome.detail)
        if outcome.kind == "retry":
            self._to_spool(seq, body, n)
        elif outcome.kind == "quarantine":
            self._quarantine(name, body, outcome)
        self._after(outcome, n)

    def _drain_backlog(self, closing: bool) -> None:
        while self._backlog and (url := self._server()) is not None and time.monotonic() >= self._not_before:
            if closing and time.monotonic() >= self._deadline:
                return
            path = self._backlog[0]
            try:
                with open(path, "rb") as f:
                    body = f.read()
            except OSError:
                self._backlog.popleft()
                continue
            outcome = post(url, self.cfg.token, body, self._timeout(closing))
            if outcome.kind == "split" and not self._spool_halves(body, first=True):
                outcome = Outcome("retry", detail=outcome.detail)
            if outcome.kind != "retry":
                self._backlog.remove(path)
                if outcome.kind == "quarantine":
                    self._quarantine(os.path.basename(path), body, outcome, spooled=path)
                else:
                    self._spool.remove(path)
            self._after(outcome, 0)
            if outcome.kind == "retry":
                return

    def _spool_halves(self, body: bytes, first: bool = False) -> bool:
        """A 413: spool the batch as two halves (`spool.split_body`), ahead of the backlog when
        `first`; False when it cannot be split (one event) or spooled, so it is retried as it is."""
        halves = split_body(body)
        if halves is None:
            return False
        paths: list[str | None] = []
        for name, half in halves:
            try:
                paths.append(self._spool.write(name, half))
            except OSError as e:
                log.debug("lockstep: spool write failed: %s", e)
                paths.append(None)
        written = [path for path in paths if path is not None]
        if len(written) < len(paths):
            for path in written:
                self._spool.remove(path)
            return False
        if first:
            self._backlog.extendleft(reversed(written))
        else:
            self._backlog.extend(written)
        return True

    def _quarantine(self, name: str, body: bytes, outcome: Outcome, spooled: str | None = None) -> None:
        try:
            self._spool.quarantine(name, body, outcome.detail, spooled)
        except OSError as e:
            log.debug("lockstep: quarantine write failed: %s", e)

    def _after(self, outcome: Outcome, n: int) -> None:
        if outcome.kind == "retry":
            self._failures += 1
            delay = outcome.delay
            if delay is None:
                delay = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (self._failures - 1)) * random.uniform(0.5, 1.0)
            self._not_before = time.monotonic() + delay
            log.debug("lockstep: delivery failed (%s), retry in %.2fs", outcome.detail, delay)
            spool = os.path.abspath(self.cfg.spool_dir)
            self._tell_once(
                f"cannot deliver to {self.cfg.url} ({outcome.detail}); batches wait in {spool} and go out when "
                f"the server answers (or later: python -m agents upload {spool} --url URL --token TOKEN)"
            )
            return
        self._failures = 0
        if outcome.kind == "split":
            return
        if outcome.kind == "quarantine":
            log.warning("lockstep: batch rejected as malformed, quarantined in the spool: %s", outcome.detail)
            self._tell_once(f"the server refused a batch for good ({outcome.detail}); it is kept aside in the spool")
            self.stats["quarantined_batches"] += 1
            self._count_drop(n, "quarantined")
            return
        self.stats["sent_batches"] += 1
        if outcome.reply:
            asked = outcome.reply.flush_interval_s
            self.server_interval = None if asked is msgspec.UNSET else min(float(asked), MAX_SERVER_INTERVAL)
        if outcome.reply and outcome.reply.weights_at and self._on_weights:
            self._on_weights(list(outcome.reply.weights_at))
        if outcome.reply and outcome.reply.detail and self._on_detail:
            for event in self._on_detail(list(outcome.reply.detail)):
                self.put(event)
        if outcome.reply and outcome.reply.want_blobs and self._on_blobs:
            self._upload_blobs(list(outcome.reply.want_blobs))
        if outcome.reply and outcome.reply.flight_recorder and self._on_flight_recorder:
            self._upload_flight_record()

    def _tell_once(self, what: str) -> None:
        """The first failed delivery of rank 0's process, on stderr: a wrong token, an unreachable server
        or a run the server refuses (wider than its LOCKSTEP_MAX_RANKS) would otherwise leave a job's team
        looking at an empty dashboard with no clue. Once: the agent goes on quietly, and the other ranks
        would only repeat it."""
        if self._told or self.cfg.rank != 0:
            return
        self._told = True
        sys.stderr.write(f"lockstep: {what}\n")

    def _upload_flight_record(self) -> None:
        """The server asked for a Flight Recorder dump (agents/flight_recorder.py): taken here, on the
        sender thread, since the main thread may be blocked in the collective. Best effort, sent once."""
        if self._on_flight_recorder is None or self.cfg.url is None:
            return
        body = self._on_flight_recorder(self.session)
        reply = exchange(
            self.cfg.url + "/api/v1/flight-recorder", body, _headers(self.cfg.token, body), self._timeout(self._closing)
        )
        if reply.status != 200:
            log.debug("lockstep: flight recorder upload failed: %s", reply.error or f"HTTP {reply.status}")

    def _upload_blobs(self, hashes: list[str]) -> None:
        """Send the graph texts the server asked of this rank. Best effort, never retried: a text that
        does not arrive is only missing from a diff, and the server asks again for it later. A 429 or
        507 (the project's graph-text quota) means "not needed": the rest of this request is dropped."""
        if self._on_blobs is None or self.cfg.url is None:
            return
        for body in self._on_blobs(hashes):
            reply = exchange(
                self.cfg.url + "/api/v1/blobs", body, _headers(self.cfg.token, body), self._timeout(self._closing)
            )
            if reply.status in BLOBS_NOT_NEEDED:
                self.stats["blobs_not_needed"] += 1
                log.debug("lockstep: graph texts not needed (HTTP %s): the project's quota", reply.status)
                return
            if reply.status != 200:
                log.debug("lockstep: graph text upload failed: %s", reply.error or f"HTTP {reply.status}")

    def _timeout(self, closing: bool) -> float:
        if not closing:
            return HTTP_TIMEOUT
        return max(0.1, min(HTTP_TIMEOUT, self._deadline - time.monotonic()))

    def _to_spool(self, seq: int, body: bytes, n: int) -> None:
        gz = body[:2] == b"\x1f\x8b"
        try:
            path = self._spool.write(file_name(self.cfg.rank, self.session, seq, gz), body)
        except OSError as e:
            log.debug("lockstep: spool write failed: %s", e)
            path = None
        if path is None:
            self._count_drop(n, "spool_full_or_unwritable")
            return
        self.stats["spooled_batches"] += 1
        self._backlog.append(path)

    def _count_drop(self, n: int, reason: str) -> None:
        if n:
            self._dropped[reason] = self._dropped.get(reason, 0) + n
            self.stats["dropped_events"] += n

    def _finish_close(self) -> None:
        """Last chance: report drops into the spool; whatever is spooled stays for `upload`."""
        if self._dropped:
            self._deliver(self._make_body(self._take_events()), True)
