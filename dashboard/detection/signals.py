"""What detection announces: alerts that changed and should be told (delivery subscribes)."""

from __future__ import annotations

from django.dispatch import Signal

alerts_changed = Signal()  # alert_ids: list[int], each with a revision ahead of what was delivered


def announce(alert_ids: list[int]) -> None:
    if alert_ids:
        alerts_changed.send(sender=None, alert_ids=list(dict.fromkeys(alert_ids)))
