"""The run page's links to the same job's runs in other tools (W&B, MLflow), as the agents sent them
in `rank_start.links` (kept in each rank's `info`).

Read from the lowest LINK_RANKS ranks only: a rank's `info` is a large document (environment,
parameter names), so a 1024-rank run must not have every one read; trackers run on rank 0 or on
every rank, and either way the first ranks carry the links. Only http(s) URLs become links: the
text came from a training process, and `javascript:` must never reach an href.
"""

from __future__ import annotations

from typing import TypedDict

from dashboard.tenancy.models import Rank, Run

LINK_RANKS = 8
NAMES = {"wandb": "W&B", "mlflow": "MLflow"}


class Link(TypedDict):
    """One link of `run_links`: `href` is None unless the URL is http(s)."""

    tool: str
    label: str
    url: str
    href: str | None
    ranks: list[int]


def run_links(run: Run) -> list[Link]:
    """[{"tool", "label", "url", "href" (None unless http/https), "ranks"}], one per distinct link, in rank order."""
    rows = (
        Rank.objects.filter(run=run, rank__lt=LINK_RANKS).order_by("rank").values_list("rank", "info__links")
    )  # only that key leaves the database
    out: dict[tuple[str, str], Link] = {}
    for rank, links in rows:
        for tool, url in _parsed(links).items():
            entry = out.setdefault(
                (tool, url),
                {
                    "tool": tool,
                    "label": NAMES.get(tool, tool),
                    "url": url,
                    "href": url if url.startswith(("http://", "https://")) else None,
                    "ranks": [],
                },
            )
            entry["ranks"].append(rank)
    return list(out.values())


def _parsed(links: object) -> dict[str, str]:
    """Tool -> URL text; anything else an old or odd agent stored there is left out."""
    return {str(k): v for k, v in links.items() if isinstance(v, str)} if isinstance(links, dict) else {}
