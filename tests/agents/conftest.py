"""Shared helpers for agent tests: a scripted ingest stub and spool reading."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import threading
from collections import defaultdict

import pytest

from agents import protocol
from agents.spool import list_batches

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Stub:
    """Tiny ingest server: answers from `script` (status, headers[, body]) then 200, and 413 like a
    proxy to a batch of more than `max_events` events; records accepted batches, asks for
    `want_blobs` in every answer and records the graph texts uploaded to /api/v1/blobs."""

    def __init__(self, port: int = 0) -> None:
        self.script: list[tuple] = []
        self.max_events: int | None = None
        self.requests: list[tuple[float, protocol.Batch]] = []
        self.accepted: list[protocol.Batch] = []
        self.detail: list[int] = []
        self.want_blobs: list[str] = []
        self.extra: dict = {}  # more reply keys (flight_recorder, weights_at, ...)
        self.blobs: list[protocol.Blob] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                import time

                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/api/v1/blobs":
                    upload = protocol.decode_blobs(body)
                    with stub.lock:
                        stub.blobs += upload.blobs
                    self._answer(200, {}, {"stored": [b.hash for b in upload.blobs], "known": []})
                    return
                batch = protocol.decode_batch(body)
                with stub.lock:
                    stub.requests.append((time.monotonic(), batch))
                    status, headers, *answer = stub.script.pop(0) if stub.script else (200, {})
                    if stub.max_events is not None and len(batch.events) > stub.max_events:
                        status, headers, answer = 413, {}, [{"error": "a proxy's body limit"}]
                    if status == 200:
                        stub.accepted.append(batch)
                reply = {
                    "accepted": len(batch.events),
                    "duplicate": False,
                    "want_blobs": stub.want_blobs,
                    "detail": stub.detail,
                    **stub.extra,
                }
                self._answer(status, headers, reply if status == 200 else (answer or [{"error": "scripted"}])[0])

            def _answer(self, status: int, headers: dict, reply: dict) -> None:
                data = json.dumps(reply).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def read_spool(directory: str) -> dict[int, list[protocol.Batch]]:
    """Batches per rank, in file (= upload) order."""
    out: dict[int, list[protocol.Batch]] = defaultdict(list)
    for path in list_batches(directory):
        with open(path, "rb") as f:
            body = f.read()
        if body[:2] == b"\x1f\x8b":
            body = gzip.decompress(body)
        batch = protocol.decode_batch(body)
        out[batch.rank].append(batch)
    return out


def events_of(batches: list[protocol.Batch]) -> list:
    """Events as the agent produced them: compact `grads` are unpacked into their `grad` events."""
    return [g for b in batches for e in b.events for g in expand(e)]


def expand(event) -> list:
    if not isinstance(event, protocol.Grads):
        return [event]
    norms = event.norms or [None] * event.steps
    nonfinite = event.nonfinite or [0] * event.steps
    return [
        protocol.Grad(step=step, group=event.group, fps=fps, norm=norm, nonfinite=bad, ts=event.ts)
        for step, fps, norm, bad in zip(event.step_numbers(), event.unpack(), norms, nonfinite)
    ]
