"""HTML pages: the session door over `dashboard.web.services`.

Every view gets the caller (the logged-in user with their projects) and resolves runs, alerts
and silences through the services, so pages and the API share one visibility rule. A `Refusal`
about something the caller cannot see is a 404 (pages do not confirm that it exists); refusals
with what the user typed come back as a message on the page the form was on. Aggregation
happens in SQL (timeline.py, compare.py, frames.py) and user text reaches the browser only
through Django's autoescaping or JSON read with textContent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db.models import Count, Model, Q, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from dashboard.detection import cost, silences, sweep_clock
from dashboard.detection.models import Alert, Baseline
from dashboard.detection.verdict import VERDICTS
from dashboard.evidence import reads
from dashboard.evidence.models import CompileEvent, GraphBreakEvent, StepReport
from dashboard.tenancy import access
from dashboard.tenancy.auth import Principal
from dashboard.tenancy.models import RUN_STATUSES, Project, Run
from dashboard.web import services
from dashboard.web.forms import SilenceForm
from dashboard.web.pages import alerting, frames
from dashboard.web.pages import compare as comparing
from dashboard.web.pages.links import run_links
from dashboard.web.paging import Page, alerts_page, ranks_page
from ingest.refusals import Refusal

if TYPE_CHECKING:
    from dashboard.web.services import ListedRun

ALERTS_ON_RUN_PAGE = 100
RUNS_LISTED = 200
BASELINE_REFUSED = "Choose another run of the same project as the baseline."

View = Callable[..., HttpResponse]
Rows = TypeVar("Rows")
M = TypeVar("M", bound=Model)


def page(view: View) -> View:
    """Login required; the view gets the caller. A 403/404 Refusal is a 404 page."""

    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        try:
            assert isinstance(request.user, User)  # login_required let only a logged-in user through
            return view(request, access.principal_for(request.user), *args, **kwargs)
        except Refusal as refusal:
            if refusal.status not in (403, 404):
                raise
            raise Http404(refusal.message) from None

    return wrapper


# --- runs --------------------------------------------------------------------------------


def _filtered(runs: QuerySet[ListedRun], params: Mapping[str, str]) -> QuerySet[ListedRun]:
    """Runs list filters: text, project, torch version and health (on `runs_list` annotations);
    status is `runs_list`'s own filter, shared with the API."""
    q, project, torch, health = (params.get(k, "").strip() for k in ("q", "project", "torch", "health"))
    if q:
        runs = runs.filter(Q(key__icontains=q) | Q(name__icontains=q))
    if project:
        runs = runs.filter(project__name=project)
    if torch:
        runs = runs.filter(torch_version__startswith=torch)
    if health == "critical":
        runs = runs.filter(critical__gt=0)
    elif health == "warning":
        runs = runs.filter(critical=0, warning__gt=0)
    elif health == "ok":
        runs = runs.filter(critical=0, warning=0)
    return runs


@page
def runs(request: HttpRequest, caller: Principal) -> HttpResponse:
    """An unknown status is a 400 whose message sits above the filters, so the user can choose again."""
    context = {
        "projects": Project.objects.filter(id__in=caller.project_ids).order_by("name"),
        "filters": request.GET,
        "statuses": RUN_STATUSES,
        "verdicts": [(v, v.replace("_", " ")) for v in VERDICTS],
    }
    try:
        listed = services.runs_list(
            caller, request.GET.get("status", "").strip(), request.GET.get("verdict", "").strip()
        )
    except Refusal as refusal:
        messages.error(request, refusal.message)
        return render(request, "dashboard/runs.html", {**context, "runs": []}, status=400)
    shown = list(_filtered(listed, request.GET)[:RUNS_LISTED])
    verdicts = services.verdicts(shown)
    for row in shown:
        row.verdict = verdicts[row.id]  # type: ignore[attr-defined]  # for the template only
    return render(request, "dashboard/runs.html", {**context, "runs": shown})


