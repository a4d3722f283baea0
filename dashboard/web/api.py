"""Read API v1 (DESIGN 3.3): JSON for bearer tokens (one project) and session users (their projects)."""
from __future__ import annotations

from functools import wraps

from django.db.models import Count, Q
from django.http import HttpRequest, JsonResponse

from dashboard.detection.models import Alert
from dashboard.tenancy import auth
from dashboard.tenancy.models import Run


def api_view(fn):
    """Authenticate (bearer or session) and pass the principal; 401 JSON otherwise, GET only."""

    @wraps(fn)
    def wrapper(request: HttpRequest, *args, **kwargs) -> JsonResponse:
        if request.method != "GET":
            return JsonResponse({"error": "method not allowed"}, status=405)
        who = auth.principal(request)
        if who is None:
            return JsonResponse({"error": "authentication required (bearer token or session)"}, status=401)
        return fn(request, who, *args, **kwargs)

    return wrapper


def _visible_run(who: auth.Principal, key: str) -> Run | JsonResponse:
    run = Run.objects.select_related("project").filter(key=key).first()
    if run is None:
        return JsonResponse({"error": f"no run {key!r}"}, status=404)
    if not who.can_see(run):
        return JsonResponse({"error": f"run {key!r} belongs to another project"}, status=403)
    return run


def run_summary(run: Run, critical: int, warning: int) -> dict:
    return {
        "key": run.key,
        "name": run.name,
        "project": run.project.name,
        "world_size": run.world_size,
        "status": run.status,
        "torch_version": run.torch_version,
        "started_at": run.started_at.isoformat(),
        "last_step": run.last_step,
        "alerts": {"critical": critical, "warning": warning},
    }


def with_alert_counts(runs):
    firing = Q(alerts__state=Alert.State.FIRING)
    return runs.annotate(
        critical=Count("alerts", filter=firing & Q(alerts__severity="critical"), distinct=True),
        warning=Count("alerts", filter=firing & Q(alerts__severity="warning"), distinct=True),
        ended=Count("ranks", filter=~Q(ranks__status="running"), distinct=True),
    )


@api_view
def runs(request: HttpRequest, who: auth.Principal) -> JsonResponse:
    rows = with_alert_counts(who.runs().select_related("project")).order_by("-started_at")[:500]
    return JsonResponse({"runs": [run_summary(r, r.critical, r.warning) for r in rows]})


@api_view
def run_detail(request: HttpRequest, who: auth.Principal, key: str) -> JsonResponse:
    run = _visible_run(who, key)
    if isinstance(run, JsonResponse):
        return run
    run = with_alert_counts(Run.objects.filter(id=run.id).select_related("project")).get()
    body = run_summary(run, run.critical, run.warning)
    body["ranks"] = [
        {"rank": r.rank, "host": r.host, "last_step": r.last_step, "last_seen": r.last_seen.isoformat(), "status": r.status}
        for r in run.ranks.all()
    ]
    body["summary"] = {
        "ranks_reporting": len(body["ranks"]),
        "compile_slots": run.compileslot_set.count(),
        "grad_slots": run.gradslot_set.count(),
    }
    return JsonResponse(body)


@api_view
def run_alerts(request: HttpRequest, who: auth.Principal, key: str) -> JsonResponse:
    run = _visible_run(who, key)
    if isinstance(run, JsonResponse):
        return run
    alerts = run.alerts.select_related("acked_by", "run")
    return JsonResponse({"alerts": [a.as_json() for a in alerts]})


# --- timeline and compare (DESIGN 3.3) -----------------------------------------------------

@api_view
def run_timeline(request: HttpRequest, who: auth.Principal, key: str) -> JsonResponse:
    """Ranks x time compile spans and markers, ranks x steps agreement: aggregated server-side."""
    from dashboard.web.pages import timeline

    run = _visible_run(who, key)
    if isinstance(run, JsonResponse):
        return run
    return JsonResponse(timeline.timeline(run))


