"""HTML pages: the runs list and a run page whose alert feed updates live over the websocket."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from dashboard.api import with_alert_counts
from ingest.auth import user_project_ids
from ingest.models import Run


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    visible = Run.objects.filter(project_id__in=user_project_ids(request.user)).select_related("project")
    return render(request, "dashboard/runs.html", {"runs": with_alert_counts(visible).order_by("-started_at")[:200]})


@login_required
def run(request: HttpRequest, key: str) -> HttpResponse:
    found = get_object_or_404(Run.objects.select_related("project"), key=key)
    if found.project_id not in user_project_ids(request.user):
        raise Http404("no such run")
    context = {
        "run": found,
        "ranks": found.ranks.all(),
        "alerts": found.alerts.select_related("acked_by", "run"),
    }
    return render(request, "dashboard/run.html", context)
