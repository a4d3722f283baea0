"""Long lists a page at a time (`?page=`, from 1): a run's ranks (the run page's table, the run API's
`ranks`) and alerts (the run's alerts API, the alerts page), so a run of thousands of ranks or
alerts costs a page, not thousands of rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db.models import Model, QuerySet

from dashboard.detection.models import Alert
from dashboard.tenancy.models import Rank, Run
from ingest.refusals import Refusal

RANKS_PER_PAGE = 256
ALERTS_PER_PAGE = 100

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Page(Generic[M]):
    rows: QuerySet[M]  # this page's, in the list's order
    number: int  # from 1
    per_page: int
    total: int  # rows of every page

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))

    @property
    def first(self) -> int:
        """The position (from 1) of this page's first row among all of them."""
        return (self.number - 1) * self.per_page + 1

    @property
    def last(self) -> int:
        return min(self.total, self.number * self.per_page)

    @property
    def previous(self) -> int | None:
        return self.number - 1 if 1 < self.number <= self.pages else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None

    def as_json(self, url: str) -> dict[str, Any]:
        """What an API answer says of its page: `next` is `url` at the next page, or None on the last."""
        following = f"{url}?page={self.next}" if self.next else None
        return {"page": self.number, "pages": self.pages, "per_page": self.per_page, "next": following}


def page_of(rows: QuerySet[M], page: str | None, per_page: int) -> Page[M]:
    """Page `page` (text from `?page=`, default 1) of `rows` (ordered); anything but a whole number
    >= 1 is a 400 naming `page`. A page past the last is empty."""
    number = _number(page or "1")
    start = (number - 1) * per_page
    return Page(rows[start : start + per_page], number, per_page, rows.count())


def ranks_page(run: Run, page: str | None) -> Page[Rank]:
    """A page of the run's ranks, in rank order."""
    return page_of(run.ranks.defer("info").order_by("rank"), page, RANKS_PER_PAGE)  # `info`: a JSON document each


def alerts_page(alerts: QuerySet[Alert], page: str | None) -> Page[Alert]:
    """A page of `alerts`, newest first."""
    return page_of(alerts.order_by("-first_seen", "-id"), page, ALERTS_PER_PAGE)


def _number(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1 or len(text) > 9:
        raise Refusal(400, f"page must be a whole number from 1, got {text[:40]!r}", path="page")
    return int(text)
