"""Alertmanager's v2 API: one alert per incident, refreshed while it fires, and the silences that mirror Lockstep's acks."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from django.utils import timezone

from dashboard.delivery import transports
from dashboard.delivery.sinks.base import Sink
from dashboard.detection.models import Incident


class Alertmanager(Sink):
    """Alertmanager's v2 API (`POST /api/v2/alerts`): one alert per incident, labelled `alertname` and
    `kind` (the root's kind), `project`, `run`, `incident` (its id), `severity`, `ranks` (the root's),
    so that routes, inhibitions and silences apply; `group_by: [project, run, incident]` keeps one
    notification per incident.

    Lockstep posts on change and re-sends a firing incident every `refresh` (`notifications.refresh`),
    so a firing one carries a short `endsAt` (HOLD): if Lockstep stops, Alertmanager resolves it
    within HOLD instead of holding a dead one for a day. A resolved one ends at its resolution. A
    label set that changed since the last send (re-rooted, escalated) is ended in the same request."""

    kind = "alertmanager"
    label = "Alertmanager (v2 API)"
    stateful = True
    refresh = timedelta(minutes=5)
    PATH = "/api/v2/alerts"
    SILENCES = "/api/v2/silences"
    HOLD = timedelta(minutes=15)

    def notify(
        self, incident: Incident, idempotency_key: str, previous: transports.Receipt | None = None
    ) -> transports.Receipt:
        labels = self.labels(incident)
        body = [self.posted(incident, labels)]
        before = (previous or {}).get("labels")
        if before and before != labels:
            body.append(
                {
                    "labels": before,
                    "startsAt": transports.rfc3339(incident.opened_at),
                    "endsAt": transports.rfc3339(timezone.now()),
                }
            )
        transports.post_json(self.url(self.PATH), body, {"Idempotency-Key": idempotency_key})
        return {"labels": labels}

    def url(self, path: str) -> str:
        return self.webhook.url.rstrip("/") + path

    @staticmethod
    def labels(incident: Incident) -> dict[str, str]:
        """Empty values are left out (an empty label is no label to Alertmanager): a run-wide root has no ranks."""
        root = transports.root_of(incident)
        labels = {
            "alertname": root.kind,
            "project": incident.run.project.name,
            "run": incident.run.key,
            "incident": str(incident.id),
            "kind": root.kind,
            "severity": incident.severity,
            "ranks": transports.rank_ranges(root.ranks, transports.SHORT_MAX_CHARS),
        }
        return {name: value[: transports.SHORT_MAX_CHARS] for name, value in labels.items() if value}

    def posted(self, incident: Incident, labels: dict[str, str]) -> dict[str, Any]:
        root, consequences = transports.root_of(incident), transports.consequences_of(incident)
        resolved = incident.state != Incident.State.FIRING  # fixed, or the run ended first
        ends = (incident.resolved_at or timezone.now()) if resolved else timezone.now() + self.HOLD
        annotations = {
            "summary": transports.headline(incident)[: transports.SHORT_MAX_CHARS],
            "description": root.message[: transports.TEXT_MAX_CHARS],
            "remedy": transports.remedy_line(incident),
            "count": str(sum(a.count for a in transports.members(incident))),
            "alerts": str(len(transports.members(incident))),
        }
        if consequences:
            annotations["consequences"] = transports.folded(consequences)
        if root.step is not None:
            annotations["step"] = str(root.step)
        if root.frame:
            annotations["frame"] = root.frame[: transports.SHORT_MAX_CHARS]
        if incident.acked_by is not None:
            annotations["acknowledged_by"] = incident.acked_by.get_username()[: transports.SHORT_MAX_CHARS]
        out = {
            "labels": labels,
            "annotations": annotations,
            "startsAt": transports.rfc3339(incident.opened_at),
            "endsAt": transports.rfc3339(max(ends, incident.opened_at)),
        }
        if url := transports.incident_url(incident):
            out["generatorURL"] = url
        return out

    def silence(self, incident: Incident, until: datetime, silence_id: str, comment: str) -> str:
        """Create (or extend) the silence of this incident until `until`; its id. An id Alertmanager no
        longer knows (expired, deleted by hand) is replaced by a new silence."""
        body = {
            "matchers": [
                {"name": "project", "value": incident.run.project.name, "isRegex": False, "isEqual": True},
                {"name": "incident", "value": str(incident.id), "isRegex": False, "isEqual": True},
            ],
            "startsAt": transports.rfc3339(timezone.now()),
            "endsAt": transports.rfc3339(until),
            "createdBy": "lockstep",
            "comment": comment[: transports.SHORT_MAX_CHARS],
        }
        try:
            answer = transports.request(
                "POST", self.url(self.SILENCES), {**body, "id": silence_id} if silence_id else body
            )
        except transports.TransportError as exc:
            # A refused id (Alertmanager answers 404 for one it no longer knows): a new silence then.
            # Never after an outage or a 5xx, where a new silence would double the one that exists.
            if not silence_id or exc.status is None or not 400 <= exc.status < 500:
                raise
            answer = transports.request("POST", self.url(self.SILENCES), body)
        try:
            return str(json.loads(answer)["silenceID"])
        except (ValueError, KeyError, TypeError) as exc:
            raise transports.TransportError(f"Alertmanager answered no silenceID: {answer[:200]!r}") from exc

    def unsilence(self, silence_id: str) -> None:
        """Expire the silence; one Alertmanager no longer has is gone already."""
        try:
            transports.request("DELETE", self.url(f"/api/v2/silence/{quote(silence_id, safe='')}"), None)
        except transports.TransportError as exc:
            if exc.status != 404:
                raise
