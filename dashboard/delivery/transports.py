"""Where an alert revision goes: one small class per kind of destination (healthchecks' transports).

A transport knows one receiver's wire format and nothing else: `notifications` decides what to
send, when, and records the outcome; a transport sends once and raises `TransportError` when the
receiver did not take it. Adding a sink (Alertmanager, PagerDuty, generic JSON) means adding one
`Transport` subclass with its own `kind`; subclasses register themselves in `TRANSPORTS`.
"""
from __future__ import annotations

import http.client
import json
import urllib.request
from typing import Any, ClassVar

from django.conf import settings

from dashboard.delivery.models import Webhook
from dashboard.detection.models import Alert

TIMEOUT_S = 5.0
TRANSPORTS: dict[str, type[Transport]] = {}  # kind -> class, filled by Transport.__init_subclass__


class TransportError(Exception):
    """The receiver did not take the notification; the text is kept as `Notification.last_error`."""


class Transport:
    """Sends an alert revision to one webhook. `notify` raises `TransportError`, returns None on success."""

    kind: ClassVar[str]

    def __init__(self, webhook: Webhook) -> None:
        self.webhook = webhook

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register by `kind`, so a new sink is one class and cannot silently shadow another."""
        super().__init_subclass__(**kwargs)
        if cls.kind in TRANSPORTS:
            raise TypeError(f"transport kind {cls.kind!r} is taken by {TRANSPORTS[cls.kind].__name__}")
        TRANSPORTS[cls.kind] = cls

    def notify(self, alert: Alert, idempotency_key: str) -> None:
        """Send the alert as it is now; `idempotency_key` names the revision, the same on every retry."""
        raise NotImplementedError


class SlackWebhook(Transport):
    """Slack's incoming-webhook format; what "Slack-compatible" receivers accept."""

    kind = "slack"

    def notify(self, alert: Alert, idempotency_key: str) -> None:
        _post_json(self.webhook.url, self.payload(alert), {"Idempotency-Key": idempotency_key})

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


def _run_url(alert: Alert) -> str:
    """A link back to the run's page; empty when the public URL is not configured (no broken links)."""
    return f"{settings.LOCKSTEP_PUBLIC_URL}/runs/{alert.run.key}/" if settings.LOCKSTEP_PUBLIC_URL else ""


def _post_json(url: str, body: dict, headers: dict[str, str]) -> None:
    """POST `body` as JSON; a network error, a timeout or an error status is a `TransportError`."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read()
    except (OSError, http.client.HTTPException) as exc:  # URLError/HTTPError/timeouts are OSErrors
        raise TransportError(str(exc)) from exc


def for_webhook(webhook: Webhook) -> Transport:
    """The transport that speaks this webhook's format.

    Every Webhook row is Slack-compatible today (the table has no kind column); a second sink adds
    that column and looks its value up in `TRANSPORTS` here.
    """
    return TRANSPORTS[SlackWebhook.kind](webhook)

