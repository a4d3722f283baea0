"""rank_specific_artifact: ranks that really share an Inductor cache directory look up one FX-graph
cache key but need different code for it, so one rank's cache entry is wrong for another
(pytorch #188332 class).

Sharing is about the place, not the path string: the same resolved path on one host, or the same
path on one network filesystem (fsid) that every host mounts; two hosts' /tmp/torchinductor_root
are two caches. Keys that differ per rank (multi-GPU nodes: the device index is in the key) are
harmless, each rank gets its own entry, so ranks are compared only under one key in one directory:

- warning: ranks that compiled it (cache miss) produced different code: the last writer wins;
- critical: a rank loaded it (cache hit) while the ranks differ in what shapes generated code but
  not the key (the CPU vector ISA; the GPU a rank runs on, where the graphs name it): some rank
  runs code generated for another's target. Reproduced on torch 2.13: an AVX2 rank loading AVX512 code got 496 of 1000
  outputs wrong. Also critical when a loaded artifact is byte-identical to the code a rank with
  other codegen facts compiled, whatever keys were reported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import NamedTuple

from dashboard.detection import subjects
from dashboard.detection.consensus import Consensus, consensus
from dashboard.detection.rules import (
    CompileSlotView,
    Finding,
    cache_key,
    compile_outcome,
    first_step,
    ranks_text,
    rule,
    settings_split,
    short_key,
)

Location = tuple[str, str, str]  # ("host", host, path) or ("fs", fsid, path): equal tuples are one directory


class Dir(NamedTuple):
    """A shared cache directory: its path, and in words where it is (host, or network filesystem)."""

    path: str
    text: str


FIX = "clear the shared cache dir or give each node type its own TORCHINDUCTOR_CACHE_DIR"


def cache_location(info: dict) -> Location | None:
    """Where a rank's Inductor cache really is; old agents (no `cache_fs`) only tell host and path."""
    fs = (info.get("cache_fs") or {}).get("inductor") or {}
    if fs.get("shared") and fs.get("fsid") and fs.get("path"):
        return ("fs", fs["fsid"], fs["path"])
    path = fs.get("path") or (info.get("cache_dirs") or {}).get("inductor")
    return ("host", info["host"], path) if path and info.get("host") else None


def describe(location: Location, info: dict) -> Dir:
    kind, where, path = location
    if kind == "host":
        return Dir(path, f"{path} on host {where}")
    fs = ((info.get("cache_fs") or {}).get("inductor") or {}).get("fs") or "network"
    return Dir(path, f"{path} ({fs} filesystem shared by the hosts)")


def codegen_facts(info: dict, device: bool) -> dict[str, str]:
    """What shapes generated code but not the cache key: the agent's `codegen` facts, and the GPU."""
    facts = {name: str(value) for name, value in (info.get("codegen") or {}).items()}
    if device and (info.get("device") or "cpu") != "cpu":
        facts["device"] = info["device"]
    return facts


def facts_of(view: CompileSlotView, ranks: list[int]) -> dict[int, dict]:
    """Codegen facts of these ranks; the GPU counts only where their raw Dynamo graphs differ (they name
    the device): a graph of CPU work compiles alike on cuda:0 and cuda:1."""
    named = len({view.reports[r].graph_raw for r in ranks if view.reports[r].graph_raw}) > 1
    return {r: codegen_facts(view.rank_info[r], named) for r in ranks}


def comparable(facts: dict[int, dict]) -> dict[int, tuple]:
    """Only facts every rank reported: an old agent's missing fact is unknown, not different."""
    names = set.intersection(*(set(f) for f in facts.values()))
    return {r: tuple(sorted((n, f[n]) for n in names)) for r, f in facts.items()}


def codegen_split(facts: dict[int, dict]) -> tuple[Consensus, str]:
    """Ranks whose codegen facts differ from the majority (tie: the lowest rank's), and how, in words."""
    values = comparable(facts)
    verdict = consensus(values)
    reference = dict(verdict.reference)
    parts = []
    for name, ref in sorted(reference.items()):
        odd = defaultdict(list)
        for r in verdict.dissenters:
            if (value := dict(values[r])[name]) != ref:
                odd[value].append(r)
        runs = [f"{ranks_text(rs)} run{'s' if len(rs) == 1 else ''} with {name}={v}" for v, rs in sorted(odd.items())]
        if runs:
            parts.append(", ".join(runs[:3]) + (", …" if len(runs) > 3 else "") + f", the others {ref}")
    return verdict, "; ".join(parts)


def code_diff(events: list) -> str | None:
    """How the code of these compiles differs: only in rank-specific text (normalized equal) or in itself."""
    raws = {e.code_raw for e in events if e.code_raw}
    norms = {e.code_norm for e in events if e.code_norm}
    if len(norms) > 1:
        return "generated code"
    return "rank-specific text only" if len(raws) > 1 else None


def foreign_loads(view: CompileSlotView, ranks: list[int], facts: dict[int, dict]) -> dict[int, int]:
    """Rank that loaded code (hit) -> a rank of other codegen facts that compiled exactly that code."""
    writers = defaultdict(list)
    for r in ranks:
        if _outcome(view.reports[r]) == "miss" and view.reports[r].code_raw:
            writers[view.reports[r].code_raw].append(r)
    found = {}
    for r in ranks:
        if _outcome(view.reports[r]) != "hit":
            continue
        other = [w for w in writers.get(view.reports[r].code_raw, []) if _differ(facts, r, w)]
        if other:
            found[r] = other[0]
    return found


