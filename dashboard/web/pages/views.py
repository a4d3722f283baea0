"""HTML pages. Every query is scoped to the user's projects (access.py); aggregation happens in
SQL (timeline.py, compare.py, frames.py) and user text reaches the browser only through Django's
autoescaping or JSON read with textContent."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, F, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.web.api import with_alert_counts
from dashboard.detection import tasks as detection_tasks
from dashboard.detection.models import Alert, Baseline, Silence
from dashboard.web.pages import alerting, compare as comparing, frames
from dashboard.tenancy.access import visible_run, visible_runs
from dashboard.tenancy.auth import user_project_ids
from dashboard.tenancy.models import Project
from ingest.models import CompileEvent, GraphBreakEvent, StepReport

ALERTS_ON_RUN_PAGE = 100


def _run_filters(request: HttpRequest):
    """Runs list filters: text, project, torch version, status and health."""
    qs = with_alert_counts(visible_runs(request).select_related("project"))
    q, project, torch, status, health = (request.GET.get(k, "").strip() for k in ("q", "project", "torch", "status", "health"))
    if q:
        qs = qs.filter(Q(key__icontains=q) | Q(name__icontains=q))
    if project:
        qs = qs.filter(project__name=project)
    if torch:
        qs = qs.filter(torch_version__startswith=torch)
    if status == "finished":
        qs = qs.filter(ended__gte=F("world_size"))
    elif status == "running":
        qs = qs.filter(ended__lt=F("world_size"))
    if health == "critical":
        qs = qs.filter(critical__gt=0)
    elif health == "warning":
        qs = qs.filter(critical=0, warning__gt=0)
    elif health == "ok":
        qs = qs.filter(critical=0, warning=0)
    return qs


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    projects = Project.objects.filter(id__in=user_project_ids(request.user)).order_by("name")
    return render(request, "dashboard/runs.html", {
        "runs": _run_filters(request).order_by("-started_at")[:200],
        "projects": projects,
        "filters": request.GET,
    })


def run_summary(run) -> dict:
    """Headline counts, one aggregate query per table."""
    compiles = CompileEvent.objects.filter(run=run).aggregate(
        compiles=Count("id"), recompiles=Count("id", filter=Q(index__gt=0)), failures=Count("id", filter=~Q(status="ok")))
    slots = run.gradslot_set.aggregate(grad_slots=Count("id"), dissenting_slots=Count("id", filter=~Q(dissenters=[])))
    return {
        **compiles, **slots,
        "graph_breaks": GraphBreakEvent.objects.filter(run=run).count(),
        "frames": run.compileslot_set.values("frame").distinct().count(),
    }


@login_required
def run(request: HttpRequest, key: str) -> HttpResponse:
    found = visible_run(request, key)
    frames_with_dissent = (found.compileslot_set.exclude(dissenters=[]).values_list("frame", flat=True)
                           .distinct().order_by("frame")[:50])
    context = {
        "run": found,
        "ranks": found.ranks.values("rank", "host", "status", "last_step", "last_seen"),  # not `info`: 1024 JSON docs
        "alerts": found.alerts.select_related("acked_by", "run")[:ALERTS_ON_RUN_PAGE],
        "summary": run_summary(found),
        "frames": found.compileslot_set.values_list("frame", flat=True).distinct().order_by("frame")[:200],
        "dissent_frames": set(frames_with_dissent),
        "baseline": Baseline.objects.select_related("baseline").filter(run=found).first(),
        "baseline_choices": visible_runs(request).filter(project=found.project).exclude(id=found.id)
        .order_by("-started_at").values_list("key", flat=True)[:50],
    }
    return render(request, "dashboard/run.html", context)


@login_required
@require_POST
def run_baseline(request: HttpRequest, key: str) -> HttpResponse:
    """Choose the run this one is compared with step by step (baseline_divergence)."""
    found = visible_run(request, key)
    base = visible_runs(request).filter(key=request.POST.get("baseline", ""), project=found.project).first()
    if base is None or base.id == found.id:
        messages.error(request, "Choose another run of the same project as the baseline.")
    else:
        detection_tasks.choose_baseline(found, base, request.user)
        messages.success(request, f"{base.key} is now the baseline of {found.key}; differences show up as alerts.")
    return redirect("run", key=found.key)


@login_required
def rank(request: HttpRequest, key: str, rank: int) -> HttpResponse:
    found = visible_run(request, key)
    rank_row = get_object_or_404(found.ranks, rank=rank)
    compiles = CompileEvent.objects.filter(run=found, rank=rank).order_by("-ts")[:200]
    steps = StepReport.objects.filter(run=found, rank=rank).order_by("-step")[:50]
    alerts = alerting.involving_rank(found.alerts.select_related("acked_by", "run"), rank)[:100]
    return render(request, "dashboard/rank.html", {
        "run": found, "rank": rank_row, "versions": comparing.flat_info(rank_row.info),
        "compiles": compiles, "breaks": GraphBreakEvent.objects.filter(run=found, rank=rank).order_by("-ts")[:100],
        "steps": steps, "alerts": alerts,
    })


@login_required
def frame(request: HttpRequest, key: str) -> HttpResponse:
    found = visible_run(request, key)
    name = request.GET.get("f", "")
    index = request.GET.get("i")
    view = frames.frame_view(found, name, int(index) if index and index.isdigit() else None)
    if not view["slots"] and not view["reasons"] and not view["breaks"]:
        raise Http404("no such frame in this run")
    return render(request, "dashboard/frame.html", {"run": found, **view})


# --- alerts ------------------------------------------------------------------------------

@login_required
def alerts(request: HttpRequest) -> HttpResponse:
    project_ids = user_project_ids(request.user)
    filters = {k: request.GET.get(k, "") for k in ("run", "kind", "severity", "state", "acked")}
    filters["state"] = filters["state"] or "firing"
    silences = list(alerting.active_silences(project_ids))
    rows = [(a, alerting.silenced_by(a, silences)) for a in alerting.alerts_for(project_ids, filters)[:500]]
    return render(request, "dashboard/alerts.html", {
        "rows": rows, "filters": filters, "silences": silences, "kinds": alerting.kinds_of(project_ids),
        "form": alerting.SilenceForm(initial={"run": filters["run"], "kind": filters["kind"]}),
        "projects": Project.objects.filter(id__in=project_ids).order_by("name"),
    })


def _back(request: HttpRequest) -> HttpResponse:
    """Return to the page the form was on (same-site paths only)."""
    target = request.POST.get("next", "")
    return redirect(target if target.startswith("/") and not target.startswith("//") else reverse("alerts"))


def _alert_of(request: HttpRequest, alert_id: int) -> Alert:
    return get_object_or_404(Alert.objects.select_related("run"), id=alert_id,
                             run__project_id__in=user_project_ids(request.user))


@login_required
@require_POST
def alert_ack(request: HttpRequest, alert_id: int) -> HttpResponse:
    alerting.acknowledge(_alert_of(request, alert_id), request.user)
    return _back(request)


@login_required
@require_POST
def alert_unack(request: HttpRequest, alert_id: int) -> HttpResponse:
    alerting.unacknowledge(_alert_of(request, alert_id))
    return _back(request)


@login_required
@require_POST
def silence_create(request: HttpRequest) -> HttpResponse:
    form = alerting.SilenceForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Silence not created: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
        return _back(request)
    made = alerting.create_silence(form.cleaned_data, request.user, user_project_ids(request.user))
    if isinstance(made, str):
        messages.error(request, f"Silence not created: {made}")
    else:
        messages.success(request, "Silence created.")
    return _back(request)


@login_required
@require_POST
def silence_expire(request: HttpRequest, silence_id: int) -> HttpResponse:
    silence = get_object_or_404(Silence, id=silence_id, project_id__in=user_project_ids(request.user))
    alerting.expire_silence(silence)
    return _back(request)


# --- compare -----------------------------------------------------------------------------

def _compared_runs(request: HttpRequest) -> list:
    keys = [k for k in request.GET.get("runs", "").split(",") if k][:8]
    if not keys:
        keys = request.GET.getlist("run")[:8]
    return [visible_run(request, k) for k in dict.fromkeys(keys)]


@login_required
def compare(request: HttpRequest) -> HttpResponse:
    chosen = _compared_runs(request)
    if len(chosen) < 2:
        return render(request, "dashboard/compare.html", {
            "choose": True, "runs": visible_runs(request).order_by("-started_at")[:200], "chosen": chosen})
    body = comparing.compare(chosen)
    fields = ("compile_time_s", "graphs", "compiles", "recompiles", "graph_breaks", "cache_hit_rate", "failures")
    summary_rows = [(f, [s[f] for s in body["compile_summary"]]) for f in fields]
    return render(request, "dashboard/compare.html", {
        "choose": False, "chosen": chosen, "body": body, "summary_rows": summary_rows,
        "keys": ",".join(r.key for r in chosen), "fp": zip(chosen[1:], body["fingerprints"]),
        "curves": body["step_times"],
    })


@login_required
def compare_frame(request: HttpRequest) -> HttpResponse:
    chosen = _compared_runs(request)
    if len(chosen) < 2:
        raise Http404("choose two runs")
    key = request.GET.get("frame", "")
    base, other = chosen[0], chosen[1]
    return render(request, "dashboard/compare_frame.html", {
        "base": base, "other": other, "key": key, "diff": frames.cross_run_diff(base, other, key),
        "keys": ",".join(r.key for r in chosen),
    })
