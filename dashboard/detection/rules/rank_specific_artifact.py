"""rank_specific_artifact: a rank runs Inductor code that is not what its own graph and target give,
because ranks that really share a cache directory looked up one FX-graph key for it (pytorch
#188332: an all_gather fusion baked in another rank's constants under the same key; the CPU ISA
case, reproduced on torch 2.13: an AVX2 rank loading AVX512 code got 496 of 1000 outputs wrong).

Loading code another rank compiled for the same graph is the cache working, never an alert. Only
ranks that traced the same graph are compared (a slot whose normalized Dynamo graphs differ is
graph_divergence's, and this rule stays out of it), and only under one key in one directory.
Sharing is about the place, not the path string: the same resolved path on one host, or the same
path on one network filesystem (fsid) that every host mounts; two hosts' /tmp/torchinductor_root
are two caches. Keys that differ per rank (the device index in the key) are harmless.

- critical: ranks of different targets run byte-identical code that at least one of them loaded
  (a cache hit). A target is what shapes generated code but not the key: the agent's `codegen`
  facts (the CPU vector ISA), and the rank-specific text of the raw graph (device index, rank,
  process group), which counts only where the code carries rank-specific text itself (its raw and
  normalized hashes differ): code without any is right on every rank.
- warning: ranks that compiled it (cache miss) produced different code: the last writer wins, and
  the next run's ranks load its code.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

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

if TYPE_CHECKING:
    from dashboard.evidence.reads import CompileReport

Location = tuple[str, str, str]  # ("host", host, path) or ("fs", fsid, path): equal tuples are one directory

Facts = tuple[tuple[str, str], ...]  # (name, value) pairs in name order: comparable across ranks


class Dir(NamedTuple):
    """A shared cache directory: its path, and in words where it is (host, or network filesystem)."""

    path: str
    text: str


FIX = "clear the shared cache dir or give each node type its own TORCHINDUCTOR_CACHE_DIR"


def cache_location(info: dict[str, Any]) -> Location | None:
    """Where a rank's Inductor cache really is; old agents (no `cache_fs`) only tell host and path."""
    fs = (info.get("cache_fs") or {}).get("inductor") or {}
    if fs.get("shared") and fs.get("fsid") and fs.get("path"):
        return ("fs", fs["fsid"], fs["path"])
    path = fs.get("path") or (info.get("cache_dirs") or {}).get("inductor")
    return ("host", info["host"], path) if path and info.get("host") else None


def describe(location: Location, info: dict[str, Any]) -> Dir:
    kind, where, path = location
    if kind == "host":
        return Dir(path, f"{path} on host {where}")
    fs = ((info.get("cache_fs") or {}).get("inductor") or {}).get("fs") or "network"
    return Dir(path, f"{path} ({fs} filesystem shared by the hosts)")


def codegen_facts(info: dict[str, Any], device: bool) -> dict[str, str]:
    """What shapes generated code but not the cache key: the agent's `codegen` facts, and the GPU
    (in words only: the raw graph is what tells whether the device shapes the code)."""
    facts = {name: str(value) for name, value in (info.get("codegen") or {}).items()}
    if device and (info.get("device") or "cpu") != "cpu":
        facts["device"] = info["device"]
    return facts


def facts_of(view: CompileSlotView, ranks: list[int]) -> dict[int, dict[str, str]]:
    """Codegen facts of these ranks; the GPU is named only where their raw Dynamo graphs differ (they name
    the device): a graph of CPU work compiles alike on cuda:0 and cuda:1."""
    named = len({view.reports[r].graph_raw for r in ranks if view.reports[r].graph_raw}) > 1
    return {r: codegen_facts(view.rank_info[r], named) for r in ranks}


def comparable(facts: Mapping[int, Mapping[str, str]]) -> dict[int, Facts]:
    """Only facts every rank reported: an old agent's missing fact is unknown, not different."""
    names = set.intersection(*(set(f) for f in facts.values()))
    return {r: tuple(sorted((n, f[n]) for n in names)) for r, f in facts.items()}


def codegen_split(facts: Mapping[int, Mapping[str, str]]) -> tuple[Consensus[Facts], str]:
    """Ranks whose codegen facts differ from the majority (tie: the lowest rank's), and how, in words."""
    values = comparable(facts)
    verdict = consensus(values)
    reference = dict(verdict.reference)
    parts = []
    for name, ref in sorted(reference.items()):
        odd: defaultdict[str, list[int]] = defaultdict(list)
        for r in verdict.dissenters:
            if (value := dict(values[r])[name]) != ref:
                odd[value].append(r)
        runs = [f"{ranks_text(rs)} run{'s' if len(rs) == 1 else ''} with {name}={v}" for v, rs in sorted(odd.items())]
        if runs:
            parts.append(", ".join(runs[:3]) + (", …" if len(runs) > 3 else "") + f", the others {ref}")
    return verdict, "; ".join(parts)


def targets(view: CompileSlotView, ranks: list[int]) -> dict[int, tuple[Facts, str]]:
    """Per rank what its own code depends on beyond the key: codegen facts (not the device: the graph
    says whether it matters), and the raw graph where the code carries rank-specific text."""
    facts = comparable({r: codegen_facts(view.rank_info[r], device=False) for r in ranks})
    specific = any(view.reports[r].code_raw != view.reports[r].code_norm for r in ranks)
    return {r: (facts[r], view.reports[r].graph_raw if specific else "") for r in ranks}


