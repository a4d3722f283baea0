"""Where an alert revision goes: one small class per kind of destination (healthchecks' transports).

A transport knows one receiver's wire format and nothing else: `notifications` decides what to
send, when, and records the outcome; a transport sends once and raises `TransportError` when the
receiver did not take it. Adding a sink means adding one `Transport` subclass with its own `kind`
(a `Webhook.Kind` value); subclasses register themselves in `TRANSPORTS`.

`notify` gets the receipt the previous sent revision of the same alert returned (empty the first
time) and returns the receipt of this one: Alertmanager needs it to end a label set it was given
before when the labels change (more ranks, a higher severity).
"""
from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import urllib.request
from datetime import datetime, timedelta, timezone as tz
from typing import Any, ClassVar

from django.conf import settings
from django.utils import timezone

from dashboard.delivery.models import Webhook
from dashboard.detection.models import Alert

TIMEOUT_S = 5.0
TRANSPORTS: dict[str, type[Transport]] = {}  # kind -> class, filled by Transport.__init_subclass__
Receipt = dict[str, Any]


class TransportError(Exception):
    """The receiver did not take the notification; the text is kept as `Notification.last_error`."""


class Transport:
    """Sends an alert revision to one destination. `notify` raises `TransportError`, returns its receipt."""

    kind: ClassVar[str]

    def __init__(self, webhook: Webhook) -> None:
        self.webhook = webhook

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register by `kind`, so a new sink is one class and cannot silently shadow another."""
        super().__init_subclass__(**kwargs)
        if cls.kind in TRANSPORTS:
            raise TypeError(f"transport kind {cls.kind!r} is taken by {TRANSPORTS[cls.kind].__name__}")
        TRANSPORTS[cls.kind] = cls

    def notify(self, alert: Alert, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        """Send the alert as it is now; `idempotency_key` names the revision, the same on every retry."""
        raise NotImplementedError


class SlackWebhook(Transport):
    """Slack's incoming-webhook format; what "Slack-compatible" receivers accept."""

    kind = Webhook.Kind.SLACK.value

    def notify(self, alert: Alert, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        _post_json(self.webhook.url, self.payload(alert), {"Idempotency-Key": idempotency_key})
        return {}

    @staticmethod
    def payload(alert: Alert) -> dict:
        """`text` + `attachments` for Slack, plus the alert itself under `lockstep` for other receivers."""
        state = "RESOLVED" if alert.state == Alert.State.RESOLVED else alert.severity.upper()
        return {
            "text": f"[{state}] {alert.kind} in run {alert.run.key}: {alert.message}",
            "attachments": [{
                "color": {"critical": "#c62828", "warning": "#ef8f00"}.get(alert.severity, "#2e7d32"),
                "title": f"{alert.kind} · {alert.run.key}",
                "title_link": _run_url(alert),
                "text": alert.message,
                "fields": [{"title": "ranks", "value": ", ".join(map(str, alert.ranks)) or "-", "short": True},
                           {"title": "step", "value": str(alert.step if alert.step is not None else "-"), "short": True}],
            }],
            "lockstep": {"revision": alert.revision, "alert": alert.as_json()},
        }


class Alertmanager(Transport):
    """Alertmanager's v2 API (`POST /api/v2/alerts`): one alert per Lockstep alert, labelled so that
    existing routes, inhibitions and silences apply (alertname = kind, project, run, kind, subject,
    severity, ranks).

    Lockstep posts on change, not in a loop as Prometheus does, so a firing alert carries an
    `endsAt` HOLD after its last change (Alertmanager would resolve it after its resolve_timeout
    otherwise); a resolved one ends at its resolution. A label set that changed since the last
    revision (ranks joined, severity rose) is ended in the same request, so one desync never
    lingers as two alerts."""

    kind = Webhook.Kind.ALERTMANAGER.value
    PATH = "/api/v2/alerts"
    HOLD = timedelta(hours=24)
    RANKS_MAX_CHARS = 256
    SUBJECT_MAX_CHARS = 256

    def notify(self, alert: Alert, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        labels = self.labels(alert)
        body = [self.posted(alert, labels)]
        before = (previous or {}).get("labels")
        if before and before != labels:
            body.append({"labels": before, "startsAt": _rfc3339(alert.first_seen), "endsAt": _rfc3339(timezone.now())})
        _post_json(self.webhook.url.rstrip("/") + self.PATH, body, {"Idempotency-Key": idempotency_key})
        return {"labels": labels}

    def labels(self, alert: Alert) -> dict[str, str]:
        """Empty values are left out (an empty label is no label to Alertmanager): a run-wide alert has no ranks."""
        labels = {
            "alertname": alert.kind, "project": alert.run.project.name, "run": alert.run.key, "kind": alert.kind,
            "subject": alert.subject[:self.SUBJECT_MAX_CHARS], "severity": alert.severity,
            "ranks": rank_ranges(alert.ranks, self.RANKS_MAX_CHARS),
        }
        return {name: value for name, value in labels.items() if value}

    def posted(self, alert: Alert, labels: dict[str, str]) -> dict:
        resolved = alert.state == Alert.State.RESOLVED
        ends = (alert.resolved_at or timezone.now()) if resolved else alert.last_seen + self.HOLD
        annotations = {"summary": f"{alert.kind} in run {alert.run.key}", "description": alert.message,
                       "count": str(alert.count)}
        if alert.step is not None:
            annotations["step"] = str(alert.step)
        if alert.frame:
            annotations["frame"] = alert.frame
        out = {"labels": labels, "annotations": annotations, "startsAt": _rfc3339(alert.first_seen),
               "endsAt": _rfc3339(ends)}
        if url := _alert_url(alert):
            out["generatorURL"] = url
        return out


class PagerDuty(Transport):
    """PagerDuty Events API v2 (`POST /v2/enqueue`): trigger while firing (a later revision updates the
    same incident), resolve when resolved; `dedup_key` names the alert's identity, so it is the same
    across revisions, retries and the resolve."""

    kind = Webhook.Kind.PAGERDUTY.value
    EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
    SUMMARY_MAX_CHARS = 1024

    def notify(self, alert: Alert, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        body = self.event(alert)
        _post_json(self.webhook.url or self.EVENTS_URL, body, {})
        return {"dedup_key": body["dedup_key"]}

    def event(self, alert: Alert) -> dict:
        base = {"routing_key": self.webhook.secret, "dedup_key": dedup_key(alert)}
        if alert.state == Alert.State.RESOLVED:
            return {**base, "event_action": "resolve"}
        event = {**base, "event_action": "trigger", "client": "Lockstep", "payload": {
            "summary": f"{alert.kind} in run {alert.run.key}: {alert.message}"[:self.SUMMARY_MAX_CHARS],
            "severity": alert.severity if alert.severity in ("critical", "warning") else "error",
            "source": f"{alert.run.project.name}/{alert.run.key}"[:255],
            "class": alert.kind, "group": alert.run.key[:255],
            **({"component": alert.frame[:255]} if alert.frame else {}),
            "custom_details": alert.as_json(),
        }}
        if url := _alert_url(alert):
            event["client_url"] = url
            event["links"] = [{"href": url, "text": f"Lockstep run {alert.run.key}"}]
        return event


class JsonWebhook(Transport):
    """The alert itself as JSON, for receivers of one's own: `Idempotency-Key` names the revision (a
    receiver drops a retry it already took), and with a secret `X-Lockstep-Signature` is the
    HMAC-SHA256 of the exact body bytes."""

    kind = Webhook.Kind.JSON.value

    def notify(self, alert: Alert, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        raw = json.dumps(self.payload(alert)).encode()
        headers = {"Idempotency-Key": idempotency_key}
        if self.webhook.secret:
            headers["X-Lockstep-Signature"] = "sha256=" + signature(self.webhook.secret, raw)
        _post(self.webhook.url, raw, headers)
        return {}

    @staticmethod
    def payload(alert: Alert) -> dict:
        return {"project": alert.run.project.name, "revision": alert.revision, "url": _alert_url(alert) or None,
                "alert": alert.as_json()}


def signature(secret: str, raw: bytes) -> str:
    return hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def dedup_key(alert: Alert) -> str:
    """Stable for the alert's identity (project, run, kind, subject): every revision, retry and the resolve."""
    identity = "\0".join((alert.run.project.name, alert.run.key, alert.kind, alert.subject))
    return "lockstep-" + hashlib.blake2b(identity.encode(), digest_size=16).hexdigest()


def rank_ranges(ranks: list[int], limit: int) -> str:
    """Sorted ranks as ranges ("1,3,5-9"), cut at `limit` characters with the number left out, so a
    1024-rank desync is a short, stable label."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    text = ",".join(parts)
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(",", 1)[0]
    shown = sum(int(p.split("-")[-1]) - int(p.split("-")[0]) + 1 for p in cut.split(","))
    return f"{cut},+{len(ordered) - shown}"


def _rfc3339(at: datetime) -> str:
    return at.astimezone(tz.utc).isoformat().replace("+00:00", "Z")


def _run_url(alert: Alert) -> str:
    """A link back to the run's page; empty when the public URL is not configured (no broken links)."""
    return f"{settings.LOCKSTEP_PUBLIC_URL}/runs/{alert.run.key}/" if settings.LOCKSTEP_PUBLIC_URL else ""


def _alert_url(alert: Alert) -> str:
    """The alert on its run's page (server-rendered alerts carry `id="alert-N"`); empty without a public URL."""
    return f"{_run_url(alert)}#alert-{alert.id}" if settings.LOCKSTEP_PUBLIC_URL else ""


def _post_json(url: str, body: Any, headers: dict[str, str]) -> None:
    _post(url, json.dumps(body).encode(), headers)


def _post(url: str, raw: bytes, headers: dict[str, str]) -> None:
    """POST JSON bytes; a network error, a timeout or an error status is a `TransportError`."""
    request = urllib.request.Request(url, data=raw, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read()
    except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError/HTTPError/timeouts are OSErrors
        raise TransportError(str(exc)) from exc


def for_webhook(webhook: Webhook) -> Transport:
    """The transport that speaks this destination's format."""
    return TRANSPORTS[webhook.kind](webhook)
