"""Plain-text tables for people (`--json` gives scripts the API's own JSON instead)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_CELL = 80
MIN_WRAP = 24  # narrower than this, a wrapped last column reads worse than a cut one


@dataclass
class Layout:
    """How cells fit: `wide` (--wide) prints every cell in full on one line; `columns` (stdout is a
    terminal that wide) wraps the last column (the message, the remedy) under itself instead of
    cutting it; neither cuts long cells at MAX_CELL, one line per row for pipes and grep."""

    wide: bool = False
    columns: int | None = None


LAYOUT = Layout()
# C0 and C1 controls, DEL, and the bidirectional overrides: server text (run names, messages) comes
# from agents and must never move the cursor, clear the screen, set a title or hide a link (OSC 8).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
REPLACEMENT = "\N{REPLACEMENT CHARACTER}"


def clean(text: str) -> str:
    """`text` with every control character replaced, fit for a terminal."""
    return CONTROL.sub(REPLACEMENT, text)


def cell(value: object, limit: int | None = MAX_CELL) -> str:
    """One line of terminal-safe text, cut at `limit` characters (None, or --wide: never)."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return clean(",".join(str(v) for v in value)) or "-"
    text = clean(" ".join(str(value).split()))  # one line per row, whatever the message holds
    if limit is None or LAYOUT.wide or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; the last column is left ragged, and wrapped under itself
    on a terminal wide enough for it (LAYOUT)."""
    last = len(headers) - 1
    cells = [[cell(v, None if i == last else MAX_CELL) for i, v in enumerate(row)] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    indent = sum(widths[:last]) + 2 * last
    room = None if LAYOUT.wide else (LAYOUT.columns or 0) - indent
    lines = [[cell(h).upper() for h in headers], *cells]
    return "\n".join(
        "  ".join([*(c.ljust(w) for c, w in zip(line[:last], widths)), _fit(line[last], room, indent)]).rstrip()
        for line in lines
    )


def _fit(text: str, room: int | None, indent: int) -> str:
    """The last cell: in full (room None), wrapped into `room` columns, or cut where no terminal is
    known (or it is too narrow to wrap)."""
    if room is None:
        return text
    if room < MIN_WRAP:
        return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
    return ("\n" + " " * indent).join(textwrap.wrap(text, room, break_on_hyphens=False)) or text


ALERT_COLUMNS = ("id", "kind", "severity", "state", "ranks", "step", "acked_by", "message")


def alert_row(alert: dict[str, Any]) -> list[object]:
    return [state_word(alert[c]) if c == "state" else alert.get(c) for c in ALERT_COLUMNS]


def state_word(state: str) -> str:
    """ "ended_unresolved" as a person reads it: the run ended before it got better."""
    return state.replace("_", " ")


def alerts(rows: Sequence[dict[str, Any]]) -> str:
    return table(ALERT_COLUMNS, [alert_row(a) for a in rows]) if rows else "no alerts"


INCIDENT_COLUMNS = ("id", "state", "severity", "root", "ranks", "step", "acked_by", "message")


def incidents(rows: Sequence[dict[str, Any]]) -> str:
    """One line per incident, its root first; what to do about it (and where the alert reference
    says more), then its other alerts folded under it, indented."""
    if not rows:
        return "no incidents"
    lines = table(INCIDENT_COLUMNS, [_incident_row(i) for i in rows]).splitlines()
    out = [lines[0]]
    for line, incident in zip(lines[1:], rows):
        out.append(line)
        if remedy := incident.get("remedy"):
            out.append(clean(f"    what to do: {' '.join(remedy['text'].split())} (see {remedy['doc']})"))
        out += [
            f"    └ {cell(c['kind'])} {cell(c['ranks'])} {cell(state_word(c['state']))}: {cell(c['message'])}"
            for c in incident.get("consequences", [])
        ]
    return "\n".join(out)


def _incident_row(incident: dict[str, Any]) -> list[object]:
    root = incident.get("root") or {}
    return [
        incident["id"],
        state_word(incident["state"]),
        incident["severity"],
        root.get("kind"),
        root.get("ranks"),
        root.get("step"),
        incident.get("acked_by"),
        root.get("message"),
    ]


def cost(bill: dict[str, Any]) -> str:
    """A compile bill (GET /runs/KEY/cost) as a headline, the cost by cause, and the costliest lines
    with their remedies."""
    unit = bill.get("device") or "GPU"  # "device" where the ranks did not all say they compute on a GPU
    share = f"{bill['share']:.1%} of the run's {unit} time" if bill.get("share") is not None else "share unknown"
    money = (
        f", {bill['money']:.2f} at {bill['price_per_gpu_hour']} per {unit}-hour"
        if bill.get("money") is not None
        else ""
    )
    basis = bill["basis"]
    head = [
        clean(
            f"{bill['run']}: compilation cost {bill['gpu_seconds'] / 3600:.3f} {unit}-hours "
            f"({bill['gpu_seconds']:.1f} {unit}-seconds), {share}{money}"
        ),
        f"steps billed: {basis['assumed_units']} assumed (world size x slowest rank), {basis['measured_units']} measured",
        f"warm caches saved {bill['savings']['gpu_seconds']:.1f} {unit}-seconds ({bill['savings']['hits']} hits)",
    ]
    seconds = f"{unit.lower()}_seconds"  # the column's unit; the JSON keeps its keys (gpu_seconds)
    causes = table(("cause", seconds), [[c, round(s, 1)] for c, s in bill["causes"].items() if s])
    lines = table(
        ("frame", "cause", "reason", seconds, "compiles", "ranks", "remedy"),
        [
            [
                x["label"],
                x["cause"],
                x["reason"] or None,
                round(x["gpu_seconds"], 1),
                x["compiles"],
                x["rank_count"],
                x["remedy"],
            ]
            for x in bill["lines"][:20]
        ],
    )
    return (
        "\n".join(head)
        + "\n\n"
        + (causes if bill["lines"] else "no compiles")
        + ("\n\n" + lines if bill["lines"] else "")
    )
