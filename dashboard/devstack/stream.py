"""The demo's alert stream (`manage.py up`): what it prints of the alerts it polls.

It prints from each alert's current state, not from the revisions it happened to see: an alert's
firing once per episode (not again when a revision only enriched it or added a rank), then its
resolve; a resolve whose firing it never printed (both happened between two looks) prints the
firing first, so no "resolved" line ever comes without its "firing" line before it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dashboard.detection.models import Alert

FIRING = Alert.State.FIRING.value  # any other state closed the episode (resolved, or ended unresolved)


@dataclass
class AlertStream:
    told: dict[int, str] = field(default_factory=dict)  # alert id -> the state last printed

    def known(self, alerts: Iterable[Alert]) -> None:
        """Alerts from before the stream started: told already, as they stand."""
        self.told.update({alert.id: alert.state for alert in alerts})

    def lines(self, alerts: Iterable[Alert]) -> list[str]:
        """The lines these alerts (the run preloaded) add to the stream, in order."""
        out = []
        for alert in alerts:
            told = self.told.get(alert.id)
            if alert.state == told:
                continue
            if told != FIRING:
                out.append(line(alert, FIRING))
            if alert.state != FIRING:
                out.append(line(alert, alert.state))
            self.told[alert.id] = alert.state
        return out


def line(alert: Alert, state: str) -> str:
    ranks = ",".join(map(str, alert.ranks)) or "-"
    why = f" ({alert.resolve_reason})" if state != FIRING and alert.resolve_reason else ""
    return f"ALERT {state:<8} {alert.kind:<31} run {alert.run.key} ranks {ranks}: {alert.message[:160]}{why}"
