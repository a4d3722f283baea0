"""Every statement of a page or read-API request is bounded (issue 17, item 5), and so is its wait
for a database connection (issue 39, item 1).

Set per request on the request's connection and set back after it, so ingest (the agents' door
and its threads), Celery, migrations and whatever else shares the thread's connection keep theirs.
A statement cut off, a lock not granted in time (LOCKSTEP_DB_LOCK_TIMEOUT) and a request that found
every pooled connection taken for LOCKSTEP_DB_POOL_TIMEOUT are a 503 with Retry-After, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from psycopg_pool import PoolTimeout, TooManyRequests

from ingest import retries

QUERY_CANCELED = "57014"


def _reset(previous: str) -> None:
    """Back to the session's own bound (a server's sessions have LOCKSTEP_DB_STATEMENT_TIMEOUT, which
    RESET would drop for whatever uses the connection next)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('statement_timeout', %s, false)", [previous])
    except DatabaseError:  # a broken connection is closed and replaced anyway
        pass


class StatementTimeout:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:  # the request's first statement: here it waits for a pooled connection
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, false)",
                    [f"{int(settings.LOCKSTEP_PAGE_STATEMENT_TIMEOUT * 1000)}ms"],
                )
                previous = cursor.fetchone()[0]
        except OperationalError as exc:
            if (response := busy_response(request, exc)) is None:
                raise
            return response
        try:
            return self.get_response(request)
        finally:
            _reset(previous)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return busy_response(request, exception)


def _busy_message(exception: BaseException) -> str | None:
    """Why the database turned a request away for now (a retry may pass), or None for any other error."""
    if not isinstance(exception, OperationalError):
        return None
    if isinstance(exception.__cause__, (PoolTimeout, TooManyRequests)):
        return f"every database connection of this server stayed busy for {settings.LOCKSTEP_DB_POOL_TIMEOUT:g} s; retry later"
    if getattr(exception.__cause__, "sqlstate", None) == QUERY_CANCELED:
        return f"the query took longer than {settings.LOCKSTEP_PAGE_STATEMENT_TIMEOUT:g} s; narrow it or retry later"
    if retries.busy(exception):  # a lock not granted within LOCKSTEP_DB_LOCK_TIMEOUT
        return "the data is locked by other work; retry later"
    return None


def busy_response(request: HttpRequest, exception: BaseException) -> HttpResponse | None:
    """The 503 + Retry-After (JSON on the API, text on pages) for a database that is busy, else None."""
    message = _busy_message(exception)
    if message is None:
        return None
    response = (
        JsonResponse({"error": message}, status=503)
        if request.path.startswith("/api/")
        else HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")
    )
    response["Retry-After"] = str(settings.LOCKSTEP_RETRY_AFTER)
    return response


class ContentSecurityPolicy:
    """Defence in depth behind the templates' escaping: scripts and everything else only from this
    origin, never inline (the pages keep theirs in static files; data goes in json_script blocks,
    which are not run). Inline styles stay allowed: the charts library sizes its tooltips with them.
    On pages only (HTML): a JSON answer runs nothing, and it stays the same as the agents' door's
    (ingest/headerpolicy.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html"):
            response.setdefault("Content-Security-Policy", settings.LOCKSTEP_CSP)
        return response


def client_ip(request: HttpRequest) -> str | None:
    """The login throttle's address (AXES_CLIENT_IP_CALLABLE): the one the edge settled on
    (`dashboard.web.edge.ClientAddress`, LOCKSTEP_TRUSTED_PROXIES), never a forwarding header of
    the request's own, which anyone can write (django-axes would read them when django-ipware is
    installed)."""
    return request.META.get("REMOTE_ADDR")