def most_breaks_of_a_rank(run: Run) -> int:
    """The distinct graph breaks (frame and reason) of the rank that broke most: what the frame pages
    list, added up over the frames (every rank breaks alike, so a sum over ranks said 10 beside
    frames of 3 and 4, and a frame that recompiles breaks again at the same site). Only that rank's
    reasons are compared, not every rank's."""
    most = GraphBreakEvent.objects.filter(run=run).values("rank").annotate(n=Count("id")).order_by("-n", "rank")
    breaks = GraphBreakEvent.objects.filter(run=run, rank=Subquery(most.values("rank")[:1]))
    return breaks.order_by().values("frame", "reason").distinct().count()


def run_headline_counts(run: Run) -> dict[str, Any]:
    """The run page's headline counts (compiles, recompiles, failures, graph breaks, frames, grad
    slots and those with dissent), one aggregate query per table."""
    compiles = CompileEvent.objects.filter(run=run).aggregate(
        compiles=Count("id"),
        recompiles=Count("id", filter=Q(index__gt=0)),
        failures=Count("id", filter=~Q(status="ok")),
    )
    slots = run.gradslot_set.aggregate(grad_slots=Count("id"), dissenting_slots=Count("id", filter=~Q(dissenters=[])))
    return {
        **compiles,
        **slots,
        "graph_breaks": most_breaks_of_a_rank(run),
        "frames": run.compileslot_set.values("frame").distinct().count(),
    }


@page
def run(request: HttpRequest, caller: Principal, key: str) -> HttpResponse:
    found = services.run_with_alert_counts(caller, key)  # annotated: the status badge costs no query
    frames_with_dissent = (
        found.compileslot_set.exclude(dissenters=[]).values_list("frame", flat=True).distinct().order_by("frame")[:50]
    )
    alerts = list(found.alerts.select_related("acked_by", "run")[:ALERTS_ON_RUN_PAGE])
    over = is_over(found)
    return render(
        request,
        "dashboard/run.html",
        {
            "run": found,
            "verdict": services.verdicts([found])[found.id],
            "over": over,
            "sweep_stopped": None if over else sweep_stopped(),
            "flight": flight_recorder_view(alerts),
            "ranks": _shown(ranks_page, found, request.GET.get("page")),
            "alerts": alerts,
            "incidents": services.run_incidents(caller, key)[:ALERTS_ON_RUN_PAGE],
            "summary": run_headline_counts(found),
            "device": cost.devices(found),  # what the compile bill's seconds are of: GPU, or device on CPUs
            "notices": reads.agent_notices(found.id),
            "links": run_links(found),
            "frames": found.compileslot_set.values_list("frame", flat=True).distinct().order_by("frame")[:200],
            "dissent_frames": set(frames_with_dissent),
            "baseline": Baseline.objects.select_related("baseline").filter(run=found).first(),
            "baseline_choices": services.baseline_candidates(caller, found)
            .order_by("-started_at")
            .values_list("key", flat=True)[:50],
        },
    )


def _shown(paging: Callable[[Rows, str | None], Page[M]], rows: Rows, page: str | None) -> Page[M]:
    """The page of `rows` a table shows (`paging`'s); a page that is not a number is a 404 page."""
    try:
        return paging(rows, page)
    except Refusal as refusal:
        raise Http404(refusal.message) from None


def _page_link(request: HttpRequest, number: int | None) -> str | None:
    """The query of this page at page `number`, its filters kept (None: no such page)."""
    if number is None:
        return None
    query = request.GET.copy()
    query["page"] = str(number)
    return f"?{query.urlencode()}"


def is_over(run: ListedRun) -> bool:
    """Nothing live to show: every rank ended or was lost, or the whole run has said nothing for
    LOCKSTEP_SILENT_AFTER (its launcher killed it; nobody said goodbye). `run` from `runs_list`."""
    quiet = timezone.now() - run.last_seen >= timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER)
    return run.ended >= run.world_size or quiet