def _differ(facts: dict[int, dict], a: int, b: int) -> bool:
    pair = comparable({a: facts[a], b: facts[b]})
    return pair[a] != pair[b]


def _outcome(event) -> str | None:
    return compile_outcome(event.cache or {})


def _details(view: CompileSlotView, key: str, place: Dir, ranks: list[int], facts: dict[int, dict]) -> dict:
    """Every fact the alert rests on; `diff` compares fresh compiles only (loaded code prints otherwise)."""
    return {
        "index": view.index,
        "key": key,
        "shared_dir": place.path,
        "location": place.text,
        "sharing_ranks": ranks,
        "codegen": {str(r): facts[r] for r in ranks},
        "code": {str(r): {"raw": view.reports[r].code_raw, "norm": view.reports[r].code_norm} for r in ranks},
        "cache": {str(r): _outcome(view.reports[r]) for r in ranks},
        "diff": code_diff([view.reports[r] for r in ranks if _outcome(view.reports[r]) == "miss"]),
    }


def judge(view: CompileSlotView, key: str, place: Dir, ranks: list[int]) -> Iterator[Finding]:
    """Ranks of one directory under one key: a load across codegen facts, or different code written."""
    facts = facts_of(view, ranks)
    split, how = codegen_split(facts)
    loaded = [r for r in ranks if _outcome(view.reports[r]) == "hit"]
    if loaded and split.dissenters:
        yield Finding(
            severity="critical",
            ranks=split.dissenters,
            step=first_step(view.reports, ranks),
            frame=view.frame,
            message=f"{view.frame} (compile #{view.index}): {ranks_text(ranks)} share Inductor cache dir {place.text} "
            f"and FX key {short_key(key)}, but {how}; {ranks_text(loaded)} loaded the artifact from the cache, so "
            f"at least one rank runs code generated for another rank's target (wrong results or crashes): {FIX}",
            details={
                **_details(view, key, place, ranks, facts),
                "loaded": loaded,
                "loaded_from": _keyed(foreign_loads(view, ranks, facts)),
                "tie": split.tie,
                "hint": FIX,
            },
        )
        return
    written = {
        r: view.reports[r].code_raw for r in ranks if _outcome(view.reports[r]) == "miss" and view.reports[r].code_raw
    }
    if len(set(written.values())) < 2:
        return
    verdict = consensus(written)
    details = _details(view, key, place, ranks, facts)
    note, split = settings_split(view)
    what = (
        "differ only in rank-specific text (device index, rank)"
        if details["diff"] == "rank-specific text only"
        else "differ in the generated code itself"
    )
    fix = "give each rank (or node type) its own TORCHINDUCTOR_CACHE_DIR"
    yield Finding(
        severity="warning",
        ranks=verdict.dissenters,
        step=first_step(view.reports, verdict.dissenters),
        frame=view.frame,
        message=f"{view.frame} (compile #{view.index}): {ranks_text(written)} share Inductor cache dir {place.text} and "
        f"compiled different code under the same FX key {short_key(key)}: the texts {what}"
        + (f"; {how}" if how else "")
        + (f"; {note}" if note else "")
        + f". Whichever rank wrote last, the others will load its code: {fix}",
        details={**details, "tie": verdict.tie, "hint": fix, **({"settings": split} if split else {})},
    )


def _keyed(mapping: dict[int, int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(mapping.items())}


def sharing_groups(view: CompileSlotView) -> dict[Location, list[int]]:
    """Ranks per cache directory they really share (directories of one rank left out)."""
    by_location = defaultdict(list)
    for rank in sorted(view.reports):
        location = cache_location(view.rank_info.get(rank) or {})
        if location:
            by_location[location].append(rank)
    return {location: ranks for location, ranks in by_location.items() if len(ranks) >= 2}


def problems(view: CompileSlotView) -> Iterator[Finding]:
    for location, ranks in sharing_groups(view).items():
        place = describe(location, view.rank_info[ranks[0]])
        by_key = defaultdict(list)
        for r in ranks:
            if key := cache_key((view.reports[r].detail or {}).get("cache_keys") or {}):
                by_key[key].append(r)
        for key, sharing in sorted(by_key.items()):
            if len(sharing) >= 2:
                yield from judge(view, key, place, sharing)
        yield from proven_loads(view, place, ranks)


def proven_loads(view: CompileSlotView, place: Dir, ranks: list[int]) -> Iterator[Finding]:
    """A loaded artifact that is exactly what a rank of other codegen facts compiled, whatever the keys said."""
    facts = facts_of(view, ranks)
    found = foreign_loads(view, ranks, facts)
    if not found:
        return
    loaded = tuple(sorted(found))
    yield Finding(
        severity="critical",
        ranks=loaded,
        step=first_step(view.reports, loaded),
        frame=view.frame,
        message=f"{view.frame} (compile #{view.index}): from the shared Inductor cache dir {place.text}, "
        + "; ".join(
            f"rank {r} ({_facts_text(facts[r])}) loaded the code rank {w} compiled ({_facts_text(facts[w])})"
            for r, w in sorted(found.items())
        )
        + f": {FIX}",
        details={
            **_details(view, "", place, ranks, facts),
            "loaded": list(loaded),
            "loaded_from": _keyed(found),
            "hint": FIX,
        },
    )


def _facts_text(facts: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(facts.items())) or "unknown"


@rule("rank_specific_artifact", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def rank_specific_artifact(view: CompileSlotView):
    """One alert per frame: the worst problem of the slot (a load across targets before different writes)."""
    found = list(problems(view))
    critical = [f for f in found if f.severity == "critical"]
    if found:
        yield (critical or found)[0]
