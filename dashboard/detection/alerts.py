"""Findings become alerts: one alert per (run, kind, subject), however many slots report it."""
from __future__ import annotations

from django.db import transaction

from dashboard.detection.rules import Finding
from dashboard.models import Alert
from ingest.models import Run


def record(run: Run, finding: Finding) -> tuple[Alert, bool]:
    """Create or update the alert for this finding; True when it is news (new, or new ranks)."""
    alert, created = Alert.objects.select_for_update().get_or_create(
        run=run,
        kind=finding.kind,
        subject=finding.subject,
        defaults={
            "severity": finding.severity,
            "ranks": list(finding.ranks),
            "step": finding.step,
            "frame": finding.frame,
            "message": finding.message,
            "details": finding.details,
        },
    )
    if created:
        return alert, True
    new_ranks = set(finding.ranks) - set(alert.ranks)
    alert.count += 1
    alert.ranks = sorted(set(alert.ranks) | new_ranks)
    if finding.step is not None and (alert.step is None or finding.step < alert.step):
        alert.step, alert.message, alert.details = finding.step, finding.message, finding.details
    reopened = alert.state == Alert.State.RESOLVED
    alert.state = Alert.State.FIRING
    alert.save()
    return alert, bool(new_ranks) or reopened


def record_all(run: Run, findings: list[Finding]) -> list[Alert]:
    """Record findings inside the caller's transaction; returns alerts to notify after commit."""
    assert transaction.get_connection().in_atomic_block
    return [alert for alert, news in (record(run, f) for f in findings) if news]