def sweep_stopped() -> str | None:
    """Why a live run's page may be missing alerts: the periodic sweep stopped (`sweep_clock`)."""
    seconds = sweep_clock.stale()
    if seconds is None:
        return None
    when = "ever" if math.isinf(seconds) else f"in the last {seconds:.0f} s"
    return (
        f"No sweep completed {when}: overdue slots are not settled, silent ranks not alerted and due webhooks"
        " not re-sent. Is a Celery worker with beat running (celery -A dashboard worker -B)?"
    )


def flight_recorder_view(alerts: Iterable[Alert]) -> dict[str, Any] | None:
    """The newest hang_forecast's Flight Recorder summary as table rows (rank order), or None."""
    for alert in alerts:
        fr = (alert.details or {}).get("flight_recorder") if alert.kind == "hang_forecast" else None
        if fr:
            ranks = fr.get("ranks") or {}
            compiles = fr.get("compiles") or {}
            missing = set((fr.get("mismatch") or {}).get("missing_ranks") or [])
            rows = [
                {"rank": int(r), **facts, "compiles": compiles.get(r) or {}, "missing": int(r) in missing}
                for r, facts in sorted(ranks.items(), key=lambda kv: int(kv[0]))
            ]
            return {"alert": alert, "summary": fr, "rows": rows}
    return None


@page
@require_POST
def run_baseline(request: HttpRequest, caller: Principal, key: str) -> HttpResponse:
    """Choose the run this one is compared with step by step (baseline_divergence)."""
    found = services.run_for(caller, key)
    try:
        link = services.choose_baseline(caller, found, request.POST.get("baseline", ""))
    except Refusal:
        messages.error(request, BASELINE_REFUSED)
    else:
        messages.success(
            request, f"{link.baseline.key} is now the baseline of {found.key}; differences show up as alerts."
        )
    return redirect("run", key=found.key)


@page
def rank(request: HttpRequest, caller: Principal, key: str, rank: int) -> HttpResponse:
    found = services.run_for(caller, key)
    rank_row = get_object_or_404(found.ranks, rank=rank)
    return render(
        request,
        "dashboard/rank.html",
        {
            "run": found,
            "rank": rank_row,
            "versions": comparing.flat_info(rank_row.info),
            "compiles": CompileEvent.objects.filter(run=found, rank=rank).order_by("-ts")[:200],
            "breaks": GraphBreakEvent.objects.filter(run=found, rank=rank).order_by("-ts")[:100],
            "steps": StepReport.objects.filter(run=found, rank=rank).order_by("-step")[:50],
            "alerts": alerting.involving_rank(found.alerts.select_related("acked_by", "run"), rank)[:100],
        },
    )


@page
def frame(request: HttpRequest, caller: Principal, key: str) -> HttpResponse:
    found = services.run_for(caller, key)
    index = request.GET.get("i")
    view = frames.frame_view(found, request.GET.get("f", ""), int(index) if index and index.isdigit() else None)
    if not view["slots"] and not view["reasons"] and not view["breaks"]:
        raise Http404("no such frame in this run")
    return render(request, "dashboard/frame.html", {"run": found, **view})


# --- alerts ------------------------------------------------------------------------------


@page
def alerts(request: HttpRequest, caller: Principal) -> HttpResponse:
    filters = {k: request.GET.get(k, "") for k in ("run", "kind", "severity", "state", "acked")}
    filters["state"] = filters["state"] or alerting.UNRESOLVED  # what `lockstep check` fails on, after the run too
    active = list(alerting.active_silences(caller))
    shown = _shown(alerts_page, alerting.alerts_for(caller, filters), request.GET.get("page"))
    listed = list(shown.rows)
    webhooks = services.webhook_deliveries(listed)
    rows = [(a, silences.first_covering(a, active), webhooks.get(a.id, {}).get("failed", 0)) for a in listed]
    return render(
        request,
        "dashboard/alerts.html",
        {
            "incidents": services.visible_incidents(caller, filters["run"], filters["state"]),
            "rows": rows,
            "shown": shown,
            "previous_page": _page_link(request, shown.previous),
            "next_page": _page_link(request, shown.next),
            "filters": filters,
            "silences": active,
            "kinds": alerting.kinds_of(caller),
            "form": SilenceForm(initial={"run": filters["run"], "kind": filters["kind"]}),
            "projects": Project.objects.filter(id__in=caller.project_ids).order_by("name"),
        },
    )


