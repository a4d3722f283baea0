"""One compiled frame of a run: its slots (consensus and dissenters), recompile reasons, and
a unified diff of what the majority and a dissenting rank compiled.

The diff is over each rank's compile record (hashes per artifact, counts, cache outcomes,
reasons: the evidence the alert was raised on) followed by the normalized artifact texts the
blob store holds (Dynamo graph, Inductor code), so the changed graph lines show up too.
"""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass

from dashboard.ledger.models import CompileSlot
from dashboard.tenancy.models import Run
from dashboard.web import sql
from ingest.models import CompileEvent, GraphBreakEvent


@dataclass
class DiffLine:
    kind: str  # add | del | hunk | ctx | head
    text: str


def graph_texts(hashes: list[str]) -> dict[str, str]:
    """Normalized artifact texts by hash, from ingest's content-addressed blob store when present."""
    from django.apps import apps

    try:
        blob = apps.get_model("ingest", "Blob")
    except LookupError:
        return {}
    return dict(blob.objects.filter(hash__in=hashes, text__isnull=False).values_list("hash", "text"))


def compile_record(event: CompileEvent) -> str:
    """A rank's compile as stable, diffable text (no rank-specific fields such as ts or pid)."""
    detail = event.detail or {}
    lines = [
        f"frame: {event.frame}",
        f"compile: #{event.index} status={event.status}",
    ]
    if event.fail_type or event.fail_reason:
        lines.append(f"failure: {event.fail_type}: {event.fail_reason}")
    if event.recompile_reason:
        lines.append(f"recompile reason: {event.recompile_reason}")
    for name, h in sorted((detail.get("hashes") or {}).items()):
        lines.append(f"{name} graph (normalized): {h.get('norm')}")
        lines.append(f"{name} graph (raw): {h.get('raw')}")
    for name, value in sorted((detail.get("counts") or {}).items()):
        lines.append(f"{name}: {value}")
    for name, value in sorted((event.cache or {}).items()):
        lines.append(f"cache {name}: {value}")
    for name, value in sorted((detail.get("cache_keys") or {}).items()):
        lines.append(f"cache key {name}: {value}")
    lines.append(f"graph breaks: {detail.get('graph_breaks', 0)}")
    artifacts = sorted((name, h.get("norm")) for name, h in (detail.get("hashes") or {}).items() if h.get("norm"))
    texts = graph_texts([h for _, h in artifacts])
    for name, h in artifacts:
        if h in texts:
            lines += ["", f"=== {name} (normalized) ===", *texts[h].splitlines()]
    return "\n".join(lines)


def unified_diff(a: str, b: str, a_name: str, b_name: str) -> list[DiffLine]:
    out = []
    for line in difflib.unified_diff(a.splitlines(), b.splitlines(), a_name, b_name, lineterm="", n=3):
        if line.startswith(("---", "+++")):
            kind = "head"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append(DiffLine(kind, line))
    return out


def slots(run: Run, frame: str) -> list[CompileSlot]:
    return list(CompileSlot.objects.filter(run=run, frame=frame).order_by("index")[:500])


def reasons(run: Run, frame: str) -> list[dict]:
    """Distinct recompile / failure reasons with the ranks that gave them (ranks listed compactly)."""
    found = sql.rows(
        """
        SELECT index, coalesce(recompile_reason, ''), coalesce(fail_reason, ''), array_agg(DISTINCT rank ORDER BY rank)
        FROM {compile_events} WHERE run_id = %s AND frame = %s
          AND (recompile_reason IS NOT NULL OR fail_reason IS NOT NULL)
        GROUP BY 1, 2, 3 ORDER BY 1 LIMIT 500
        """,
        [run.id, frame],
    )
    return [{"index": i, "reason": r, "failure": f, "ranks": rank_ranges(ranks)} for i, r, f, ranks in found]


def graph_breaks(run: Run, frame: str) -> list[dict]:
    rows = (GraphBreakEvent.objects.filter(run=run, frame=frame).values_list("reason").distinct()[:100])
    return [{"reason": r} for (r,) in rows]


def rank_ranges(ranks: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2, 5, 7-8': readable at 1024 ranks."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def slot_diff(run: Run, slot: CompileSlot) -> tuple[int | None, int | None, list[DiffLine]]:
    """Majority rank vs the first dissenter of one slot."""
    events = {e.rank: e for e in CompileEvent.objects.filter(run=run, frame=slot.frame, index=slot.index).order_by("id")}
    if not events:
        return None, None, []
    dissenters = [r for r in slot.dissenters if r in events]
    majority = min((r for r in events if r not in slot.dissenters), default=None)
    if majority is None or not dissenters:
        return majority, None, []
    minority = dissenters[0]
    diff = unified_diff(compile_record(events[majority]), compile_record(events[minority]),
                        f"rank {majority} (majority)", f"rank {minority} (dissenter)")
    return majority, minority, diff


def frame_view(run: Run, frame: str, index: int | None) -> dict:
    found = slots(run, frame)
    chosen = next((s for s in found if s.index == index), None) if index is not None else None
    chosen = chosen or next((s for s in found if s.dissenters), found[0] if found else None)
    majority, minority, diff = slot_diff(run, chosen) if chosen else (None, None, [])
    return {
        "frame": frame,
        "slots": [{"slot": s, "dissenters": rank_ranges(sorted(s.dissenters)),
                   "reference": json.dumps(s.consensus.get("reference")) if s.consensus else ""} for s in found],
        "chosen": chosen,
        "majority": majority,
        "minority": minority,
        "diff": diff,
        "reasons": reasons(run, frame),
        "breaks": graph_breaks(run, frame),
    }


def aligned_events(run: Run, key: str) -> list[CompileEvent]:
    """Compile records of an aligned frame key ('path:name', see compare.frame_key) on the lowest rank."""
    path, _, name = key.rpartition(":")
    events = CompileEvent.objects.filter(run=run, frame__startswith=f"{path}:", frame__endswith=f":{name}")
    first = events.order_by("rank").values_list("rank", flat=True).first()
    return list(events.filter(rank=first).order_by("index")) if first is not None else []


def cross_run_diff(a: Run, b: Run, key: str) -> list[DiffLine]:
    """The same frame in two runs (e.g. torch 2.11 vs 2.13), every compile of the lowest rank."""
    text = lambda run: "\n\n".join(compile_record(e) for e in aligned_events(run, key))  # noqa: E731
    return unified_diff(text(a), text(b), f"{a.key} (torch {a.torch_version or '?'})",
                        f"{b.key} (torch {b.torch_version or '?'})")
