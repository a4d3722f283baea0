"""False alarms: alerts raised by clean real jobs (target: 0 per run).

Runs N real 3-rank gloo torchrun jobs with torch.compile and the agent, none with a fault, against
a real stack (uvicorn + a Celery worker with beat, on a database of its own), waits until every
slot of the run has settled and two sweeps have passed, and counts the alerts of each run.

Job shapes (all under demo/per_rank_env.py, so ranks can be given their own settings):
  demo        demo/ddp_job.py, the demo and test job
  scenarios   demo/scenarios.py with every compiled helper of the fault scenarios on and no rank
              singled out (--branch-rank/--slow-rank/--fail-rank/--collective-rank name rank 99, so
              every rank takes the same branch, compiles as fast, compiles fine, folds no extra
              all_reduce), plus --elementwise-check
  same-isa    demo/scenarios.py --elementwise-check with every rank on ATEN_CPU_CAPABILITY=avx2 and one
              shared cache dir: a shared cache with one codegen target is fine
Cache modes, alternating: cold-shared (a fresh dir all ranks share), warm-shared (the dir of the
last cold-shared run of the shape), cold-private (a fresh dir per rank), warm-private (the per-rank
dirs of the last cold-private run of the shape).

    python bench/false_alarms.py               # 30 runs
    python bench/false_alarms.py --runs 10 --steps 4
    python bench/false_alarms.py --runs 2 --shapes same-isa

Left out on purpose: `--storm` (recompiling on every step is a real recompile_storm) and
`--compile-ddp` (torch.compile(DDP(model)) really runs eager: ineffective_compile).
The database is `lockstep_false_alarms` (dropped and migrated at start) and Redis database 0 of
BENCH_REDIS_URL's server (default redis://127.0.0.1:6379/0: the suite uses 1-15, the other
benchmarks 10), so a run never touches the suite's, the demo's or another benchmark's data.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import ROOT, bench_env, free_port, fresh_database, setup_django, start_servers  # noqa: E402

RANKS = 3
WRAPPER = "demo/per_rank_env.py"
HELPERS = ["--branch-rank", "99", "--slow-rank", "99", "--slow-seconds", "0", "--fail-rank", "99",
           "--collective-rank", "99", "--elementwise-check"]
SHAPES = {
    "demo": (["demo/ddp_job.py"], {}),
    "scenarios": (["demo/scenarios.py", *HELPERS], {}),
    "same-isa": (["demo/scenarios.py", "--elementwise-check"],
                 {str(r): {"ATEN_CPU_CAPABILITY": "avx2"} for r in range(RANKS)}),
}
SCHEDULE = [(shape, mode) for shape in ("demo", "scenarios") for mode in ("cold-shared", "warm-shared",
                                                                          "cold-private", "warm-private")]
SCHEDULE += [("same-isa", "cold-shared"), ("same-isa", "warm-shared")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the run's slots settled")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ", ".join(SHAPES))
    p.add_argument("--no-control", action="store_true",
                   help="skip the positive control (one faulty run at the end, not counted: rank 1 traces another "
                        "graph, which must raise graph_divergence, or the zero above proves nothing)")
    p.add_argument("--keep", action="store_true", help="keep the cache and spool dirs (printed at the end)")
    return p.parse_args()


class Caches:
    """Cache dirs per shape: fresh ones for cold runs, the last cold run's for warm ones."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.last: dict[tuple[str, str], list[Path]] = {}

    def dirs(self, shape: str, mode: str, n: int) -> list[Path]:
        temp, sharing = mode.split("-")
        if temp == "warm" and (shape, sharing) in self.last:
            return self.last[(shape, sharing)]
        fresh = Path(tempfile.mkdtemp(prefix=f"{shape}-{sharing}-", dir=self.root))
        dirs = [fresh] * RANKS if sharing == "shared" else [fresh / f"rank{r}" for r in range(RANKS)]
        self.last[(shape, sharing)] = dirs
        return dirs


