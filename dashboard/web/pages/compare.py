"""Runs side by side, typically one job under two PyTorch versions.

Everything is aggregated per run in PostgreSQL. Frames are aligned on a key without line numbers
or directories (`align_key`): the same code keeps its key when torch moves lines, when another
install prefix or working directory changes the path, and in runs stored before the agent sent
today's frame keys (`agents.normalize.canonical_frame` brings those to today's form when read).
"""

from __future__ import annotations

import re
from typing import Any

from agents.normalize import canonical_frame, frame_label, split_frame
from agents.protocol import PER_LAUNCH_ENV
from dashboard.detection import bills, cost
from dashboard.detection.rules import COMPILER_ENV
from dashboard.tenancy.models import Rank, Run
from dashboard.web import sql
from dashboard.web.pages import drift as drifting
from dashboard.web.pages import verdict as verdicts
from dashboard.web.pages.timeline import OUTCOME_SQL

CURVE_BINS = 200
CURVE_RANKS = 16  # ranks sampled for the step-time curve (index probes: CURVE_BINS x CURVE_RANKS at most)
VERSION_RANKS = 64  # ranks whose versions are merged, so a value one rank lacks is not lost
ENV_SECTIONS = (
    "versions",
    "settings",
    "config_hash",
    "device",
    "collective_timeout_s",
    "fp_algo",
    "norm_v",
    "env",
    "cache_dirs",
)
QUALNAME = re.compile(r"[\w<>]+(?:\.[\w<>]+)+")  # Block.forward, main.<locals>.step
UNKNOWN = "unknown"
DEFAULT = "default"  # a compiler setting the agent did not report is at torch's default
SETTING_PREFIXES = ("settings.", *(f"env.{prefix}" for prefix in COMPILER_ENV), "env.NCCL_")


def align_key(frame: str) -> str:
    """'file.py:name': the file name and the last part of the function's name, as stable as a frame
    key can be across installs and versions (a qualified name the agent could not read is bare)."""
    path, _, name = split_frame(canonical_frame(frame))
    short = name.rsplit(".", 1)[-1] if QUALNAME.fullmatch(name) else name
    return f"{path.rsplit('/', 1)[-1]}:{short}"


# --- environment -------------------------------------------------------------------------


def flat_info(info: dict[str, Any]) -> dict[str, str]:
    """rank_start info as flat 'section.key' -> text rows (versions.torch, env.NCCL_..., ...); the
    variables that name one launch (sent by agents before they left them out) are not the job's."""
    flat: dict[str, str] = {}
    for section in ENV_SECTIONS:
        value = info.get(section)
        if isinstance(value, dict):
            flat.update(
                {f"{section}.{k}": str(v) for k, v in value.items() if not (section == "env" and k in PER_LAUNCH_ENV)}
            )
        elif value not in (None, ""):
            flat[section] = str(value)
    return flat


def run_environment(run: Run) -> dict[str, str]:
    """The lowest rank's environment, with every version any of the first ranks knows."""
    ranks = Rank.objects.filter(run=run).exclude(info={}).order_by("rank")
    first = ranks.values_list("info", flat=True).first()
    env = flat_info(first) if first else {}
    for versions in ranks.values_list("info__versions", flat=True)[:VERSION_RANKS]:
        for key, value in (versions or {}).items() if isinstance(versions, dict) else ():
            if value not in (None, ""):
                env.setdefault(f"versions.{key}", str(value))
    if run.torch_version:
        env.setdefault("versions.torch", run.torch_version)
    env["world_size"] = str(run.world_size)
    return env


def missing(field: str, env: dict[str, str]) -> str:
    """What a field a run lacks means: a version nobody sent is unknown; a setting the agent did not
    send is at torch's default; a trace names none, so in a replayed run it is unknown."""
    if field.startswith("versions."):
        return UNKNOWN
    if not field.startswith("settings."):
        return ""
    return UNKNOWN if env.get("env.LOCKSTEP_SOURCE", "").startswith("replay:") else DEFAULT


