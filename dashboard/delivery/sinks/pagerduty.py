"""PagerDuty Events API v2: one PagerDuty incident per Lockstep incident, from trigger to resolve."""

from __future__ import annotations

from typing import Any

from dashboard.delivery import transports
from dashboard.delivery.sinks.base import Sink
from dashboard.detection.models import Incident


class PagerDuty(Sink):
    """PagerDuty Events API v2 (`POST /v2/enqueue`), `dedup_key` "lockstep-incident-<id>": the same from
    the trigger through every update, retry, acknowledge and the resolve. Firing: trigger (a later
    revision updates the same PagerDuty incident); acknowledged in Lockstep: acknowledge; resolved:
    resolve."""

    kind = "pagerduty"
    label = "PagerDuty Events v2"
    needs_url = "optional"
    needs_secret = "required"
    secret_missing = "PagerDuty needs the integration's routing key"
    default_url = "https://events.pagerduty.com/v2/enqueue"
    stateful = True
    SUMMARY_MAX_CHARS = 1024

    def notify(
        self, incident: Incident, idempotency_key: str, previous: transports.Receipt | None = None
    ) -> transports.Receipt:
        url = self.webhook.url or self.default_url
        key = transports.dedup_key(incident)
        base = {"routing_key": self.webhook.secret, "dedup_key": key}
        if incident.state != Incident.State.FIRING:  # fixed, or the run ended: nothing left to page about
            transports.post_json(url, {**base, "event_action": "resolve"}, {})
            return {"dedup_key": key, "action": "resolve"}
        if incident.acked_by_id is None or (previous or {}).get("action") not in ("trigger", "acknowledge"):
            transports.post_json(url, self.trigger(incident, base), {})  # an acknowledge needs an incident to act on
        if incident.acked_by_id is None:
            return {"dedup_key": key, "action": "trigger"}
        transports.post_json(url, {**base, "event_action": "acknowledge"}, {})
        return {"dedup_key": key, "action": "acknowledge"}

    def trigger(self, incident: Incident, base: dict[str, Any]) -> dict[str, Any]:
        root = transports.root_of(incident)
        event = {
            **base,
            "event_action": "trigger",
            "client": "Lockstep",
            "payload": {
                "summary": transports.headline(incident)[: self.SUMMARY_MAX_CHARS],
                "severity": incident.severity if incident.severity in ("critical", "warning") else "error",
                "source": f"{incident.run.project.name}/{incident.run.key}"[:255],
                "class": root.kind[:255],
                "group": incident.run.key[:255],
                **({"component": root.frame[:255]} if root.frame else {}),
                "custom_details": transports.bounded_json(incident),
            },
        }
        if url := transports.incident_url(incident):
            event["client_url"] = url
            event["links"] = [{"href": url, "text": f"Lockstep run {incident.run.key}"[: transports.SHORT_MAX_CHARS]}]
        return event
