"""Fault to page: how long a user waits between a fault and its page, at the agents' default cadence.

Runs real 3-rank gloo torchrun jobs (`demo/faulty_job.py`, torch.compile'd DDP, the agent attached
with its defaults: a flush every 0.5 s, a heartbeat every 5 s) against a real stack (uvicorn + a
Celery worker with beat, a database of its own), `--repeat` times per fault and failing rank, and
times each from the failing rank's `FAULT_AT` to the moment a JSON webhook destination receives the
incident's page. Faults: `recompile` (one rank's batch has another size at the fault step: it
recompiles alone), `graph` (a fresh frame every rank compiles, one rank tracing another branch),
`grad` (one rank's gradient nudged after the all-reduce): target p99 <= 3 s; `sigkill` and
`exit137` (a rank killed, or exiting, without a word): p99 <= 5 s. The job trains on after the
fault (14 steps, the fault at step 6, 0.3 s per step), as the one where a lone recompile once paged
after the job had ended. A row is right when the run has one incident, rooted at the failing rank.

    python -m bench fault_to_page                                  # 5 faults x 3 ranks x 2 = 30 jobs
    python -m bench fault_to_page --faults recompile,grad --ranks 1 --repeat 3
"""

from __future__ import annotations

import argparse
import math
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from bench.fault_matrix import FAULT_AT, fault_stack, incidents_of, run_job
from bench.results import markdown, record, rerun

DIVERGENCES = ("recompile", "graph", "grad")
KILLS = ("sigkill", "exit137")
TARGETS_S = {**dict.fromkeys(DIVERGENCES, 3.0), **dict.fromkeys(KILLS, 5.0)}
ROOTS = {"recompile": "recompile_divergence", "graph": "graph_divergence", "grad": "grad_divergence"}
JOB_ARGS = ("--steps", "14", "--fault-step", "6")


@dataclass
class Timing:
    fault: str
    rank: int
    to_page_s: float | None  # None: no page within --observe
    to_incident_s: float | None  # to the first incident's opening: detection's part, the rest is delivery's
    root: str  # "kind [ranks]" of the run's incidents
    right: bool

    def row(self) -> tuple[str, ...]:
        page, incident = ("-" if s is None else f"{s:.2f}" for s in (self.to_page_s, self.to_incident_s))
        return (self.fault, str(self.rank), page, incident, self.root, "right" if self.right else "WRONG")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", default=",".join((*DIVERGENCES, *KILLS)))
    p.add_argument("--ranks", default="0,1,2", help="failing ranks (first, middle, last of 3)")
    p.add_argument("--repeat", type=int, default=2, help="jobs per fault and failing rank")
    p.add_argument("--observe", type=float, default=30.0, help="seconds after the fault a page may take")
    return p.parse_args(argv)


def right_root(fault: str, rank: int, incidents: list[dict]) -> bool:
    """One incident, rooted at the failing rank (by the fault's kind, or a crash for a kill)."""
    if len(incidents) != 1 or not incidents[0]["root"]:
        return False
    root = incidents[0]["root"]
    return root["ranks"] == [rank] and root["kind"] == ROOTS.get(fault, "rank_crashed")


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the p99 of fewer than 100 samples is the largest."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summary(timings: list[Timing]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for fault in dict.fromkeys(t.fault for t in timings):
        of_fault = [t for t in timings if t.fault == fault]
        paged = [t.to_page_s for t in of_fault if t.to_page_s is not None]
        opened = [t.to_incident_s for t in of_fault if t.to_incident_s is not None]
        target = TARGETS_S[fault]
        met = len(paged) == len(of_fault) and all(t.right for t in of_fault) and percentile(paged, 0.99) <= target
        rows.append(
            (
                fault,
                str(len(of_fault)),
                f"{percentile(paged, 0.5):.2f}" if paged else "-",
                f"{percentile(paged, 0.99):.2f}" if paged else "-",
                f"{max(paged):.2f}" if paged else "-",
                f"{percentile(opened, 0.99):.2f}" if opened else "-",
                f"{sum(t.right for t in of_fault)}/{len(of_fault)}",
                f"<= {target:.0f}",
                "yes" if met else "NO",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    timings: list[Timing] = []
    with fault_stack("lockstep_fault_to_page", redis_db=11) as stack:
        for fault in args.faults.split(","):
            for rank in (int(r) for r in args.ranks.split(",")):
                for _ in range(args.repeat):
                    key = f"ftp-{fault}-{rank}-{uuid.uuid4().hex[:4]}"
                    _, out = run_job(stack.job_env(key), fault, rank, stack.work / f"spool-{key}", JOB_ARGS)
                    marks = FAULT_AT.findall(out)
                    if not marks:
                        raise SystemExit(f"{key}: the job never injected its fault:\n{out[-4000:]}")
                    fault_at = float(marks[0][0])
                    while stack.receiver.first_page_at(key) is None and time.time() < fault_at + args.observe:
                        time.sleep(0.2)
                    paged = stack.receiver.first_page_at(key)
                    time.sleep(max(0.0, (paged or fault_at) + 5.0 - time.time()))  # a second incident would show
                    found = incidents_of(key)
                    roots = "; ".join(f"{i['root']['kind']} {i['root']['ranks']}" for i in found if i["root"])
                    opened = min((datetime.fromisoformat(i["opened_at"]).timestamp() for i in found), default=None)
                    timing = Timing(
                        fault,
                        rank,
                        None if paged is None else paged - fault_at,
                        None if opened is None else opened - fault_at,
                        roots,
                        right_root(fault, rank, found),
                    )
                    timings.append(timing)
                    print(" | ".join(timing.row()), flush=True)
    jobs = markdown(
        ("fault", "failing rank", "fault -> page (s)", "fault -> incident (s)", "incidents' roots", "root"),
        (t.row() for t in timings),
    )
    table = markdown(
        ("fault", "jobs", "p50 (s)", "p99 (s)", "max (s)", "incident p99 (s)", "rooted right", "target (s)", "met"),
        summary(timings),
    )
    print(table + "\n\n" + jobs)
    record(
        "fault_to_page",
        table + "\n\n" + jobs,
        rerun("fault_to_page", argv),
        note="From the failing rank's `FAULT_AT` to a JSON webhook's receipt of the incident's page; 3-rank gloo "
        "CPU jobs (demo/faulty_job.py, 14 steps of 0.3 s, the fault at step 6), the agents' default cadence "
        "(LOCKSTEP_FLUSH_INTERVAL 0.5 s, LOCKSTEP_HEARTBEAT 5 s), the server's defaults; p99 by nearest rank "
        "(with under 100 jobs per fault, the largest). The incident's opening is the server's clock: what "
        "follows it is delivery (Celery tasks, one at a time, then the webhook).",
    )
    return 0 if all(row[-1] == "yes" for row in summary(timings)) else 1