def _back(request: HttpRequest) -> HttpResponse:
    """Return to the page the form was on (same-site paths only)."""
    target = request.POST.get("next", "")
    return redirect(target if target.startswith("/") and not target.startswith("//") else reverse("alerts"))


def _button(act: Callable[[Principal, int], object]) -> View:
    """A row's button (ack, unack): `act` on the caller's row by its id, then back to the page."""

    @page
    @require_POST
    def view(request: HttpRequest, caller: Principal, **row_id: int) -> HttpResponse:
        (only,) = row_id.values()
        act(caller, only)
        return _back(request)

    return view


alert_ack = _button(services.acknowledge)
incident_ack = _button(services.acknowledge_incident)
alert_unack = _button(services.unacknowledge)


@page
@require_POST
def silence_create(request: HttpRequest, caller: Principal) -> HttpResponse:
    form = SilenceForm(request.POST)
    if not form.is_valid():
        messages.error(
            request,
            "Silence not created: " + "; ".join(f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items()),
        )
        return _back(request)
    try:
        services.create_silence(caller, form.cleaned_data)
    except Refusal as refusal:
        messages.error(request, f"Silence not created: {refusal.message}")
    else:
        messages.success(request, "Silence created.")
    return _back(request)


@page
@require_POST
def silence_expire(request: HttpRequest, caller: Principal, silence_id: int) -> HttpResponse:
    services.expire_silence(caller, silence_id)
    return _back(request)


# --- compare -----------------------------------------------------------------------------


def _compared_runs(request: HttpRequest, caller: Principal) -> list[Run]:
    """From `?runs=a,b` (links) or `?run=a&run=b` (the runs list checkboxes)."""
    keys = [k for k in request.GET.get("runs", "").split(",") if k] or request.GET.getlist("run")
    return services.runs_for(caller, keys[: services.MAX_COMPARED])


@page
def compare(request: HttpRequest, caller: Principal) -> HttpResponse:
    chosen = _compared_runs(request, caller)
    if len(chosen) < 2:
        return render(
            request,
            "dashboard/compare.html",
            {"choose": True, "runs": caller.runs().order_by("-started_at")[:RUNS_LISTED], "chosen": chosen},
        )
    body = comparing.compare(chosen, services.compare_tolerance(request.GET.get("tol")))
    fields = ("compile_time_s", "graphs", "compiles", "recompiles", "graph_breaks", "cache_hit_rate", "failures")
    summary_rows = [(f, [s[f] for s in body["compile_summary"]]) for f in fields]
    return render(
        request,
        "dashboard/compare.html",
        {
            "choose": False,
            "chosen": chosen,
            "body": body,
            "summary_rows": summary_rows,
            "keys": ",".join(r.key for r in chosen),
            "fp": zip(chosen[1:], body["fingerprints"]),
            "curves": body["step_times"],
            "drift": body["drift"],
            "drift_vs": zip(chosen[1:], body["drift"]["vs"]),
            "tol": request.GET.get("tol") or body["drift"]["tolerance"],
        },
    )


@page
def compare_frame(request: HttpRequest, caller: Principal) -> HttpResponse:
    chosen = _compared_runs(request, caller)
    if len(chosen) < 2:
        raise Http404("choose two runs")
    base, other = chosen[0], chosen[1]
    key = request.GET.get("frame", "")
    return render(
        request,
        "dashboard/compare_frame.html",
        {
            "base": base,
            "other": other,
            "key": key,
            "diff": frames.cross_run_diff(base, other, key),
            "labels": [comparing.torch_label(comparing.run_environment(r)) for r in (base, other)],
            "keys": ",".join(r.key for r in chosen),
        },
    )