@api_view
def compare(request: HttpRequest, who: auth.Principal) -> JsonResponse:
    from dashboard.web.pages import compare as comparing

    keys = list(dict.fromkeys(k for k in request.GET.get("runs", "").split(",") if k))
    if not 2 <= len(keys) <= 8:
        return JsonResponse({"error": "pass 2 to 8 run keys: ?runs=<key>,<key>[,...]"}, status=400)
    runs = []
    for key in keys:
        run = _visible_run(who, key)
        if isinstance(run, JsonResponse):
            return run
        runs.append(run)
    return JsonResponse(comparing.compare(runs))


# --- acknowledge and silence (session users only: an ack names a person) -----------------

def api_action(fn=None, *, tokens: bool = False):
    """POST by a logged-in user with a valid CSRF token; JSON errors (401/403/405) otherwise.

    Bearer tokens name a project, not a person, so they cannot acknowledge or silence; actions
    made with `tokens=True` (automation, e.g. CI choosing a baseline) accept them too.
    """
    if fn is None:
        return lambda f: api_action(f, tokens=tokens)
    from django.middleware.csrf import CsrfViewMiddleware
    from django.views.decorators.csrf import csrf_exempt

    @csrf_exempt
    @wraps(fn)
    def wrapper(request: HttpRequest, *args, **kwargs) -> JsonResponse:
        if request.method != "POST":
            return JsonResponse({"error": "method not allowed"}, status=405)
        bearer = auth.bearer_token(request) is not None
        if bearer and not tokens:
            return JsonResponse({"error": "acknowledging and silencing need a user session, not a project token"}, status=403)
        who = auth.principal(request)
        if who is None:
            return JsonResponse({"error": "authentication required"}, status=401)
        if bearer:
            return fn(request, who, *args, **kwargs)
        rejected = CsrfViewMiddleware(lambda r: None).process_view(request, None, (), {})
        if rejected is not None:
            return JsonResponse({"error": "CSRF check failed"}, status=403)
        return fn(request, who, *args, **kwargs)

    return wrapper


@api_action
def alert_ack(request: HttpRequest, who: auth.Principal, alert_id: int) -> JsonResponse:
    from dashboard.web.pages import alerting

    alert = Alert.objects.select_related("run", "acked_by").filter(id=alert_id).first()
    if alert is None:
        return JsonResponse({"error": f"no alert {alert_id}"}, status=404)
    if not who.can_see(alert.run):
        return JsonResponse({"error": "alert belongs to another project"}, status=403)
    return JsonResponse(alerting.acknowledge(alert, who.user).as_json())


@api_action
def silences(request: HttpRequest, who: auth.Principal) -> JsonResponse:
    import json

    from dashboard.web.pages import alerting

    try:
        data = json.loads(request.body or b"{}")
    except ValueError:
        return JsonResponse({"error": "body must be JSON"}, status=400)
    form = alerting.SilenceForm(data if isinstance(data, dict) else {})
    if not form.is_valid():
        return JsonResponse({"error": "invalid silence", "fields": form.errors.get_json_data()}, status=400)
    made = alerting.create_silence(form.cleaned_data, who.user, who.project_ids)
    if isinstance(made, str):
        return JsonResponse({"error": made}, status=400)
    return JsonResponse(alerting.silence_json(made), status=201)


@api_action(tokens=True)
def run_baseline(request: HttpRequest, who: auth.Principal, key: str) -> JsonResponse:
    """`{"baseline": "<run key>"}`: compare this run step by step with that one (baseline_divergence)."""
    import json

    from dashboard.detection import tasks as detection_tasks

    run = _visible_run(who, key)
    if isinstance(run, JsonResponse):
        return run
    try:
        base_key = json.loads(request.body or b"{}").get("baseline")
    except (ValueError, AttributeError):
        return JsonResponse({"error": "body must be a JSON object"}, status=400)
    if not isinstance(base_key, str) or not base_key:
        return JsonResponse({"error": "baseline must be a run key", "path": "baseline"}, status=400)
    base = _visible_run(who, base_key)
    if isinstance(base, JsonResponse):
        return base
    try:
        detection_tasks.choose_baseline(run, base, who.user)
    except ValueError as exc:
        return JsonResponse({"error": str(exc), "path": "baseline"}, status=400)
    return JsonResponse({"run": run.key, "baseline": base.key}, status=201)
