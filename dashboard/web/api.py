"""Read API v1 (docs/design.md, Read API) and its few actions: the JSON door over `services`.

Each view parses the request, calls one service and renders the result. The decorators name the
caller (bearer token or session) or refuse; any `Refusal` raised on the way is answered as
`{"error": message}` (plus `"path"` naming the input at fault) with the problem's status.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from dashboard.detection.models import Silence
from dashboard.detection.verdict import Verdict
from dashboard.evidence import reads
from dashboard.tenancy import auth
from dashboard.tenancy.auth import Principal
from dashboard.tenancy.models import BASELINE, READ, RESOLVE, Rank
from dashboard.web import input_bounds, services
from dashboard.web.forms import SilenceForm
from dashboard.web.paging import alerts_page, ranks_page
from ingest.refusals import Refusal

if TYPE_CHECKING:
    from dashboard.web.services import ListedRun

RUNS_LISTED = 500

Gate = Callable[[HttpRequest], Principal]
View = Callable[..., JsonResponse]


def refusal_response(refusal: Refusal) -> JsonResponse:
    body = {"error": refusal.message}
    if refusal.path is not None:
        body["path"] = refusal.path
    return JsonResponse(body, status=refusal.status)


def _json_door(gate: Gate) -> Callable[[View], View]:
    """Views get the caller `gate` names; Refusals raised by the gate or the view become JSON errors."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> JsonResponse:
            try:
                return view(request, gate(request), *args, **kwargs)
            except Refusal as refusal:
                return refusal_response(refusal)

        return wrapper

    return decorate


def _reader(request: HttpRequest) -> Principal:
    """GET by a bearer token or a session user."""
    if request.method != "GET":
        raise Refusal(405, "method not allowed")
    who = auth.principal(request)
    if who is None:
        raise Refusal(401, "authentication required (bearer token or session)")
    _require(who, READ)
    return who


def _require(who: Principal, scope: str) -> None:
    """A token without `scope` is refused by name; a member's rights are their membership."""
    if not who.may(scope):
        raise Refusal(
            403,
            f"this token lacks the {scope!r} scope (its scopes: {', '.join(sorted(who.scopes))}); "
            f"sign in, or use a token made with `manage.py createtoken <project> --scope {scope}`",
        )


def _poster(request: HttpRequest, scope: str | None) -> Principal:
    """POST by a logged-in user with a valid CSRF token, or by a bearer token that has `scope`.

    Bearer tokens name a project, not a person, so where `scope` is None (acknowledging, silencing)
    only a user may act. A token carries no cookie, so it needs no CSRF check.
    """
    if request.method != "POST":
        raise Refusal(405, "method not allowed")
    bearer = auth.bearer_token(request) is not None
    if bearer and scope is None:
        raise Refusal(403, "acknowledging and silencing need a user session, not a project token")
    who = auth.principal(request)
    if who is None:
        raise Refusal(401, "authentication required")
    if not bearer and CsrfViewMiddleware(_no_response).process_view(request, _no_response, (), {}) is not None:
        raise Refusal(403, "CSRF check failed")
    if scope is not None:
        _require(who, scope)
    return who


api_view = _json_door(_reader)


def api_action(view: View) -> View:
    """An action a person takes (their name goes on it)."""
    return csrf_exempt(_json_door(lambda request: _poster(request, None))(view))


def api_automation(scope: str) -> Callable[[View], View]:
    """An action a person, or a project token made with `scope`, may take."""

    def decorate(view: View) -> View:
        return csrf_exempt(_json_door(lambda request: _poster(request, scope))(view))

    return decorate


