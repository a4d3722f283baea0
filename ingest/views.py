"""POST /api/v1/ingest: authenticate, validate, store all-or-nothing, then queue settling.

Error contract (DESIGN 3.2): 400 malformed (with the failing path), 401 bad token, 403 another
project's run, 409 same (session, seq) with other content, 413 too large, 415 wrong content
type. Bad input never reaches the database and never yields a 500.
"""
from __future__ import annotations

import logging

import msgspec

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agents import protocol
from dashboard.detection import tasks
from ingest import auth, validation, writers
from ingest.validation import Rejection

log = logging.getLogger(__name__)


def error(status: int, message: str, path: str | None = None) -> JsonResponse:
    body = {"error": message}
    if path is not None:
        body["path"] = path
    return JsonResponse(body, status=status)


@csrf_exempt
@require_POST
def ingest(request: HttpRequest) -> JsonResponse:
    try:
        return _ingest(request)
    except Rejection as rejection:
        return error(rejection.status, rejection.error, rejection.path)


def _ingest(request: HttpRequest) -> JsonResponse:
    token = auth.bearer_token(request)
    project = auth.project_for_token(token) if token else None
    if project is None:
        raise Rejection(401, "missing or invalid bearer token")
    if request.content_type != "application/json":
        raise Rejection(415, f"Content-Type must be application/json, got {request.content_type or 'none'!r}")
    limit = settings.LOCKSTEP_MAX_BODY
    if int(request.headers.get("Content-Length") or 0) > limit:
        raise Rejection(413, f"body exceeds {limit} bytes")
    raw = request.body
    if len(raw) > limit:
        raise Rejection(413, f"body exceeds {limit} bytes")
    body = validation.read_body(raw, request.headers.get("Content-Encoding", ""), limit)
    batch = validation.decode(body)
    stored = writers.store(batch, project, writers.digest(body))
    _queue_settles(stored.ready)
    reply = protocol.IngestReply(accepted=stored.accepted, duplicate=stored.duplicate)
    return JsonResponse(msgspec.to_builtins(reply))


def _queue_settles(ready: list[tuple[str, int]]) -> None:
    """Settle complete slots now; if the broker is down, the sweep settles them later (state is in PostgreSQL)."""
    try:
        for kind, slot_id in ready:
            tasks.settle_slot.delay(kind, slot_id)
    except Exception:
        log.warning("broker unavailable; %d slots left to the sweep", len(ready), exc_info=True)