def environment_diff(envs: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One row per field: the value in every run and whether they all agree. The raw config hash
    counts as the same when every named setting agrees: agents before the canonical hash hashed
    set-valued settings in the process's hash-seed order, so equal configs hashed apart."""
    fields = sorted(set().union(*envs), key=lambda f: (not f.startswith("versions."), f))
    rows: list[dict[str, Any]] = []
    for field in fields:
        values = [env.get(field) or missing(field, env) for env in envs]
        rows.append({"field": field, "values": values, "same": len(set(values)) == 1})
    settings_agree = all(row["same"] for row in rows if row["field"].startswith("settings."))
    for row in rows:
        if row["field"] == "config_hash" and settings_agree:
            row["same"] = True
    return rows


def settings_diff(environment: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The compiler settings and compiler/collective environment variables that differ."""
    return [
        {"key": row["field"], "values": row["values"]}
        for row in environment
        if not row["same"] and row["field"].startswith(SETTING_PREFIXES)
    ]


# --- compile summary ---------------------------------------------------------------------


def run_compiles(run: Run) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The run's compile summary and, per aligned frame, what its compiles cost and produced (per
    rank), from one pass over the run's compile events (plain aggregates, so PostgreSQL hashes
    instead of sorting). A rank compiles a frame's compile #0 once, so those rows count the frame's
    ranks; the run's ranks are the most any frame has. Ops, guards, kernels and graphs are the
    lowest rank's (the JSON of the other ranks' records is never parsed)."""
    rows = sql.rows(
        f"""
        SELECT frame, count(*) FILTER (WHERE index = 0), count(*), count(*) FILTER (WHERE index > 0), max(index) + 1,
               coalesce(sum(compile_time), 0),
               max((detail->'counts'->>'graph_op_count')::bigint) FILTER (WHERE rank = %(rank)s),
               max((detail->'counts'->>'guard_count')::bigint) FILTER (WHERE rank = %(rank)s),
               sum((detail->'counts'->>'kernel_count')::bigint) FILTER (WHERE rank = %(rank)s),
               count(*) FILTER (WHERE ({OUTCOME_SQL}) = 'hit'), count(*) FILTER (WHERE status <> 'ok'),
               array_agg(graph_norm) FILTER (WHERE rank = %(rank)s)
        FROM {{compile_events}} WHERE run_id = %(run)s GROUP BY frame
        """,
        {"run": run.id, "rank": drifting.lowest_rank(run)},
    )
    breaks = dict(sql.rows("SELECT frame, count(*) FROM {graph_breaks} WHERE run_id = %s GROUP BY frame", [run.id]))
    cells = {}
    for frame, ranks, n, recompiles, slots, time_s, ops, guards, kernels, hits, failures, graphs in rows:
        per = max(ranks, 1)
        cells[canonical_frame(frame)] = {
            "frame": frame,
            "label": frame_label(frame),
            "ranks": ranks,
            "compiles": round(n / per, 2),
            "recompiles": round(recompiles / per, 2),
            "time_s": round(time_s / per, 3),
            "ops": ops,
            "guards": guards,
            "kernels": float(kernels) if kernels is not None else None,
            "cache_hit_rate": round(hits / n, 3) if n else None,
            "failures": failures,
            "graph_breaks": round(breaks.get(frame, 0) / per, 2),
            "graphs": sorted({g for g in graphs or () if g}),
            "_totals": (n, recompiles, slots, time_s, hits, failures),
        }
    return summarize(cells, sum(breaks.values())), _by_align_key(cells)


def summarize(cells: dict[str, dict[str, Any]], breaks: int) -> dict[str, Any]:
    ranks = max((c["ranks"] for c in cells.values()), default=0)
    per = max(ranks, 1)
    n, recompiles, graphs, time_s, hits, failures = (
        (sum(t) for t in zip(*(c.pop("_totals") for c in cells.values()))) if cells else (0, 0, 0, 0.0, 0, 0)
    )
    return {
        "compile_time_s": round(time_s / per, 3),  # per rank: what each rank spent compiling
        "graphs": graphs,
        "compiles": n,
        "recompiles": round(recompiles / per, 2),
        "graph_breaks": round(breaks / per, 2),
        "cache_hit_rate": round(hits / n, 3) if n else None,
        "failures": failures,
        "ranks_reporting": ranks,
    }


def _by_align_key(cells: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Keyed by `align_key`, except frames of one run that share it: they keep 'path:name'."""
    keys = [align_key(c) for c in cells]
    out = {}
    for (canonical, cell), key in zip(cells.items(), keys):
        if keys.count(key) > 1:
            path, _, name = split_frame(canonical)
            key = f"{path}:{name}"
        out[key] = cell
    return out


def frame_alignment(per_run: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    keys = sorted(set().union(*per_run))
    rows = []
    for key in keys:
        cells = [frames.get(key) for frames in per_run]
        present = [c for c in cells if c]
        same = len(present) == len(cells) and len({tuple(c["graphs"]) for c in present}) == 1
        label = next(c["label"] for c in cells if c)
        rows.append(
            {"key": key, "label": label, "cells": cells, "aligned": len(present) == len(cells), "graph_equal": same}
        )
    rows.sort(key=lambda r: (r["aligned"], r["graph_equal"], r["key"]))
    return rows


def stored_frames(run: Run, key: str) -> list[str]:
    """The frame keys as stored in `run` behind one aligned key (for the graph diff)."""
    found = run_compiles(run)[1].get(key)
    return [found["frame"]] if found else []


# --- fingerprints and step times ---------------------------------------------------------


def first_fingerprint_difference(base: Run, other: Run) -> dict[str, Any]:
    """First step whose consensus gradient fingerprints differ between the runs (same group)."""
    step, group, compared = sql.rows(
        """
        SELECT min(a.step) FILTER (WHERE a.consensus->'reference' IS DISTINCT FROM b.consensus->'reference'),
               (array_agg(a."group" ORDER BY a.step) FILTER (WHERE a.consensus->'reference' IS DISTINCT FROM b.consensus->'reference'))[1],
               count(*)
        FROM {grad_slots} a JOIN {grad_slots} b ON a.step = b.step AND a."group" = b."group"
        WHERE a.run_id = %s AND b.run_id = %s AND a.consensus <> '{}'::jsonb AND b.consensus <> '{}'::jsonb
        """,
        [base.id, other.id],
    )[0]
    return {"run": other.key, "first_step": step, "group": group, "steps_compared": compared}


def step_curve(run: Run, bins: int = CURVE_BINS) -> list[list[float]]:
    """[step, mean step time, max step time] at up to `bins` steps spread over the run, over its
    first CURVE_RANKS ranks: index probes only, so the work is bounded however long and wide the run
    (a run of at most `bins` steps and CURVE_RANKS ranks is shown whole)."""
    ranks = list(Rank.objects.filter(run=run).order_by("rank").values_list("rank", flat=True)[:CURVE_RANKS])
    lo, hi = sql.rows(
        """
        SELECT min(x.lo), max(x.hi) FROM unnest(%s::int[]) AS r(rank),
          LATERAL (SELECT min(step) AS lo, max(step) AS hi FROM {step_reports} WHERE run_id = %s AND rank = r.rank) x
        """,
        [ranks, run.id],
    )[0]
    if lo is None:
        return []
    width = max(1, -(-(hi - lo + 1) // bins))
    rows = sql.rows(
        """
        SELECT step, avg(step_time), max(step_time) FROM {step_reports}
        WHERE run_id = %s AND rank = ANY(%s::int[]) AND step = ANY(%s::bigint[]) AND step_time IS NOT NULL
        GROUP BY step ORDER BY 1
        """,
        [run.id, ranks, list(range(lo, hi + 1, width))],
    )
    return [[s, round(a, 6), round(m, 6)] for s, a, m in rows]


def torch_label(env: dict[str, str]) -> str:
    return env.get("versions.torch") or UNKNOWN


def compare_costs(runs: list[Run]) -> dict[str, Any]:
    """Each run's compile bill (`detection.cost`), and per aligned frame each run's GPU-seconds and the
    cause that cost most there: what a PyTorch upgrade did to compile cost. `device`: what the seconds
    are of, "GPU" only where every rank of every run said it computes on a CUDA device (`cost.devices`)."""
    per_run = [bills.current_bill(run) for run in runs]
    frames: dict[str, list[Any]] = {}
    labels: dict[str, str] = {}
    for i, bill in enumerate(per_run):
        for f in bill["frames"]:
            key = align_key(f["frame"])
            labels.setdefault(key, f["label"])
            top = f["lines"][0]
            frames.setdefault(key, [None] * len(runs))[i] = {
                "gpu_seconds": f["gpu_seconds"],
                "cause": top["cause"],
                "reason": top["reason"],
            }
    rows = [{"key": k, "label": labels[k], "cells": cells} for k, cells in frames.items()]
    rows.sort(key=lambda r: (-max((c["gpu_seconds"] for c in r["cells"] if c), default=0.0), r["key"]))
    return {
        "runs": [
            {
                "key": r.key,
                "gpu_seconds": b["gpu_seconds"],
                "share": b["share"],
                "causes": b["causes"],
                "savings": b["savings"]["gpu_seconds"],
                "money": b["money"],
            }
            for r, b in zip(runs, per_run)
        ],
        "frames": rows,
        "device": cost.devices_of(Rank.objects.filter(run__in=runs)),
    }


def compare(runs: list[Run], tolerance: float = drifting.DEFAULT_TOLERANCE) -> dict[str, Any]:
    """The compare page and `GET /api/v1/compare` body; the first run is the reference."""
    envs = [run_environment(r) for r in runs]
    environment = environment_diff(envs)
    compiles = [run_compiles(r) for r in runs]
    frames = frame_alignment([per_frame for _, per_frame in compiles])
    numeric = drifting.drift(runs, tolerance)
    runs_json = [
        {"key": r.key, "name": r.name, "torch_version": torch_label(env), "world_size": r.world_size}
        for r, env in zip(runs, envs)
    ]
    return {
        "runs": runs_json,
        "verdict": verdicts.verdict(runs_json, frames, numeric),
        "environment": environment,
        "settings": settings_diff(environment),
        "compile_summary": [summary for summary, _ in compiles],
        "frames": frames,
        "fingerprints": [first_fingerprint_difference(runs[0], other) for other in runs[1:]],
        "drift": numeric,
        "step_times": {r.key: step_curve(r) for r in runs},
        "cost": compare_costs(runs),
    }
