"""Every statement of a page or read-API request is bounded (issue 17, item 5).

Set per request on the request's connection and set back after it, so ingest (the agents' door
and its threads), Celery, migrations and whatever else shares the thread's connection keep theirs. A statement cut off is a 503 with Retry-After, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import DatabaseError, OperationalError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse

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
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, false)",
                [f"{int(settings.LOCKSTEP_PAGE_STATEMENT_TIMEOUT * 1000)}ms"],
            )
            previous = cursor.fetchone()[0]
        try:
            return self.get_response(request)
        finally:
            _reset(previous)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not (
            isinstance(exception, OperationalError) and getattr(exception.__cause__, "sqlstate", None) == QUERY_CANCELED
        ):
            return None
        message = f"the query took longer than {settings.LOCKSTEP_PAGE_STATEMENT_TIMEOUT:g} s; narrow it or retry later"
        response = (
            JsonResponse({"error": message}, status=503)
            if request.path.startswith("/api/")
            else HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")
        )
        response["Retry-After"] = "5"
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