def _json_body(request: HttpRequest, message: str) -> object:
    """The parsed body; not JSON, nested past the parser's depth or holding a NUL (no column holds
    one) is a 400 naming the field."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        raise Refusal(400, message, path="body") from None
    except RecursionError:
        raise Refusal(400, "the body nests too deeply", path="body") from None
    if (field := input_bounds.json_nul(body)) is not None:
        raise Refusal(400, f"{field} contains a NUL byte", path=field)
    return body


# --- JSON shapes (docs/design.md, Read API) --------------------------------------------------


def _no_response(request: HttpRequest) -> HttpResponse:
    """The view and next handler CsrfViewMiddleware is built with: only its check is asked for."""
    raise AssertionError("CsrfViewMiddleware.process_view does not call the view")


def run_json(run: ListedRun, verdict: Verdict) -> dict[str, Any]:
    """A runs-list row; `run` carries the alert counts and status `services.runs_list` annotates;
    the alert counts are of unresolved alerts (firing, or ended unresolved)."""
    return {
        "key": run.key,
        "name": run.name,
        "project": run.project.name,
        "world_size": run.world_size,
        "status": run.status,
        "torch_version": run.torch_version,
        "started_at": run.started_at.isoformat(),
        "last_step": run.last_step,
        "alerts": {"critical": run.critical, "warning": run.warning},
        "verdict": verdict.as_json(),
    }


def rank_json(rank: Rank) -> dict[str, Any]:
    return {
        "rank": rank.rank,
        "host": rank.host,
        "last_step": rank.last_step,
        "last_seen": rank.last_seen.isoformat(),
        "status": rank.status,
    }


def silence_json(s: Silence) -> dict[str, Any]:
    return {
        "id": s.id,
        "project": s.project.name,
        "run": s.run.key if s.run else None,
        "kind": s.kind or None,
        "rank": s.rank,
        "expires_at": s.expires_at.isoformat(),
        "comment": s.comment,
        "author": s.author.get_username() if s.author else None,
        "created_at": s.created_at.isoformat(),
    }


# --- reads -------------------------------------------------------------------------------


@api_view
def runs(request: HttpRequest, who: Principal) -> JsonResponse:
    """`?status=running|finished|failed|stalled` and `?verdict=in_lockstep|diverged|failed|stalled|recovered`
    narrow the list; any other status or verdict is a 400. `?key=` (repeated, at most RUNS_LISTED): only
    the runs of those keys (what the runs list page reads again when its runs changed)."""
    found = services.runs_list(who, request.GET.get("status", "").strip(), request.GET.get("verdict", "").strip())
    keys = request.GET.getlist("key")
    if len(keys) > RUNS_LISTED:
        raise Refusal(400, f"at most {RUNS_LISTED} keys", path="key")
    if keys:
        found = found.filter(key__in=keys)
    listed = list(found[:RUNS_LISTED])
    verdicts = services.verdicts(listed)
    return JsonResponse({"runs": [run_json(r, verdicts[r.id]) for r in listed]})


@api_view
def run_detail(request: HttpRequest, who: Principal, key: str) -> JsonResponse:
    """`ranks`: RANKS_PER_PAGE of them (`?page=`, from 1); `ranks_page` says which and links the next."""
    run = services.run_with_alert_counts(who, key)
    page = ranks_page(run, request.GET.get("page"))
    summary = {
        "ranks_reporting": page.total,
        "compile_slots": run.compileslot_set.count(),
        "grad_slots": run.gradslot_set.count(),
    }
    paging = page.as_json(reverse("api-run", args=[run.key]))
    ranks = [rank_json(r) for r in page.rows]
    body = {**run_json(run, services.verdicts([run])[run.id]), "ranks": ranks, "ranks_page": paging}
    return JsonResponse({**body, "summary": summary, "notices": reads.agent_notices(run.id)})


@api_view
def run_alerts(request: HttpRequest, who: Principal, key: str) -> JsonResponse:
    """`alerts`: ALERTS_PER_PAGE of them, newest first (`?page=`, from 1); `alerts_page` says which and
    links the next (2,500 alerts had been 1.3 MiB in one answer)."""
    page = alerts_page(services.run_alerts(who, key), request.GET.get("page"))
    alerts = list(page.rows)
    webhooks = services.webhook_deliveries(alerts)
    none = {"pending": 0, "sent": 0, "failed": 0}
    return JsonResponse(
        {
            "alerts": [{**a.as_json(), "webhooks": webhooks.get(a.id, none)} for a in alerts],
            "alerts_page": page.as_json(reverse("api-run-alerts", args=[key])),
        }
    )


@api_view
def run_incidents(request: HttpRequest, who: Principal, key: str) -> JsonResponse:
    """Alerts grouped by cause: each incident's root (where the trouble started) and its alerts."""
    return JsonResponse({"incidents": services.run_incidents(who, key)})


@api_view
def run_timeline(request: HttpRequest, who: Principal, key: str) -> JsonResponse:
    """Ranks x time compile spans and markers, ranks x steps agreement: aggregated server-side."""
    return JsonResponse(services.run_timeline(who, key))


@api_view
def run_cost(request: HttpRequest, who: Principal, key: str) -> JsonResponse:
    """The compile bill: GPU-seconds lost to compilation by frame and cause, with remedies (docs/cost.md)."""
    return JsonResponse(services.run_cost(who, key))


@api_view
def compare(request: HttpRequest, who: Principal) -> JsonResponse:
    """`?runs=a,b[,...]&tol=1e-3`: the first run is the reference; `verdict` sums it up."""
    return JsonResponse(services.compare(who, request.GET.get("runs", "").split(","), request.GET.get("tol")))


# --- actions -----------------------------------------------------------------------------


@api_action
def alert_ack(request: HttpRequest, who: Principal, alert_id: int) -> JsonResponse:
    return JsonResponse(services.acknowledge(who, alert_id).as_json())


@api_automation(RESOLVE)
def alert_resolve(request: HttpRequest, who: Principal, alert_id: int) -> JsonResponse:
    """Resolve by hand, `{"reason": "..."}`: a user (their name goes on it) or a token with the resolve scope."""
    body = _json_body(request, 'the body must be JSON: {"reason": "..."}')
    reason = body.get("reason") if isinstance(body, dict) else None
    return JsonResponse(services.resolve_by_hand(who, alert_id, reason).as_json())


@api_action
def incident_ack(request: HttpRequest, who: Principal, incident_id: int) -> JsonResponse:
    return JsonResponse(services.acknowledge_incident(who, incident_id).as_json())


@api_action
def silences(request: HttpRequest, who: Principal) -> JsonResponse:
    data = _json_body(request, "body must be JSON")
    form = SilenceForm(data if isinstance(data, dict) else {})
    if not form.is_valid():
        return JsonResponse({"error": "invalid silence", "fields": form.errors.get_json_data()}, status=400)
    return JsonResponse(silence_json(services.create_silence(who, form.cleaned_data)), status=201)


@api_automation(BASELINE)
def run_baseline(request: HttpRequest, who: Principal, key: str) -> JsonResponse:
    """`{"baseline": "<run key>"}`: compare this run step by step with that one (baseline_divergence)."""
    run = services.run_for(who, key)
    body = _json_body(request, "body must be a JSON object")
    if not isinstance(body, dict):
        raise Refusal(400, "body must be a JSON object")
    link = services.choose_baseline(who, run, body.get("baseline"))
    return JsonResponse({"run": run.key, "baseline": link.baseline.key}, status=201)
