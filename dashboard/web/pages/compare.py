"""Runs side by side, typically one job under two PyTorch versions.

Everything is aggregated per run in PostgreSQL; frames are aligned on a key without line
numbers (library frames move between torch versions, the code they compile does not).
"""
from __future__ import annotations

from dashboard.web.pages.timeline import OUTCOME_SQL
from dashboard.tenancy.models import Rank, Run
from dashboard.web import sql

CURVE_BINS = 200
CURVE_RANKS = 64  # ranks sampled for the step-time curve (index probes: CURVE_BINS x CURVE_RANKS at most)
ENV_SECTIONS = ("versions", "config_hash", "device", "collective_timeout_s", "fp_algo", "norm_v", "env", "cache_dirs")



def frame_key(frame: str) -> str:
    """'path:line:name' -> 'path:name': the same code keeps its key when lines shift."""
    parts = frame.rsplit(":", 2)
    return f"{parts[0]}:{parts[2]}" if len(parts) == 3 and parts[1].isdigit() else frame


# --- environment -------------------------------------------------------------------------

def flat_info(info: dict) -> dict[str, str]:
    """rank_start info as flat 'section.key' -> text rows (versions.torch, env.NCCL_..., ...)."""
    flat: dict[str, str] = {}
    for section in ENV_SECTIONS:
        value = info.get(section)
        if isinstance(value, dict):
            flat.update({f"{section}.{k}": str(v) for k, v in value.items()})
        elif value not in (None, ""):
            flat[section] = str(value)
    return flat


def run_environment(run: Run) -> tuple[dict[str, str], int]:
    """The lowest rank's environment, and how many ranks report a different one."""
    infos = list(Rank.objects.filter(run=run).exclude(info={}).order_by("rank").values_list("info", flat=True)[:4096])
    if not infos:
        return {"world_size": str(run.world_size)}, 0
    env = flat_info(infos[0])
    env["world_size"] = str(run.world_size)
    reference = flat_info(infos[0])
    return env, sum(1 for other in infos[1:] if flat_info(other) != reference)


def environment_diff(runs: list[Run]) -> list[dict]:
    """One row per field: the value in every run and whether they all agree."""
    envs = [run_environment(r)[0] for r in runs]
    fields = sorted(set().union(*envs), key=lambda f: (not f.startswith("versions."), f))
    rows = []
    for field in fields:
        values = [env.get(field, "") for env in envs]
        rows.append({"field": field, "values": values, "same": len(set(values)) == 1})
    return rows


# --- compile summary ---------------------------------------------------------------------

def compile_summary(run: Run) -> dict:
    compiles, graphs, ranks, time_s, recompiles, failures, hits = sql.rows(
        f"""
        SELECT count(*), count(DISTINCT (frame, index)), count(DISTINCT rank), coalesce(sum(compile_time), 0),
               count(*) FILTER (WHERE index > 0), count(*) FILTER (WHERE status <> 'ok'),
               count(*) FILTER (WHERE ({OUTCOME_SQL}) = 'hit')
        FROM {{compile_events}} WHERE run_id = %s
        """,
        [run.id],
    )[0]
    breaks = sql.rows("SELECT count(*) FROM {graph_breaks} WHERE run_id = %s", [run.id])[0][0]
    per_rank = max(ranks, 1)
    return {
        "compile_time_s": round(time_s / per_rank, 3),  # per rank: what each rank spent compiling
        "graphs": graphs,
        "compiles": compiles,
        "recompiles": round(recompiles / per_rank, 2),
        "graph_breaks": round(breaks / per_rank, 2),
        "cache_hit_rate": round(hits / compiles, 3) if compiles else None,
        "failures": failures,
        "ranks_reporting": ranks,
    }


# --- frames ------------------------------------------------------------------------------

def run_frames(run: Run) -> dict[str, dict]:
    rows = sql.rows(
        """
        SELECT frame, count(DISTINCT index), count(DISTINCT rank), coalesce(sum(compile_time), 0),
               max((detail->'counts'->>'graph_op_count')::bigint), array_agg(DISTINCT graph_norm ORDER BY graph_norm)
        FROM {compile_events} WHERE run_id = %s GROUP BY frame
        """,
        [run.id],
    )
    frames: dict[str, dict] = {}
    for frame, n, ranks, time_s, ops, graphs in rows:
        frames[frame_key(frame)] = {
            "frame": frame, "compiles": n, "time_s": round(time_s / max(ranks, 1), 3), "ops": ops,
            "graphs": [g for g in graphs if g],
        }
    return frames


def frame_alignment(runs: list[Run]) -> list[dict]:
    per_run = [run_frames(r) for r in runs]
    keys = sorted(set().union(*per_run))
    rows = []
    for key in keys:
        cells = [frames.get(key) for frames in per_run]
        present = [c for c in cells if c]
        same = len(present) == len(cells) and len({tuple(c["graphs"]) for c in present}) == 1
        rows.append({"key": key, "cells": cells, "graph_equal": same})
    rows.sort(key=lambda r: (r["graph_equal"], r["key"]))
    return rows


# --- fingerprints and step times ---------------------------------------------------------

def first_fingerprint_difference(base: Run, other: Run) -> dict:
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


def step_curve(run: Run, bins: int = CURVE_BINS) -> list[list]:
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


def compare(runs: list[Run]) -> dict:
    """The compare page and `GET /api/v1/compare` body; the first run is the reference."""
    summaries = [compile_summary(r) for r in runs]
    return {
        "runs": [{"key": r.key, "name": r.name, "torch_version": r.torch_version, "world_size": r.world_size}
                 for r in runs],
        "environment": environment_diff(runs),
        "compile_summary": summaries,
        "frames": frame_alignment(runs),
        "fingerprints": [first_fingerprint_difference(runs[0], other) for other in runs[1:]],
        "step_times": {r.key: step_curve(r) for r in runs},
    }