def foreign_runs(view: CompileSlotView, ranks: list[int]) -> dict[int, int | None]:
    """Rank that runs code made for another target -> the rank of this run that compiled it (None: an
    earlier run did; then the ranks off the majority target are named)."""
    by_code: defaultdict[str, list[int]] = defaultdict(list)
    for r in ranks:
        if view.reports[r].code_raw:
            by_code[view.reports[r].code_raw].append(r)
    found: dict[int, int | None] = {}
    for sharing in by_code.values():
        loaded = [r for r in sharing if _outcome(view.reports[r]) == "hit"]
        kinds = targets(view, sharing)
        if not loaded or len(set(kinds.values())) < 2:
            continue
        writer = next((r for r in sharing if _outcome(view.reports[r]) == "miss"), None)
        if writer is not None:
            found.update({r: writer for r in loaded if kinds[r] != kinds[writer]})
        else:
            found.update({r: None for r in consensus(kinds).dissenters})
    return found


def code_diff(events: list[CompileReport]) -> str | None:
    """How the code of these compiles differs: only in rank-specific text (normalized equal) or in itself."""
    raws = {e.code_raw for e in events if e.code_raw}
    norms = {e.code_norm for e in events if e.code_norm}
    if len(norms) > 1:
        return "generated code"
    return "rank-specific text only" if len(raws) > 1 else None


def _outcome(event: CompileReport) -> str | None:
    return compile_outcome(event.cache or {})


def _details(
    view: CompileSlotView, key: str, place: Dir, ranks: list[int], facts: dict[int, dict[str, str]]
) -> dict[str, Any]:
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
    """Ranks of one directory under one key: code run on another target than it was made for, or
    different code written."""
    foreign = foreign_runs(view, ranks)
    if foreign:
        yield foreign_finding(view, key, place, ranks, foreign)
        return
    facts = facts_of(view, ranks)
    written = {
        r: view.reports[r].code_raw for r in ranks if _outcome(view.reports[r]) == "miss" and view.reports[r].code_raw
    }
    if len(set(written.values())) < 2:
        return
    _, how = codegen_split(facts)
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


def foreign_finding(
    view: CompileSlotView, key: str, place: Dir, ranks: list[int], foreign: dict[int, int | None]
) -> Finding:
    """Critical: `foreign` (rank -> the rank that compiled what it runs, None: an earlier run) run code
    made for another target."""
    facts = facts_of(view, ranks)
    named = tuple(sorted(foreign))
    loaded = [r for r in ranks if _outcome(view.reports[r]) == "hit"]
    split, how = codegen_split(facts)
    whose = "; ".join(
        f"rank {r} ({_facts_text(facts[r])}) loaded the code rank {w} compiled ({_facts_text(facts[w])})"
        for r, w in sorted(foreign.items())
        if w is not None
    )
    return Finding(
        severity="critical",
        ranks=named,
        step=first_step(view.reports, named),
        frame=view.frame,
        message=f"{view.frame} (compile #{view.index}): {ranks_text(ranks)} share Inductor cache dir {place.text} "
        f"and FX key {short_key(key)}, but {how or 'their graphs differ in rank-specific text and so does the code'}; "
        f"{whose or ranks_text(loaded) + ' loaded the same artifact from the cache'}, so {ranks_text(named)} "
        f"run{'s' if len(named) == 1 else ''} code generated for another rank's target (wrong results or crashes): {FIX}",
        details={
            **_details(view, key, place, ranks, facts),
            "loaded": loaded,
            "loaded_from": {str(r): w for r, w in sorted(foreign.items()) if w is not None},
            "tie": split.tie,
            "hint": FIX,
        },
    )


def sharing_groups(view: CompileSlotView) -> dict[Location, list[int]]:
    """Ranks per cache directory they really share (directories of one rank left out)."""
    by_location: defaultdict[Location, list[int]] = defaultdict(list)
    for rank in sorted(view.reports):
        location = cache_location(view.rank_info.get(rank) or {})
        if location:
            by_location[location].append(rank)
    return {location: ranks for location, ranks in by_location.items() if len(ranks) >= 2}


def problems(view: CompileSlotView) -> Iterator[Finding]:
    if len({e.graph_norm for _, e in view.alike if e.graph_norm}) > 1:
        return  # the ranks traced different graphs: graph_divergence's slot, whatever the cache did
    for location, ranks in sharing_groups(view).items():
        place = describe(location, view.rank_info[ranks[0]])
        by_key: defaultdict[str, list[int]] = defaultdict(list)
        for r in ranks:  # a compile of several graphs reports their keys joined: each is an entry
            for key in cache_key((view.reports[r].detail or {}).get("cache_keys") or {}).split(","):
                if key:
                    by_key[key].append(r)
        for key, sharing in sorted(by_key.items()):
            if len(sharing) >= 2:
                yield from judge(view, key, place, sharing)


def _facts_text(facts: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(facts.items())) or "unknown"


@rule("rank_specific_artifact", CompileSlotView, subject=lambda v: subjects.frame(v.frame))
def rank_specific_artifact(view: CompileSlotView) -> Iterator[Finding]:
    """One alert per frame: the worst problem of the slot (a load across targets before different writes)."""
    found = list(problems(view))
    critical = [f for f in found if f.severity == "critical"]
    if found:
        yield (critical or found)[0]