def job_env(env: dict, url: str, token: str, key: str, spool: Path, shape: str, dirs: list[Path]) -> dict:
    per_rank = {str(r): dict(SHAPES[shape][1].get(str(r), {}), TORCHINDUCTOR_CACHE_DIR=str(dirs[r]))
                for r in range(RANKS)}
    return dict(env, LOCKSTEP_URL=url, LOCKSTEP_TOKEN=token, LOCKSTEP_RUN=key, LOCKSTEP_SPOOL_DIR=str(spool),
                OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1", PER_RANK_ENV=json.dumps(per_rank))


def run_job(env: dict, shape: str, steps: int, timeout: float = 400) -> tuple[int, str, float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), "--master-port",
           str(free_port()), WRAPPER, *SHAPES[shape][0], "--steps", str(steps)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        from dashboard.devstack.processes import kill_tree

        kill_tree(proc)
        out, _ = proc.communicate()
        return -1, out.decode(errors="replace"), time.monotonic() - t0
    return proc.returncode, out.decode(errors="replace"), time.monotonic() - t0


def settled(key: str) -> bool:
    """Every rank ended and every slot of the run is settled with all its reports."""
    from django.db.models import F, Q

    from dashboard.ledger.models import CompileSlot, GradSlot
    from dashboard.tenancy.models import Rank

    ranks = Rank.objects.filter(run__key=key)
    if ranks.count() < RANKS or ranks.filter(status="running").exists():
        return False
    pending = Q(settled_at__isnull=True) | Q(reported__gt=F("settled_n"))
    return not any(m.objects.filter(run__key=key).filter(pending).exists() for m in (CompileSlot, GradSlot))


def wait_settled(key: str, extra: float, timeout: float = 90) -> bool:
    deadline = time.monotonic() + timeout
    while not settled(key):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    time.sleep(extra)  # the sweep (every 2 s) checks the run itself
    return True


def alerts_of(key: str) -> list:
    from dashboard.detection.models import Alert

    return list(Alert.objects.filter(run__key=key).order_by("id"))


def main() -> None:
    args = parse_args()
    env = bench_env("lockstep_false_alarms")
    env["REDIS_URL"] = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    print("fresh database lockstep_false_alarms ...", flush=True)
    fresh_database(env)
    setup_django(env)
    from dashboard.tenancy.models import Project, ProjectToken

    project = Project.objects.create(name="false-alarms")
    token = ProjectToken.issue(project)
    servers = start_servers(env, ingest=1, celery=0)
    beat_dir = Path(tempfile.mkdtemp(prefix="lockstep-fa-beat-"))
    log = open(Path(tempfile.gettempdir()) / "lockstep-false-alarms-worker.log", "ab")
    servers.procs.append(subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-B", "--concurrency", "1", "--loglevel",
         "warning", "--schedule", str(beat_dir / "beat-schedule")],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    work = Path(tempfile.mkdtemp(prefix="lockstep-false-alarms-"))
    caches = Caches(work)
    rows, details, failed, control = [], [], [], "skipped"
    schedule = [(shape, mode) for shape, mode in SCHEDULE if shape in args.shapes.split(",")]
    try:
        for i in range(args.runs):
            shape, mode = schedule[i % len(schedule)]
            key = f"fa-{i:02d}-{shape}-{mode}-{uuid.uuid4().hex[:4]}"
            dirs = caches.dirs(shape, mode, RANKS)
            rc, out, wall = run_job(job_env(env, servers.url, token, key, work / f"spool-{i}", shape, dirs),
                                    shape, args.steps)
            ok = rc == 0 and wait_settled(key, args.settle)
            found = alerts_of(key)
            kinds = collections.Counter(a.kind for a in found)
            if rc != 0:
                failed.append((key, rc, out[-3000:]))
            rows.append((i, shape, mode, wall, rc, ok, kinds))
            details += [(key, a) for a in found]
            text = ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) or "none"
            print(f"{i:>3}  {shape:<9}  {mode:<12}  {wall:6.1f} s  rc={rc}  {'settled' if ok else 'NOT SETTLED'}  "
                  f"alerts: {text}", flush=True)
        if not args.no_control:
            key = f"fa-control-{uuid.uuid4().hex[:4]}"
            dirs = caches.dirs("scenarios", "cold-private", RANKS)
            env_c = job_env(env, servers.url, token, key, work / "spool-control", "scenarios", dirs)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS), "--master-port",
                   str(free_port()), WRAPPER, "demo/scenarios.py", "--branch-rank", "1", "--steps", str(args.steps)]
            rc = subprocess.run(cmd, cwd=ROOT, env=env_c, capture_output=True, timeout=400).returncode
            wait_settled(key, args.settle)
            kinds = collections.Counter(a.kind for a in alerts_of(key))
            control = f"rc={rc}, alerts: {dict(sorted(kinds.items())) or 'none'} " + (
                "(graph_divergence raised: the stack detects)" if "graph_divergence" in kinds
                else "(NO graph_divergence: the stack did not detect a real fault; the zero proves nothing)")
            print(f"control  scenarios --branch-rank 1  {control}", flush=True)
    finally:
        servers.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(beat_dir, ignore_errors=True)

    total = collections.Counter()
    print(f"\nFalse alarms: {len(rows)} clean runs, {RANKS} ranks, {args.steps} steps each (gloo, torch.compile, agent)")
    print(f"{'shape':<10} {'cache':<13} {'runs':>4} {'alerts raised':<40}")
    by = collections.defaultdict(lambda: [0, collections.Counter()])
    for _, shape, mode, _, _, _, kinds in rows:
        by[(shape, mode)][0] += 1
        by[(shape, mode)][1].update(kinds)
        total.update(kinds)
    for (shape, mode), (n, kinds) in by.items():
        print(f"{shape:<10} {mode:<13} {n:>4} {', '.join(f'{k}: {c}' for k, c in sorted(kinds.items())) or '-':<40}")
    n_alerts = sum(total.values())
    print(f"total: {n_alerts} alerts in {len(rows)} runs = {n_alerts / max(len(rows), 1):.2f} alerts per clean run"
          f" (target 0); by kind: {dict(sorted(total.items())) or '-'}")
    print(f"jobs that failed: {len(failed)}; runs not settled in time: {sum(1 for r in rows if not r[5])}")
    print(f"positive control (not counted): {control}")
    for key, alert in details:
        print(f"  {key}: {alert.kind} [{alert.severity}] ranks={alert.ranks} frame={alert.frame}: {alert.message}")
    for key, rc, out in failed:
        print(f"\n--- {key} exited {rc}; last output:\n{out}")
    if args.keep:
        print(f"kept: {work}")


if __name__ == "__main__":
    main()
