"""A project's costliest frames over the last 7 and 30 days, from the runs' kept compile bills
(the run page's panel reads GET /api/v1/runs/KEY/cost; the compare page puts bills side by side)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard.detection import bills, cost, tasks
from dashboard.detection.models import RunCost
from dashboard.tenancy.auth import Principal
from dashboard.tenancy.models import Project, Rank, Run
from dashboard.web import services
from dashboard.web.pages.views import page

WINDOWS = (7, 30)
BILLS_PER_VIEW = 5  # runs of the window without a kept bill handed to the worker per view (newest first)

log = logging.getLogger(__name__)


def bill_missing(project: Project, days: int) -> int:
    """Have the worker bill the window's runs that have no kept bill yet (finished before any sweep
    saw them: an uploaded spool), at most BILLS_PER_VIEW per view; how many are still unbilled. The
    view itself writes nothing (`tasks.keep_bills`)."""
    since = timezone.now() - timedelta(days=days)
    missing = (
        Run.objects.filter(project=project, started_at__gte=since)
        .exclude(id__in=RunCost.objects.filter(run__project=project).values("run_id"))
        .order_by("-started_at")
    )
    left = missing.count()
    ids = list(missing.values_list("id", flat=True)[:BILLS_PER_VIEW])
    if ids:
        try:
            tasks.keep_bills.delay(ids)
        except Exception:  # the broker is down: a later view asks again
            log.warning("broker unavailable: %d runs left unbilled", len(ids), exc_info=True)
    return left


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
        windows.append(
            {
                "days": days,
                "frames": rows,
                "gpu_hours": round(sum(r["gpu_hours"] for r in rows), 4),
                "device": window_devices(project, days),
            }
        )
    # the summary's word: that of the widest window ("GPU" only where every billed run's ranks said CUDA)
    device = windows[-1]["device"] if windows else "GPU"
    return render(
        request,
        "dashboard/project_cost.html",
        {"project": project, "windows": windows, "price": price, "unbilled": unbilled, "device": device},
    )


def window_devices(project: Project, days: int) -> str:
    """What the seconds of the project's billed runs of the last `days` days are of (`cost.devices`):
    "GPU" only where every rank of every one of them said it computes on a CUDA device."""
    since = timezone.now() - timedelta(days=days)
    ranks = Rank.objects.filter(run__project=project, run__started_at__gte=since, run__compile_cost__isnull=False)
    return cost.devices_of(ranks)
