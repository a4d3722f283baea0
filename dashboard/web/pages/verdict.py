"""The version verdict at the top of the compare page: what got worse, frame by frame, and whether
training drifted, said in a few lines (and the same as JSON in `/api/v1/compare`).

Each run after the first is held against the first. A frame got worse when its compile time grew
by TIME_RATIO or more, or it recompiled more, broke more, needs more guards or kernels, or hit the
cache less; frames with the most of those come first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dashboard.web.pages.drift import SeriesDrift

TIME_RATIO = 1.25
# (metric, the cell's field, True when a larger value is worse)
METRICS = (
    ("compile time", "time_s", True),
    ("recompiles", "recompiles", True),
    ("graph breaks", "graph_breaks", True),
    ("guards", "guards", True),
    ("kernels", "kernels", True),
    ("cache hit rate", "cache_hit_rate", False),
)


def time_ratio(base: dict[str, Any], other: dict[str, Any]) -> float | None:
    if not base["time_s"]:
        return None
    ratio: float = other["time_s"] / base["time_s"]
    return round(ratio, 3)


def worse(base: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The metrics in which `other` is worse than `base`."""
    found = []
    for name, field, larger_is_worse in METRICS:
        a, b = base.get(field), other.get(field)
        if a is None or b is None or a == b:
            continue
        if field == "time_s":
            ratio = time_ratio(base, other)
            if ratio is not None and ratio >= TIME_RATIO:
                found.append(name)
        elif (b > a) == larger_is_worse:
            found.append(name)
    return found


def frame_rows(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for frame in frames:
        base, others = frame["cells"][0], frame["cells"][1:]
        against: list[dict[str, Any]] = []
        for other in others:
            if base is None or other is None:
                against.append(
                    {"status": "only in the reference" if other is None else "new", "worse": [], "time_ratio": None}
                )
            else:
                against.append(
                    {"status": "compared", "worse": worse(base, other), "time_ratio": time_ratio(base, other)}
                )
        rows.append(
            {
                "key": frame["key"],
                "label": frame["label"],
                "cells": frame["cells"],
                "against": against,
                "graph_equal": frame["graph_equal"],
            }
        )
    rows.sort(
        key=lambda r: (
            -max((len(a["worse"]) for a in r["against"]), default=0),
            -max((a["time_ratio"] or 0 for a in r["against"]), default=0),
            r["key"],
        )
    )
    return rows


def drift_line(name: str, result: SeriesDrift, tolerance: float) -> str:
    if not result["steps_compared"]:
        return f"{name}: no common steps"
    if result["first_over_tolerance"] is None:
        return f"{name} within tolerance {tolerance:g} through step {result['within_tolerance_through']}"
    return (
        f"{name} drifts past {tolerance:g} at step {result['first_over_tolerance']} "
        f"(largest {result['max_relative']:.3g} at step {result['max_relative_step']})"
    )


def verdict(runs: list[dict[str, Any]], frames: list[dict[str, Any]], drift: dict[str, Any]) -> dict[str, Any]:
    rows = frame_rows(frames)
    lines = []
    for i, vs in enumerate(drift["vs"], start=1):
        other, base = runs[i], runs[0]
        compared = [r for r in rows if r["against"][i - 1]["status"] == "compared"]
        got_worse = [r for r in compared if r["against"][i - 1]["worse"]]
        head = (
            f"{other['key']} (torch {other['torch_version']}) vs {base['key']} (torch {base['torch_version']}): "
            f"{len(compared)} of {len(rows)} frames aligned, {len(got_worse)} got worse"
        )
        if got_worse:
            first = got_worse[0]
            head += f", first {first['label']} ({', '.join(first['against'][i - 1]['worse'])})"
        lines.append(head)
        lines += [
            drift_line(name.replace("_", " "), vs[name], drift["tolerance"])
            for name in ("loss", "grad_norm")
            if vs[name]["steps_compared"]
        ]
    return {"lines": lines, "frames": rows}
