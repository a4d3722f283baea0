"""What a run page left open reads again when the run changed (docs/pages.md, "A page left open"):
`GET /api/v1/runs/<key>/now`, the run's status, verdict, headline counts, one page of its ranks and
whether it is over, in one small answer. run.js fetches it when the run's websocket says something
changed (an alert, an incident, a progress push whose counts moved), on reconnecting, and every few
seconds while the socket is down; the runs list reads `GET /api/v1/runs?key=` the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpRequest, JsonResponse
from django.utils import dateformat, timezone

from dashboard.web import services
from dashboard.web.api import api_view
from dashboard.web.pages.views import is_over, run_headline_counts
from dashboard.web.paging import RANKS_PER_PAGE

if TYPE_CHECKING:
    from datetime import datetime

    from dashboard.tenancy.auth import Principal
    from dashboard.web.services import ListedRun


def _clock(when: datetime, fmt: str) -> str:
    """`when` as the pages print it (Django's `date` filter: the server's time zone)."""
    return dateformat.format(timezone.localtime(when), fmt)


def ended_text(run: ListedRun) -> str:
    """What the run page's "Ranks now" strip says once the run is over (as run.html says it)."""
    after = f" after step {run.last_step}" if run.last_step is not None else ""
    return f"The run ended{after}; its last report came at {_clock(run.last_seen, 'Y-m-d H:i:s')}."


def _page_number(text: str | None) -> int:
    """`?page=` as the run page passes it on; anything but a whole number >= 1 is page 1."""
    return int(text) if text and text.isdigit() and int(text) >= 1 else 1


def run_now(run: ListedRun, page: int = 1) -> dict[str, Any]:
    """The run page's changing parts: header (status, verdict, last step), counts, a page of ranks
    (as the table shows them, RANKS_PER_PAGE a page) and, once the run is over, what the strip says."""
    over = is_over(run)
    start = (page - 1) * RANKS_PER_PAGE
    ranks = run.ranks.defer("info").order_by("rank")[start : start + RANKS_PER_PAGE]
    return {
        "key": run.key,
        "status": run.status,
        "over": over,
        "ended": ended_text(run) if over else None,
        "verdict": services.verdicts([run])[run.id].as_json(),
        "last_step": run.last_step,
        "last_seen": run.last_seen.isoformat(),
        "alerts": {"critical": run.critical, "warning": run.warning},
        "counts": run_headline_counts(run),
        "ranks": [
            {
                "rank": r.rank,
                "host": r.host,
                "status": r.status,
                "last_step": r.last_step,
                "seen": _clock(r.last_seen, "H:i:s"),
            }
            for r in ranks
        ],
        "ranks_page": page,
        "as_of": timezone.now().isoformat(),
    }


@api_view
def run_now_view(request: HttpRequest, who: Principal, key: str) -> JsonResponse:
    """`?page=`: the page of the ranks table the reader shows (default 1)."""
    run = services.run_with_alert_counts(who, key)
    return JsonResponse(run_now(run, _page_number(request.GET.get("page"))))
