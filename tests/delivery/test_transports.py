"""The transport seam: SlackWebhook against a tiny local receiver (no database, no Celery).

The body is pinned byte for byte: receivers parse it, and the format must not drift when
transports are added or moved.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dashboard.delivery import transports
from dashboard.delivery.models import Webhook
from dashboard.delivery.transports import SlackWebhook, Transport, TransportError
from dashboard.detection.models import Alert
from dashboard.tenancy.models import Run

SEEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


class Receiver:
    """Records what was POSTed; answers `status`."""

    def __init__(self) -> None:
        self.status = 200
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.url = ""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            state.requests.append((dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(state.status)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_port}/hook"
    yield state
    server.shutdown()
    server.server_close()


def alert() -> Alert:
    """An unsaved alert: the transport only reads it."""
    return Alert(id=7, run=Run(key="r-1", world_size=4), kind="grad_divergence", subject="grads", severity="critical",
                 state=Alert.State.FIRING, ranks=[3, 1], step=12, message="rank 1 and 3 differ", details={"n": 2},
                 first_seen=SEEN, last_seen=SEEN, revision=2)


def test_slack_webhook_posts_the_payload_and_idempotency_key(receiver, settings):
    settings.LOCKSTEP_PUBLIC_URL = "https://lockstep.example"
    SlackWebhook(Webhook(url=receiver.url)).notify(alert(), "lockstep-7-2")
    [(headers, body)] = receiver.requests
    assert headers["Idempotency-Key"] == "lockstep-7-2"
    assert headers["Content-Type"] == "application/json"
    assert body == json.dumps({
        "text": "[CRITICAL] grad_divergence in run r-1: rank 1 and 3 differ",
        "attachments": [{
            "color": "#c62828",
            "title": "grad_divergence · r-1",
            "title_link": "https://lockstep.example/runs/r-1/",
            "text": "rank 1 and 3 differ",
            "fields": [{"title": "ranks", "value": "3, 1", "short": True},
                       {"title": "step", "value": "12", "short": True}],
        }],
        "lockstep": {"revision": 2, "alert": {
            "id": 7, "run": "r-1", "kind": "grad_divergence", "severity": "critical", "state": "firing",
            "ranks": [1, 3], "step": 12, "frame": None, "message": "rank 1 and 3 differ", "details": {"n": 2},
            "count": 1, "first_seen": SEEN.isoformat(), "last_seen": SEEN.isoformat(), "acked_by": None,
            "acked_at": None,
        }},
    }).encode()
    assert b'"title": "grad_divergence \\u00b7 r-1"' in body  # ASCII-escaped, default separators


def test_resolved_alert_without_public_url(receiver, settings):
    settings.LOCKSTEP_PUBLIC_URL = ""
    resolved = alert()
    resolved.state, resolved.severity, resolved.ranks, resolved.step = Alert.State.RESOLVED, "warning", [], None
    SlackWebhook(Webhook(url=receiver.url)).notify(resolved, "k")
    sent = json.loads(receiver.requests[0][1])
    assert sent["text"].startswith("[RESOLVED] grad_divergence")
    assert sent["attachments"][0]["color"] == "#ef8f00" and sent["attachments"][0]["title_link"] == ""
    assert [f["value"] for f in sent["attachments"][0]["fields"]] == ["-", "-"]


def test_failing_receiver_raises_transport_error(receiver):
    receiver.status = 503
    with pytest.raises(TransportError, match="503"):
        SlackWebhook(Webhook(url=receiver.url)).notify(alert(), "k")
    assert len(receiver.requests) == 1


def test_unreachable_receiver_raises_transport_error():
    with pytest.raises(TransportError):
        SlackWebhook(Webhook(url="http://127.0.0.1:1/hook")).notify(alert(), "k")  # nothing listens on port 1


def test_transports_are_registered_by_kind():
    assert transports.TRANSPORTS["slack"] is SlackWebhook
    assert isinstance(transports.for_webhook(Webhook(url="http://x")), SlackWebhook)
    with pytest.raises(TypeError, match="slack"):
        type("AnotherSlack", (Transport,), {"kind": "slack"})
    assert transports.TRANSPORTS["slack"] is SlackWebhook
