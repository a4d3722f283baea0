"""POST /api/v1/ingest and /api/v1/blobs, GET /api/v1/schema and /metrics.

Error contract (DESIGN 3.2): 400 malformed (with the failing path), 401 bad token (a run key is
per project, so another project's run is never in the way), 409 same (session, seq) with other content, 413 too large, 415 wrong content
type, 429 + Retry-After when a project sends faster than LOCKSTEP_RATE_LIMIT, 503 +
Retry-After while PostgreSQL or Redis is unreachable or the process is overloaded
(`ingest.backpressure`; the batch was not accepted: the agent keeps it and resends), 422 for a batch the database refuses although it passed validation (a resend
could not cure it; the agent quarantines it). Bad input never reaches the database and never
yields a 500.
"""
from __future__ import annotations

import hmac
import logging
import time
from collections import Counter
from collections.abc import Callable

import msgspec
from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from agents import protocol
from dashboard.tenancy import auth
from dashboard.ledger import flight as ledger_flight
from dashboard.ledger import signals as ledger
from dashboard.tenancy.models import Project
from ingest import backpressure, blobs, groupcommit, metrics, ratelimit, schema, validation, writers
from ingest.validation import Rejection

log = logging.getLogger(__name__)


def error(status: int, message: str, path: str | None = None, retry_after: int | None = None) -> JsonResponse:
    body = {"error": message}
    if path is not None:
        body["path"] = path
    response = JsonResponse(body, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


def _guarded(handler: Callable[[HttpRequest], JsonResponse], request: HttpRequest, endpoint: str) -> JsonResponse:
    """Map rejections and database outages to their JSON answers, and count every outcome."""
    started = time.perf_counter()
    try:
        response = handler(request)
    except Rejection as rejection:
        retry = backpressure.retry_after() if rejection.status in (429, 503) else None
        response = error(rejection.status, rejection.error, rejection.path, retry)
    except ratelimit.BrokerDown:
        response = error(503, "broker unavailable; retry later", retry_after=settings.LOCKSTEP_RETRY_AFTER)
    except DatabaseError as exc:
        writers.forget_runs()
        response = _database_error(exc)
    if response.status_code != 200:
        metrics.REQUESTS.labels(endpoint, "rejected", str(response.status_code)).inc()
    metrics.SECONDS.labels(endpoint).observe(time.perf_counter() - started)
    return response


def _database_error(exc: DatabaseError) -> JsonResponse:
    """A value the database refuses (too long, out of range, a violated constraint) is permanent for
    this batch, so a resend cannot cure it: a 422 the agent quarantines, instead of a 503 it would
    resend forever while every later batch waits. Everything else (the connection, a lost race,
    a timeout, a missing migration) is a 503: the batch stays with the agent."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    if isinstance(exc, DataError) or (isinstance(exc, IntegrityError) and sqlstate != UNIQUE_VIOLATION):
        log.error("batch cannot be stored (sqlstate %s): %s", sqlstate, exc)
        return error(422, f"the server cannot store this batch (database error {sqlstate or type(exc).__name__})")
    log.warning("database unavailable or busy, batch rolled back: %s", exc)
    return error(503, "database unavailable; retry later", retry_after=settings.LOCKSTEP_RETRY_AFTER)


UNIQUE_VIOLATION = "23505"  # a concurrent insert won: the resend is a duplicate


def _authorized_body(request: HttpRequest, count: bool = True) -> tuple[Project, bytes]:
    """Token, rate limit (the request as one batch, unless `count` is off), content type and size
    checks, then the (inflated) body."""
    token = auth.bearer_token(request)
    project = _project_for(token) if token else None
    if project is None:
        raise Rejection(401, "missing or invalid bearer token")
    if count:
        _limit(project, 1)
    if request.content_type != "application/json":
        raise Rejection(415, f"Content-Type must be application/json, got {request.content_type or 'none'!r}")
    limit = settings.LOCKSTEP_MAX_BODY
    declared = _declared_length(request.headers.get("Content-Length") or "0")
    if declared is None:
        raise Rejection(400, "invalid Content-Length")
    if declared > limit:
        raise Rejection(413, f"body exceeds {limit} bytes")
    raw = request.read(limit + 1)  # bounded even without a Content-Length (chunked)
    if len(raw) > limit:
        raise Rejection(413, f"body exceeds {limit} bytes")
    return project, validation.read_body(raw, request.headers.get("Content-Encoding", ""), limit)


def _limit(project: Project, batches: int) -> None:
    if ratelimit.over_limit(project.id, batches):
        raise Rejection(429, f"project {project.name} exceeds {settings.LOCKSTEP_RATE_LIMIT} batches/s; retry later")


TOKEN_CACHE_S = 2.0  # how long a revoked token may still be honoured by a process that saw it
_tokens: dict[str, tuple[float, Project | None]] = {}
UNDECIDED = object()  # `refusal_before_body` could not tell without a query


def _project_for(token: str) -> Project | None:
    """Token -> project (None: unknown), remembered either way for TOKEN_CACHE_S: a query per batch
    otherwise, and a flood of bad tokens would be a flood of queries."""
    cached = _cached_project(token)
    if cached is not UNDECIDED:
        return cached
    project = auth.project_for_token(token)
    if len(_tokens) > 10_000:
        _tokens.clear()
    _tokens[token] = (time.monotonic() + TOKEN_CACHE_S, project)
    return project


def _cached_project(token: str):
    cached = _tokens.get(token)
    return cached[1] if cached and cached[0] > time.monotonic() else UNDECIDED


def refused_before_body(headers: dict[str, str], query: bool = True):
    """Whether the headers alone refuse the request, before a byte of the body is read
    (ingest.fastpath, which then lets the view answer it without one): a missing or unknown token,
    a Content-Length that is not a size or is past LOCKSTEP_MAX_BODY. UNDECIDED when the token is
    not in the cache and `query` is off (on the event loop: ask again from a thread)."""
    token = auth.token_of(headers.get("authorization", ""))
    project = _cached_project(token) if token else None
    if project is UNDECIDED:
        if not query:
            return UNDECIDED
        project = _project_for(token)
    if project is None or "content-length" not in headers:
        return project is None
    declared = _declared_length(headers["content-length"])
    return declared is None or declared > settings.LOCKSTEP_MAX_BODY


def _declared_length(value: str) -> int | None:
    """A Content-Length header as a size, or None when it is not one (a sign, spaces, digits of other scripts)."""
    return int(value) if value.isascii() and value.isdigit() else None


@csrf_exempt
@require_POST
def ingest(request: HttpRequest) -> JsonResponse:
    """`POST /api/v1/ingest`: one agent's batch."""
    return _guarded(_ingest, request, "ingest")


def _ingest(request: HttpRequest) -> JsonResponse:
    arrived = _admitted(request)
    project, body = _authorized_body(request)
    batch = validation.decode(body)
    return JsonResponse(msgspec.to_builtins(_accept(project, [(batch, writers.digest(body))], "ingest", arrived)[0]))


def _ingest_bulk(request: HttpRequest) -> JsonResponse:
    arrived = _admitted(request)
    project, body = _authorized_body(request, count=False)
    decoded = validation.decode_bulk(body)
    _limit(project, len(decoded))  # each batch counts against the rate limit, as it would sent alone
    replies = _accept(project, [(batch, writers.digest(raw)) for batch, raw in decoded], "bulk", arrived)
    return JsonResponse(msgspec.to_builtins(protocol.BulkReply(results=replies)))


def _admitted(request: HttpRequest) -> float:
    """When the request's body arrived (`ingest.backpressure`); a 503 for one that already waited
    past SHED_AFTER_S for a thread: its agent keeps the batch and resends it after Retry-After."""
    now = time.monotonic()
    waited = backpressure.waited(getattr(request, "scope", None), now)
    if waited > backpressure.SHED_AFTER_S:
        raise Rejection(503, f"server overloaded (the batch waited {waited:.1f} s for a thread); retry later")
    return now - waited


def _accept(project: Project, items: list[tuple[protocol.Batch, str]], endpoint: str,
            arrived: float) -> list[protocol.IngestReply]:
    """Store the batches (in this process's next group commit), queue what they completed, and
    answer each as `POST /api/v1/ingest` would, with the flush interval the load calls for."""
    stored = groupcommit.store(project, items, bulk=endpoint == "bulk")
    backpressure.observe(time.monotonic() - arrived)
    interval = backpressure.flush_interval()
    ledger.announce_ready([slot for s in stored for slot in s.ready])
    want = set(blobs.wanted(sorted({h for s in stored for h in s.graph_hashes})))
    replies = []
    for (batch, _), s in zip(items, stored):
        replies.append(protocol.IngestReply(accepted=s.accepted, duplicate=s.duplicate,
                                            want_blobs=[h for h in s.graph_hashes if h in want], detail=_details(batch, s),
                                            flight_recorder=True if ledger_flight.HANDOUT_STEP in (s.detail or []) else msgspec.UNSET,
                                            flush_interval_s=interval))
        want.difference_update(s.graph_hashes)  # each wanted text is asked of one batch only
        _count(batch, s, endpoint)
    return replies


def _count(batch: protocol.Batch, stored: writers.Stored, endpoint: str) -> None:
    if stored.duplicate:
        metrics.REQUESTS.labels(endpoint, "duplicate", "200").inc()
        return
    metrics.REQUESTS.labels(endpoint, "accepted", "200").inc()
    for kind, n in Counter(type(e).__struct_config__.tag for e in batch.events).items():
        metrics.EVENTS.labels(kind).inc(n)
    metrics.RANK_STEPS.inc(stored.rank_steps)


def _details(batch: protocol.Batch, stored: writers.Stored) -> list[int]:
    """Steps whose per-parameter fingerprints the server wants from this rank; answers in this
    batch may complete an alert's question, which is then explained in a task."""
    if stored.duplicate or stored.run_id is None:
        return []
    ledger.announce_details(stored.run_id, batch.rank, {e.step for e in batch.events if isinstance(e, protocol.Detail)})
    return [step for step in stored.detail or [] if step >= 0]  # handed out in the batch's own statement (writers._claim)


@csrf_exempt
@require_POST
def ingest_bulk(request: HttpRequest) -> JsonResponse:
    """`POST /api/v1/ingest/bulk`: a node relay's batches of several ranks, one transaction (`protocol.Bulk`)."""
    return _guarded(_ingest_bulk, request, "bulk")


@csrf_exempt
@require_POST
def upload_blobs(request: HttpRequest) -> JsonResponse:
    return _guarded(_upload_blobs, request, "blobs")


def _upload_blobs(request: HttpRequest) -> JsonResponse:
    _, body = _authorized_body(request)
    checked = blobs.verify(validation.decode_blobs(body))
    reply = blobs.store(checked)
    metrics.REQUESTS.labels("blobs", "accepted", "200").inc()
    return JsonResponse(msgspec.to_builtins(reply))


@require_GET
def openapi(request: HttpRequest) -> JsonResponse:
    return JsonResponse(schema.openapi())


@require_GET
def prometheus(request: HttpRequest) -> HttpResponse:
    required = settings.LOCKSTEP_METRICS_TOKEN
    if required and not hmac.compare_digest((auth.bearer_token(request) or "").encode(), required.encode()):
        return error(401, "metrics need the LOCKSTEP_METRICS_TOKEN bearer token")
    return HttpResponse(metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")
