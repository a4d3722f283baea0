"""Plain-text tables for people (`--json` gives scripts the API's own JSON instead)."""
from __future__ import annotations

from collections.abc import Sequence

MAX_CELL = 80


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    text = " ".join(str(value).split())  # one line per row, whatever the message holds
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; the last column is left ragged."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [[h.upper() for h in headers], *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


ALERT_COLUMNS = ("id", "kind", "severity", "state", "ranks", "step", "acked_by", "message")


def alert_row(alert: dict) -> list[object]:
    return [alert.get(c) for c in ALERT_COLUMNS]


def alerts(rows: Sequence[dict]) -> str:
    return table(ALERT_COLUMNS, [alert_row(a) for a in rows]) if rows else "no alerts"
