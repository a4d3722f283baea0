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
from collections.abc import Callable, Mapping

import msgspec
from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.http import parse_header_parameters
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from agents import protocol
from dashboard.tenancy import auth
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


def refusal(exc: Exception) -> JsonResponse:
    """The answer to what refused a request: a rejection, Redis or the database unreachable (503),
    or a batch the database refuses (422)."""
    if isinstance(exc, Rejection):
        retry = backpressure.retry_after() if exc.status in (429, 503) else None
        return error(exc.status, exc.error, exc.path, retry)
    if isinstance(exc, ratelimit.BrokerDown):
        return error(503, "broker unavailable; retry later", retry_after=settings.LOCKSTEP_RETRY_AFTER)
    if isinstance(exc, DatabaseError):
        writers.forget_runs()
        return _database_error(exc)
    raise exc


REFUSED = (Rejection, ratelimit.BrokerDown, DatabaseError)


def _guarded(handler: Callable[[HttpRequest], JsonResponse], request: HttpRequest, endpoint: str) -> JsonResponse:
    """Map rejections and database outages to their JSON answers, and count every outcome."""
    started = time.perf_counter()
    try:
        response = handler(request)
    except REFUSED as exc:
        response = refusal(exc)
    counted(endpoint, response.status_code, started)
    return response


def counted(endpoint: str, status: int, started: float) -> None:
    """A request's outcome in /metrics (accepted batches are counted by `groupcommit`)."""
    if status != 200:
        metrics.REQUESTS.labels(endpoint, "rejected", str(status)).inc()
    metrics.SECONDS.labels(endpoint).observe(time.perf_counter() - started)


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


def admit(headers: Mapping[str, str], query: bool = True):
    """The project of a request whose headers pass: its token (else 401), Content-Type (else 415)
    and declared length (else 400 / 413), all before a byte of the body is read. `headers`: Django's
    request.headers, or lower-cased names (`ingest.loop`). UNDECIDED when the token is not in the
    cache and `query` is off (on the event loop: ask again from a thread)."""
    token = auth.token_of(headers.get("authorization", ""))
    project = (_project_for(token) if query else _cached_project(token)) if token else None
    if project is UNDECIDED:
        return UNDECIDED
    if project is None:
        raise Rejection(401, "missing or invalid bearer token")
    content_type = parse_header_parameters(headers.get("content-type", ""))[0]
    if content_type != "application/json":
        raise Rejection(415, f"Content-Type must be application/json, got {content_type or 'none'!r}")
    limit = settings.LOCKSTEP_MAX_BODY
    declared = _declared_length(headers.get("content-length") or "0")
    if declared is None:
        raise Rejection(400, "invalid Content-Length")
    if declared > limit:
        raise Rejection(413, f"body exceeds {limit} bytes")
    return project


def body_of(raw: bytes, headers: Mapping[str, str]) -> bytes:
    """The inflated body, refused past LOCKSTEP_MAX_BODY before and after inflating (413)."""
    limit = settings.LOCKSTEP_MAX_BODY
    if len(raw) > limit:
        raise Rejection(413, f"body exceeds {limit} bytes")
    return validation.read_body(raw, headers.get("content-encoding", ""), limit)


def _authorized_body(request: HttpRequest) -> tuple[Project, bytes]:
    """A request counted as one batch against the rate limit (blobs, flight records), and its inflated body."""
    project = admit(request.headers)
    _limit(project, 1)
    return project, body_of(request.read(settings.LOCKSTEP_MAX_BODY + 1), request.headers)  # bounded even when chunked


def _limit(project: Project, batches: int) -> None:
    if ratelimit.over_limit(project.id, batches):
        raise Rejection(429, f"project {project.name} exceeds {settings.LOCKSTEP_RATE_LIMIT} batches/s; retry later")


TOKEN_CACHE_S = 2.0  # how long a revoked token may still be honoured by a process that saw it
_tokens: dict[str, tuple[float, Project | None]] = {}
UNDECIDED = object()  # `admit` or `refused_before_body` could not tell without a query


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
    """Whether the headers alone refuse the request (`admit`), before a byte of the body is read
    (ingest.fastpath, which then lets the view answer it without one). UNDECIDED when the token is
    not in the cache and `query` is off (on the event loop: ask again from a thread)."""
    try:
        admitted = admit(headers, query)
    except Rejection:
        return True
    return UNDECIDED if admitted is UNDECIDED else False


def _declared_length(value: str) -> int | None:
    """A Content-Length header as a size, or None when it is not one (a sign, spaces, digits of other scripts)."""
    return int(value) if value.isascii() and value.isdigit() else None


def job_of(project: Project, body: bytes, bulk: bool) -> writers.Job:
    """A request's validated batches (a relay's several, each with its exact bytes' digest), or a 400."""
    if bulk:
        return writers.Job(project, [(batch, writers.digest(raw)) for batch, raw in validation.decode_bulk(body)], bulk=True)
    return writers.Job(project, [(validation.decode(body), writers.digest(body))])


def reply_content(replies: list[protocol.IngestReply], bulk: bool):
    """The JSON of an accepted request: one batch's reply, or a relay's one per batch."""
    return protocol.BulkReply(results=replies) if bulk else replies[0]


@csrf_exempt
@require_POST
def ingest(request: HttpRequest) -> JsonResponse:
    """`POST /api/v1/ingest`: one agent's batch."""
    return _guarded(lambda r: _posted(r, bulk=False), request, "ingest")


@csrf_exempt
@require_POST
def ingest_bulk(request: HttpRequest) -> JsonResponse:
    """`POST /api/v1/ingest/bulk`: a node relay's batches of several ranks, one transaction (`protocol.Bulk`)."""
    return _guarded(lambda r: _posted(r, bulk=True), request, "bulk")


def _posted(request: HttpRequest, bulk: bool) -> JsonResponse:
    """Through Django's handlers (the agents' endpoints are served on the event loop, `ingest.loop`,
    where it runs): the same checks, the same group commit, the same answer."""
    arrived = _admitted(request)
    project = admit(request.headers)
    job = job_of(project, body_of(request.read(settings.LOCKSTEP_MAX_BODY + 1), request.headers), bulk)
    return JsonResponse(msgspec.to_builtins(reply_content(groupcommit.store(job, arrived), bulk)))


def _admitted(request: HttpRequest) -> float:
    """When the request's body arrived (`ingest.backpressure`); a 503 for one that already waited
    past SHED_AFTER_S for a thread: its agent keeps the batch and resends it after Retry-After."""
    now = time.monotonic()
    waited = backpressure.waited(getattr(request, "scope", None), now)
    if waited > backpressure.SHED_AFTER_S:
        raise Rejection(503, f"server overloaded (the batch waited {waited:.1f} s for a thread); retry later")
    return now - waited


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
