"""Small local receivers that speak each sink's API (the outside edge of delivery): Alertmanager's
v2 alerts and silences API, PagerDuty's Events API v2, a Slack incoming webhook and a plain JSON
webhook. Each checks requests the way the real service does for the fields Lockstep sends, keeps
what it was told, and can refuse the next requests (`fail_next`) to drive retries or answer with a
redirect (`redirect_to`)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PD_SEVERITIES = {"critical", "error", "warning", "info"}
PD_ACTIONS = {"trigger", "acknowledge", "resolve"}


class Receiver:
    """A threaded HTTP server on 127.0.0.1; `handle(path, headers, raw)` returns (status, JSON answer)."""

    def __init__(self) -> None:
        self.fail_next = 0
        self.fail_status = 503
        self.redirect_to = ""
        self.requests: list[tuple[str, dict[str, str], bytes]] = []  # every POST, refused ones included
        self.deletes: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append((self.path, dict(self.headers), raw))
                    if receiver.redirect_to:
                        self.send_response(302)
                        self.send_header("Location", receiver.redirect_to)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if receiver.fail_next > 0:
                        receiver.fail_next -= 1
                        status, answer = receiver.fail_status, {"error": "try later"}
                    else:
                        status, answer = receiver.handle(self.path, dict(self.headers), raw)
                body = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_DELETE(self) -> None:
                with receiver.lock:
                    receiver.deletes.append(self.path)
                    status, answer = receiver.delete(self.path)
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, object]:
        raise NotImplementedError

    def delete(self, path: str) -> tuple[int, object]:
        return 405, {"message": "method not allowed"}

    def bodies(self, path: str | None = None) -> list:
        return [json.loads(raw) for p, _, raw in self.requests if path is None or p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class AlertmanagerReceiver(Receiver):
    """`POST /api/v2/alerts`: a list of postable alerts; alerts are identified by their label set, as
    Alertmanager does, and an alert is active until its endsAt. `POST /api/v2/silences` creates a
    silence (or updates the one whose `id` is given; an unknown id is a 404), `DELETE
    /api/v2/silence/<id>` expires one."""

    def __init__(self) -> None:
        self.alerts: dict[frozenset, dict] = {}
        self.silences: dict[str, dict] = {}  # id -> the silence, with "status"
        super().__init__()

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, object]:
        if path == "/api/v2/silences":
            return self.silence(json.loads(raw))
        if path != "/api/v2/alerts":
            return 404, {"message": "not found"}
        body = json.loads(raw)
        if not isinstance(body, list) or not body:
            return 400, {"code": 602, "message": "body must be a non-empty list of alerts"}
        for alert in body:
            labels = alert.get("labels")
            if not isinstance(labels, dict) or not labels or not all(isinstance(v, str) and v for v in labels.values()):
                return 400, {"code": 602, "message": "labels must be a non-empty map of non-empty strings"}
            starts = _time(alert["startsAt"]) if "startsAt" in alert else None
            ends = _time(alert["endsAt"]) if "endsAt" in alert else None
            if starts and ends and ends < starts:
                return 400, {"code": 400, "message": "start time must be before end time"}
            if "generatorURL" in alert and not alert["generatorURL"].startswith(("http://", "https://")):
                return 400, {"code": 602, "message": "generatorURL must be a URL"}
        for alert in body:
            self.alerts[frozenset(alert["labels"].items())] = alert
        return 200, None

    def silence(self, body: dict) -> tuple[int, object]:
        matchers = body.get("matchers")
        if not matchers or not all(
            m.get("name") and isinstance(m.get("value"), str) and "isRegex" in m for m in matchers
        ):
            return 400, {"message": "matchers must name a label, a value and isRegex"}
        if _time(body["endsAt"]) <= _time(body["startsAt"]) or not body.get("createdBy") or not body.get("comment"):
            return 400, {"message": "endsAt must follow startsAt; createdBy and comment are required"}
        silence_id = body.get("id") or f"s-{len(self.silences) + 1}"
        if body.get("id") and self.silences.get(silence_id, {}).get("status") != "active":
            return 404, {"message": f"silence {silence_id} not found"}
        self.silences[silence_id] = {**body, "id": silence_id, "status": "active"}
        return 200, {"silenceID": silence_id}

    def delete(self, path: str) -> tuple[int, object]:
        silence_id = path.removeprefix("/api/v2/silence/")
        if self.silences.get(silence_id, {}).get("status") != "active":
            return 404, {"message": f"silence {silence_id} not found"}
        self.silences[silence_id]["status"] = "expired"
        return 200, {}

    def active(self) -> list[dict]:
        now = datetime.now(UTC)
        return [a for a in self.alerts.values() if "endsAt" not in a or _time(a["endsAt"]) > now]

    def active_silences(self) -> list[dict]:
        now = datetime.now(UTC)
        return [s for s in self.silences.values() if s["status"] == "active" and _time(s["endsAt"]) > now]


class PagerDutyReceiver(Receiver):
    """`POST /v2/enqueue` of the Events API v2: routing key, action, dedup key and (for a trigger) the
    payload's summary, source and severity are checked; incidents are kept by dedup key."""

    def __init__(self, routing_key: str) -> None:
        self.routing_key = routing_key
        self.incidents: dict[str, str] = {}  # dedup_key -> "triggered" | "acknowledged" | "resolved"
        super().__init__()

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, object]:
        if path != "/v2/enqueue":
            return 404, {"status": "not found"}
        event = json.loads(raw)
        errors = []
        if event.get("routing_key") != self.routing_key:
            errors.append("'routing_key' is invalid")
        if event.get("event_action") not in PD_ACTIONS:
            errors.append("'event_action' is invalid")
        key = event.get("dedup_key")
        if not isinstance(key, str) or not 0 < len(key) <= 255:
            errors.append("'dedup_key' must be 1-255 characters")
        if event.get("event_action") == "trigger":
            payload = event.get("payload") or {}
            if not payload.get("summary") or len(payload["summary"]) > 1024:
                errors.append("'payload.summary' is missing or too long")
            if not payload.get("source"):
                errors.append("'payload.source' is missing")
            if payload.get("severity") not in PD_SEVERITIES:
                errors.append("'payload.severity' is invalid")
        if errors:
            return 400, {"status": "invalid event", "message": "Event object is invalid", "errors": errors}
        self.incidents[key] = self.next_state(self.incidents.get(key), event["event_action"])
        return 202, {"status": "success", "message": "Event processed", "dedup_key": key}

    @staticmethod
    def next_state(state: str | None, action: str) -> str | None:
        """PagerDuty's alert states: an acknowledge needs an open alert; a trigger leaves an acknowledged one so."""
        if action == "resolve":
            return "resolved" if state else None
        if action == "acknowledge":
            return "acknowledged" if state in ("triggered", "acknowledged") else state
        return "acknowledged" if state == "acknowledged" else "triggered"


class SlackReceiver(Receiver):
    """A Slack incoming webhook: a JSON object with a `text` (what Slack requires), answered "ok"."""

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, object]:
        body = json.loads(raw)
        if not isinstance(body, dict) or not body.get("text"):
            return 400, "no_text"
        return 200, "ok"


class JsonReceiver(Receiver):
    """Takes any JSON body (what a team's own service would)."""

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, object]:
        json.loads(raw)
        return 200, {"ok": True}
