"""Slack-compatible incoming webhooks: one message per incident revision, escaped and bounded."""

from __future__ import annotations

from typing import Any

from dashboard.delivery import transports
from dashboard.delivery.sinks.base import Sink
from dashboard.detection.models import Incident


class SlackWebhook(Sink):
    """Slack's incoming-webhook format (what "Slack-compatible" receivers accept): one message per
    incident revision, every text field escaped (`slack_escape`) and bounded."""

    kind = "slack"
    label = "Slack-compatible webhook"
    url_is_credential = True  # a Slack webhook URL's path is its key
    COLORS = {"critical": "#c62828", "warning": "#ef8f00"}

    def notify(
        self, incident: Incident, idempotency_key: str, previous: transports.Receipt | None = None
    ) -> transports.Receipt:
        transports.post_json(self.webhook.url, self.payload(incident, previous), {"Idempotency-Key": idempotency_key})
        return {}

    @classmethod
    def payload(cls, incident: Incident, previous: transports.Receipt | None = None) -> dict[str, Any]:
        root, consequences = transports.root_of(incident), transports.consequences_of(incident)
        fields = [
            {"title": "ranks", "value": transports.slack_escape(transports.ranks_text(root.ranks)), "short": True},
            {"title": "step", "value": str(root.step if root.step is not None else "-"), "short": True},
        ]
        if root.frame:
            fields.append(
                {
                    "title": "frame",
                    "value": transports.slack_escape(root.frame, transports.SHORT_MAX_CHARS),
                    "short": False,
                }
            )
        fields.append(
            {"title": "what to do", "value": transports.slack_escape(transports.remedy_line(incident)), "short": False}
        )
        if consequences:
            fields.append(
                {
                    "title": f"consequences ({len(consequences)})",
                    "value": transports.slack_escape(transports.folded(consequences)),
                    "short": False,
                }
            )
        return {
            "text": transports.slack_escape(
                f"{transports.status_word(incident)} {transports.update_note(incident, previous)}{transports.headline(incident)}"
            ),
            "attachments": [
                {
                    "color": "#2e7d32"
                    if incident.state == Incident.State.RESOLVED
                    else cls.COLORS.get(incident.severity, "#ef8f00"),
                    "title": transports.slack_escape(
                        f"{root.kind} · ranks {transports.ranks_text(root.ranks)} · {incident.run.key}",
                        transports.SHORT_MAX_CHARS,
                    ),
                    "title_link": transports.run_url(incident),
                    "text": transports.slack_escape(root.message),
                    "fields": fields,
                }
            ],
            "lockstep": {"incident": incident.id, "revision": incident.revision},
        }
