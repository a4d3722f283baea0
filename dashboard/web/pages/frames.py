"""One compiled frame of a run: its slots (consensus and dissenters), recompile reasons, and
a unified diff of what the majority and a dissenting rank compiled.

The diff is over each rank's compile record (hashes per artifact, counts, cache outcomes,
reasons: the evidence the alert was raised on) followed by the normalized artifact texts the
blob store holds (Dynamo graph, Inductor code), so the changed graph lines show up too.
Slot dissenters are about the Dynamo graph; where the ranks traced one graph, the ranks a firing
alert of that compile names (cache, failure, artifact) are the dissenters instead. Ranks that
traced one graph can still differ in the Inductor code (rank_specific_artifact), so the code gets
its own majority vs minority diff.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from dashboard.detection.consensus import consensus
from dashboard.detection.models import Alert
from dashboard.evidence import reads
from dashboard.evidence.models import CompileEvent, GraphBreakEvent
from dashboard.ledger.models import CompileSlot
from dashboard.tenancy.models import Run
from dashboard.web import sql
from dashboard.web.pages.compare import run_environment, stored_frames, torch_label


@dataclass
class DiffLine:
    kind: str  # add | del | hunk | ctx | head | note
    text: str


@dataclass
class CodeDiff:
    """The Inductor code of a majority rank against a minority rank of one slot."""

    majority: int
    minority: list[int]  # every rank whose code differs from the majority's
    note: str = ""
    lines: list[DiffLine] = field(default_factory=list)


def compile_record(event: CompileEvent | reads.CompileReport) -> str:
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
    texts = reads.graph_texts(event.run_id, [h for _, h in artifacts])
    for name, h in artifacts:
        if h in texts:
            lines += ["", f"=== {name} (normalized) ===", *texts[h].splitlines()]
    return "\n".join(lines)


DIFF_MAX_CHARS = 400_000  # difflib is quadratic at worst: longer texts are not diffed inside a request


def unified_diff(a: str, b: str, a_name: str, b_name: str) -> list[DiffLine]:
    if len(a) + len(b) > DIFF_MAX_CHARS:
        return [
            DiffLine(
                "note",
                f"{a_name} ({len(a)} characters) and {b_name} ({len(b)} characters) are too large "
                f"to diff in a page (limit {DIFF_MAX_CHARS} together)",
            )
        ]
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


def reasons(run: Run, frame: str) -> list[dict[str, Any]]:
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


def graph_breaks(run: Run, frame: str) -> list[dict[str, str]]:
    rows = GraphBreakEvent.objects.filter(run=run, frame=frame).values_list("reason").distinct()[:100]
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


def slot_diff(
    run: Run, slot: CompileSlot, alerted: dict[int, list[int]]
) -> tuple[int | None, int | None, list[DiffLine], CodeDiff | None]:
    """Majority rank vs the first dissenter of one slot (where the ranks traced one graph: the first rank
    an alert of this compile names), and the same for its Inductor code."""
    events = reads.compile_reports(run.id, slot.frame, slot.index).by_rank()
    if not events:
        return None, None, [], None
    code = code_diff(events)
    odd = slot.dissenters or alerted.get(slot.index, [])
    dissenters = [r for r in odd if r in events]
    majority = min((r for r in events if r not in odd), default=None)
    if majority is None or not dissenters:
        return majority, None, [], code
    minority = dissenters[0]
    diff = unified_diff(
        compile_record(events[majority]),
        compile_record(events[minority]),
        f"rank {majority} (majority)",
        f"rank {minority} (dissenter)",
    )
    return majority, minority, diff, code


def code_diff(events: dict[int, reads.CompileReport]) -> CodeDiff | None:
    """Normalized Inductor code of the majority vs the first minority rank; where the normalized code
    agrees but the raw code does not, the difference is only rank-specific text, said in words."""
    norms = {r: e.code_norm for r, e in events.items() if e.code_norm}
    if len(set(norms.values())) > 1:
        verdict = consensus(norms)
        majority = min(r for r in norms if r not in verdict.dissenters)
        minority = verdict.dissenters[0]
        texts = reads.graph_texts(events[majority].run_id, [norms[majority], norms[minority]])
        a, b = (texts.get(norms[r], f"(normalized code {norms[r]} not uploaded yet)") for r in (majority, minority))
        return CodeDiff(
            majority,
            list(verdict.dissenters),
            lines=unified_diff(a, b, f"rank {majority} (majority) Inductor code", f"rank {minority} Inductor code"),
        )
    raws = {r: e.code_raw for r, e in events.items() if e.code_raw}
    if len(set(raws.values())) > 1:
        verdict = consensus(raws)
        return CodeDiff(
            min(r for r in raws if r not in verdict.dissenters),
            list(verdict.dissenters),
            note="differs only in rank-specific text (device index / rank) that normalization removes",
        )
    return None


def alerted(run: Run, frame: str) -> dict[int, list[int]]:
    """Compile index -> the ranks the newest firing alert of this frame about that compile names."""
    found = (
        Alert.objects.filter(run=run, frame=frame, state=Alert.State.FIRING)
        .exclude(ranks=[])
        .order_by("-last_seen")
        .values_list("details", "ranks")[:50]
    )
    return {d["index"]: ranks for d, ranks in reversed(list(found)) if isinstance(d.get("index"), int)}


def count_dissent(run: Run, found: list[CompileSlot]) -> dict[int, str]:
    """Compile index -> its dissenters in words, for recompiles only some ranks reported: the side
    that is fewer, as `recompile_divergence` names it ("1 (recompiled alone)", "2 (did not recompile)").
    A slot's own dissenters are about the graphs of the ranks that reported it, and a lone recompile
    has none: the rank that recompiled while the others did not is the odd one out."""
    partial = [s.index for s in found if s.index > 0 and 0 < s.reported < run.world_size]
    if not partial:
        return {}
    reporters = sql.rows(
        """
        SELECT index, array_agg(DISTINCT rank ORDER BY rank) FROM {compile_events}
        WHERE run_id = %s AND frame = %s AND index = ANY(%s) GROUP BY index
        """,
        [run.id, found[0].frame, partial],
    )
    out = {}
    for index, compiled in reporters:
        skipped = sorted(set(range(run.world_size)) - set(compiled))
        if len(compiled) <= len(skipped):
            out[index] = f"{rank_ranges(compiled)} (recompiled{' alone' if len(compiled) == 1 else ''})"
        else:
            out[index] = f"{rank_ranges(skipped)} (did not recompile)"
    return out


def choose(
    found: list[CompileSlot], index: int | None, alerted: dict[int, list[int]], odd: dict[int, str]
) -> CompileSlot | None:
    """The slot asked for, else the first with dissenters (of its graph, or of who recompiled it), else
    the first an alert names, else the first."""
    by_index = {s.index: s for s in found}
    if index is not None and index in by_index:
        return by_index[index]
    dissent = next((s for s in found if s.dissenters or s.index in odd), None)
    named = next((by_index[i] for i in sorted(alerted) if i in by_index), None)
    return dissent or named or (found[0] if found else None)


def frame_view(run: Run, frame: str, index: int | None) -> dict[str, Any]:
    found = slots(run, frame)
    flagged = alerted(run, frame)
    odd = count_dissent(run, found)
    chosen = choose(found, index, flagged, odd)
    majority, minority, diff, code = slot_diff(run, chosen, flagged) if chosen else (None, None, [], None)
    return {
        "frame": frame,
        "slots": [
            {
                "slot": s,
                "dissenters": rank_ranges(sorted(s.dissenters)) or odd.get(s.index, ""),
                "reference": json.dumps(s.consensus.get("reference")) if s.consensus else "",
            }
            for s in found
        ],
        "chosen_odd": odd.get(chosen.index, "") if chosen else "",
        "chosen": chosen,
        "majority": majority,
        "minority": minority,
        "diff": diff,
        "code": code,
        "code_ranks": (("rank " if len(code.minority) == 1 else "ranks ") + rank_ranges(code.minority)) if code else "",
        "reasons": reasons(run, frame),
        "breaks": graph_breaks(run, frame),
    }


def aligned_events(run: Run, key: str) -> list[CompileEvent]:
    """Compile records of an aligned frame key (`compare.align_key`) on the lowest rank."""
    events = CompileEvent.objects.filter(run=run, frame__in=stored_frames(run, key))
    first = events.order_by("rank").values_list("rank", flat=True).first()
    return list(events.filter(rank=first).order_by("index")) if first is not None else []


def cross_run_diff(a: Run, b: Run, key: str) -> list[DiffLine]:
    """The same frame in two runs (e.g. torch 2.11 vs 2.13), every compile of the lowest rank."""

    def text(run: Run) -> str:
        return "\n\n".join(compile_record(e) for e in aligned_events(run, key))

    return unified_diff(
        text(a),
        text(b),
        f"{a.key} (torch {torch_label(run_environment(a))})",
        f"{b.key} (torch {torch_label(run_environment(b))})",
    )
