"""The alert reference that every remedy points at (`docs/alerts.md#kind`), served by the dashboard
itself: each registered kind with what its rule looks for (the rule module's own docstring) and what
to do first (`remedies.INCIDENT_REMEDIES`). Built from the code, so the link works in every install,
the wheel's included, and never names a kind the server does not raise."""

from __future__ import annotations

import sys

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.detection.remedies import INCIDENT_REMEDIES
from dashboard.detection.rules import REGISTRY


def entries() -> list[dict[str, str]]:
    """One entry per alert kind, in name order: its anchor, what it means, what to do."""
    about: dict[str, str] = {}
    for rule in REGISTRY:
        doc = sys.modules[rule.check.__module__].__doc__ or ""
        about.setdefault(rule.kind, doc.strip())
    return [{"kind": kind, "about": about[kind], "remedy": INCIDENT_REMEDIES.get(kind, "")} for kind in sorted(about)]


@login_required
def alert_reference(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/alert_reference.html", {"entries": entries()})
