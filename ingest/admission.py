"""What admits an agent's request, and what each refusal answers: the checks `ingest.door` runs.

Error contract (docs/design.md, Wire protocol): 400 malformed (with the failing path), 401 bad token (a run key is
per project, so another project's run is never in the way), 403 a token without the ingest scope, 409 same (session, seq) with other content, 413 too large, 415 wrong content
type, 429 + Retry-After when a project sends faster than LOCKSTEP_RATE_LIMIT or starts more runs than
LOCKSTEP_RUNS_PER_HOUR (`ingest.quotas`, which also bounds a run's ranks), 503 +
Retry-After while PostgreSQL or Redis is unreachable or the process is overloaded
(`ingest.backpressure`; the batch was not accepted: the agent keeps it and resends), 422 for a batch the database refuses although it passed validation (a resend
could not cure it; the agent quarantines it). Bad input never reaches the database and never
yields a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, cast

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError
from django.utils.http import parse_header_parameters

from agents import protocol
from dashboard.tenancy import auth
from dashboard.tenancy.models import INGEST, Project, ProjectToken
from ingest import backpressure, quotas, ratelimit, retries, validation, writers
from ingest.refusals import Refusal

log = logging.getLogger(__name__)

REFUSED = (Refusal, ratelimit.BrokerDown, DatabaseError)
UNIQUE_VIOLATION = "23505"  # a concurrent insert won: the resend is a duplicate
TOKEN_CACHE_S = 2.0  # how long a revoked token may still be honoured by a process that saw it
UNDECIDED = object()  # `admit` could not tell without a query

_tokens: dict[str, tuple[float, ProjectToken | None]] = {}


def refusal(exc: Exception) -> tuple[int, dict[str, Any], int | None]:
    """(status, JSON body, Retry-After or None) for what refused a request: a `Refusal`, Redis or
    the database unreachable (503), or a batch the database refuses (422); anything else is raised."""
    if isinstance(exc, Refusal):
        retry = exc.retry_after or (backpressure.retry_after() if exc.status in (429, 503) else None)
        return exc.status, _error(exc.message, exc.path), retry
    if isinstance(exc, ratelimit.BrokerDown):
        return 503, _error("broker unavailable; retry later"), settings.LOCKSTEP_RETRY_AFTER
    if isinstance(exc, DatabaseError):
        writers.forget_runs()
        return _database_error(exc)
    raise exc


def _error(message: str, path: str | None = None) -> dict[str, Any]:
    return {"error": message} if path is None else {"error": message, "path": path}


def _database_error(exc: DatabaseError) -> tuple[int, dict[str, Any], int | None]:
    """A value the database refuses (too long, out of range, a violated constraint) is permanent for
    this batch, so a resend cannot cure it: a 422 the agent quarantines, instead of a 503 it would
    resend forever while every later batch waits. Everything else (the connection, a lost race,
    a timeout, a missing migration) is a 503: the batch stays with the agent."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    if isinstance(exc, DataError) or (isinstance(exc, IntegrityError) and sqlstate != UNIQUE_VIOLATION):
        log.error("batch cannot be stored (sqlstate %s): %s", sqlstate, exc)
        return (
            422,
            _error(f"the server cannot store this batch (database error {sqlstate or type(exc).__name__})"),
            None,
        )
    log.warning("database unavailable or busy, batch rolled back: %s", exc)
    if retries.busy(exc):
        return 503, _error("database busy (a lock or statement timeout); retry later"), settings.LOCKSTEP_RETRY_AFTER
    return 503, _error("database unavailable; retry later"), settings.LOCKSTEP_RETRY_AFTER


def admit(headers: Mapping[str, str], query: bool = True) -> Any:
    """The project of a request whose headers pass: its token (else 401) and Content-Type (else
    415), before a byte of the body is read. `headers`: lower-cased names. UNDECIDED when the token
    is not in the cache and `query` is off (on the event loop: ask again from a thread)."""
    token = auth.token_of(headers.get("authorization", ""))
    found = (_token_for(token) if query else _cached_token(token)) if token else None
    if found is UNDECIDED:
        return UNDECIDED
    if found is None:
        raise Refusal(401, "missing or invalid bearer token")
    if INGEST not in found.scopes:
        raise Refusal(403, f"this token lacks the {INGEST!r} scope (its scopes: {', '.join(found.scopes)})")
    content_type = parse_header_parameters(headers.get("content-type", ""))[0]
    if content_type != "application/json":
        raise Refusal(415, f"Content-Type must be application/json, got {content_type or 'none'!r}")
    return found.project


def body_of(raw: bytes, headers: Mapping[str, str]) -> bytes:
    """The inflated body, refused past LOCKSTEP_MAX_BODY once inflated (413; its raw size was bounded
    as it was read, `ingest.bodies`)."""
    return validation.read_body(raw, headers.get("content-encoding", ""), settings.LOCKSTEP_MAX_BODY)


def limit(project: Project, batches: int) -> None:
    """Count a request that is not a batch of steps (a blob upload, a flight record) against the rate limit."""
    if ratelimit.over_limit(project.id, batches):
        raise Refusal(429, f"project {project.name} exceeds {settings.LOCKSTEP_RATE_LIMIT} batches/s; retry later")


def _token_for(token: str) -> ProjectToken | None:
    """Token -> its stored row and project (None: unknown), remembered either way for TOKEN_CACHE_S:
    a query per batch otherwise, and a flood of bad tokens would be a flood of queries."""
    cached = _cached_token(token)
    if cached is not UNDECIDED:
        return cast(ProjectToken | None, cached)
    found = auth.token_for(token)
    if len(_tokens) > 10_000:
        _tokens.clear()
    _tokens[token] = (time.monotonic() + TOKEN_CACHE_S, found)
    return found


def _cached_token(token: str) -> Any:
    cached = _tokens.get(token)
    return cached[1] if cached and cached[0] > time.monotonic() else UNDECIDED


def job_of(project: Project, body: bytes, bulk: bool) -> writers.Job:
    """A request's validated batches (a relay's several, each with its exact bytes' digest), or a 400;
    a run wider than this server takes (`quotas.check_ranks`) too."""
    if bulk:
        batches = validation.decode_bulk(body)
        for i, (batch, _) in enumerate(batches):
            try:
                quotas.check_ranks(batch)
            except Refusal as refusal:
                raise refusal.within(f"batches[{i}]") from None
        return writers.Job(project, [(batch, writers.digest(raw)) for batch, raw in batches], bulk=True, size=len(body))
    batch = validation.decode(body)
    quotas.check_ranks(batch)
    return writers.Job(project, [(batch, writers.digest(body))], size=len(body))


def reply_content(replies: list[protocol.IngestReply], bulk: bool) -> protocol.IngestReply | protocol.BulkReply:
    """The JSON of an accepted request: one batch's reply, or a relay's one per batch."""
    return protocol.BulkReply(results=replies) if bulk else replies[0]
