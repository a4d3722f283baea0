"""GET /api/v1/schema and /metrics: the agents' API description and Prometheus text, served by Django.

The agents' POST endpoints are served by `ingest.door`, ahead of Django.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from dashboard.tenancy import auth
from ingest import metrics, schema


def error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


@require_GET
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(schema.openapi())


@require_GET
def prometheus(request: HttpRequest) -> HttpResponse:
    """Prometheus text. It names every project and run, so it is refused until LOCKSTEP_METRICS_TOKEN is
    set (then that bearer token is needed), unless LOCKSTEP_METRICS_PUBLIC makes it public on purpose."""
    required = settings.LOCKSTEP_METRICS_TOKEN
    if required and not hmac.compare_digest((auth.bearer_token(request) or "").encode(), required.encode()):
        return error(401, "metrics need the LOCKSTEP_METRICS_TOKEN bearer token")
    if not required and not settings.LOCKSTEP_METRICS_PUBLIC:
        return error(403, "/metrics is off: set LOCKSTEP_METRICS_TOKEN (or LOCKSTEP_METRICS_PUBLIC=1)")
    return HttpResponse(metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")
