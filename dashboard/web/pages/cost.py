"""A project's costliest frames over the last 7 and 30 days, from the runs' kept compile bills
(the run page's panel reads GET /api/v1/runs/KEY/cost; the compare page puts bills side by side)."""

from __future__ import annotations

from datetime import timedelta

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard.detection import bills
from dashboard.detection.models import RunCost
from dashboard.tenancy.auth import Principal
from dashboard.tenancy.models import Project, Run
from dashboard.web import services
from dashboard.web.pages.views import page

WINDOWS = (7, 30)
BILLS_PER_VIEW = (
    5  # runs of the window without a kept bill, billed by one page view (newest first): a big run takes a second
)


def bill_missing(project: Project, days: int) -> int:
    """Bill the window's runs that have no kept bill yet (finished before any sweep saw them: an
    uploaded spool), at most BILLS_PER_VIEW per view; how many are still left."""
    since = timezone.now() - timedelta(days=days)
    missing = (
        Run.objects.filter(project=project, started_at__gte=since)
        .exclude(id__in=RunCost.objects.filter(run__project=project).values("run_id"))
        .order_by("-started_at")
    )
    left = missing.count()
    for run in missing.select_related("project")[:BILLS_PER_VIEW]:
        bills.fresh_bill(run)
    return max(0, left - BILLS_PER_VIEW)


@page
def project_cost(request: HttpRequest, caller: Principal, name: str) -> HttpResponse:
    project = services.project_for(caller, name)
    unbilled = bill_missing(project, max(WINDOWS))
    price = float(project.gpu_hour_price) if project.gpu_hour_price is not None else None
    windows = []
    for days in WINDOWS:
        rows = bills.top_frames(project.id, days)
        for row in rows:
            row["money"] = round(row["gpu_hours"] * price, 2) if price is not None else None
        windows.append({"days": days, "frames": rows, "gpu_hours": round(sum(r["gpu_hours"] for r in rows), 4)})
    return render(
        request,
        "dashboard/project_cost.html",
        {"project": project, "windows": windows, "price": price, "unbilled": unbilled},
    )
