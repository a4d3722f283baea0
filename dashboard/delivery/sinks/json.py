"""The incident itself as JSON, optionally signed, for receivers of one's own."""

from __future__ import annotations

import json
from typing import Any

from dashboard.delivery import transports
from dashboard.delivery.sinks.base import Sink
from dashboard.detection.models import Incident


class JsonWebhook(Sink):
    """The incident itself as JSON, for receivers of one's own: `Idempotency-Key` names the (incident,
    revision), so a receiver drops a retry it already took, and with a secret `X-Lockstep-Signature`
    is the HMAC-SHA256 of the exact body bytes."""

    kind = "json"
    label = "JSON webhook"
    needs_secret = "optional"

    def notify(
        self, incident: Incident, idempotency_key: str, previous: transports.Receipt | None = None
    ) -> transports.Receipt:
        raw = json.dumps(self.payload(incident)).encode()
        headers = {"Idempotency-Key": idempotency_key}
        if self.webhook.secret:
            headers["X-Lockstep-Signature"] = "sha256=" + transports.signature(self.webhook.secret, raw)
        transports.post(self.webhook.url, raw, headers)
        return {}

    @staticmethod
    def payload(incident: Incident) -> dict[str, Any]:
        return {
            "project": incident.run.project.name,
            "revision": incident.revision,
            "url": transports.incident_url(incident) or None,
            "incident": transports.bounded_json(incident),
        }
