"""A run's ranks a page at a time: the run page's table and the run API's `ranks` list hold at most
RANKS_PER_PAGE rows, so a run of thousands of ranks costs a page, not thousands of rows (`?page=`)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from dashboard.tenancy.models import Rank, Run
from ingest.refusals import Refusal

RANKS_PER_PAGE = 256


@dataclass(frozen=True)
class RanksPage:
    ranks: QuerySet[Rank]  # this page's, in rank order
    number: int  # from 1
    pages: int
    total: int  # ranks reporting

    @property
    def first(self) -> int:
        """The position (from 1) of this page's first rank among all of them."""
        return (self.number - 1) * RANKS_PER_PAGE + 1

    @property
    def last(self) -> int:
        return min(self.total, self.number * RANKS_PER_PAGE)

    @property
    def previous(self) -> int | None:
        return self.number - 1 if 1 < self.number <= self.pages else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.pages else None


def ranks_page(run: Run, page: str | None) -> RanksPage:
    """Page `page` (text from `?page=`, default 1) of the run's ranks; anything but a whole number
    >= 1 is a 400 naming `page`. A page past the last is empty."""
    number = _number(page or "1")
    total = run.ranks.count()
    start = (number - 1) * RANKS_PER_PAGE
    rows = run.ranks.defer("info").order_by("rank")[start : start + RANKS_PER_PAGE]  # `info`: a JSON document each
    return RanksPage(rows, number, max(1, -(-total // RANKS_PER_PAGE)), total)


def _number(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1 or len(text) > 9:
        raise Refusal(400, f"page must be a whole number from 1, got {text[:40]!r}", path="page")
    return int(text)
