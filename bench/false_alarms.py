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
  hf-trainer  demo/hf_trainer_job.py: the Hugging Face Trainer, TrainingArguments(torch_compile=True),
              a tiny GPT-2 (Accelerate compiles the DDP-wrapped model)
  lightning   demo/lightning_job.py: Lightning, Trainer(strategy="ddp") fitting a compiled LightningModule
  accelerate  demo/accelerate_job.py: an Accelerate loop, Accelerator(dynamo_backend="inductor")
  handmade    demo/handmade_dp_job.py: replicas averaged by a hand-written all-reduce (no DDP class),
              beside a head each rank keeps to itself
  handmade-compiled-step  the same with the optimizer step under torch.compile
  independent demo/handmade_dp_job.py --independent: no averaging, a seed per rank (nothing to compare)
Cache modes, alternating: cold-shared (a fresh dir all ranks share), warm-shared (the dir of the
last cold-shared run of the shape), cold-private (a fresh dir per rank), warm-private (the per-rank
dirs of the last cold-private run of the shape).

    python -m bench false_alarms               # 30 runs
    python -m bench false_alarms --runs 10 --steps 4
    python -m bench false_alarms --runs 2 --shapes same-isa
    python -m bench false_alarms --runs 3 --shapes hf-trainer,lightning,accelerate --no-control --no-fixtures

Then the real GPU recordings (tests/fixtures/realism_*.tgz: demo/realism_job.py on an H200, torch 2.11,
real Triton kernels; tests/fixtures/make_realism_fixtures.sh): every clean spool (torch.compile(DDP(model)),
DDP(torch.compile(model)), per-block compile, activation checkpointing, bf16 autocast, no_sync gradient
accumulation, FSDP2 fully_shard; cold and warm, shared and private cache dirs) is uploaded with
`python -m agents upload` and its alerts counted as those of a clean run; the recorded positive
controls (a model made only of torch.nn containers under torch.compile(DDP(model)), one rank
recompiling, one rank graph-breaking) must each be one incident rooted at the right ranks. The race
recordings (tests/fixtures/realism_races.tgz, `make_realism_fixtures.sh races`, torch 2.11 and
transformers on an H200) add 3 ranks sharing one cold cache dir (a late rank loading what the others
compiled, a different rank each time, and all-miss runs; a small model and a GPT-2, both under
torch.compile(DDP(model))), clean, and positives: rank 1 of the GPT-2 under bf16 autocast, the same
error on every rank at step 3, rank 1's loss turning inf, rank 1 recompiling at step 3 while its own
gradients diverge (the divergence settles before the lone recompile's slot).
A clean run counts its alerts of severity warning or critical (what can open an incident and page);
information (`cache_divergence`: a hit/miss race) is listed, not counted.

    python -m bench false_alarms --runs 0      # the GPU recordings alone
    python -m bench false_alarms --no-fixtures

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
from typing import Any

from agents.launch import torchrun
from bench.common import ROOT, bench_env, free_port, fresh_database, setup_django, start_servers
from bench.results import markdown, record, rerun

RANKS = 3
FIXTURES = ROOT / "tests" / "fixtures"
# positive control's run key -> (the kind its one incident is rooted at, None: any; the ranks it names)
CONTROLS = {
    "realism-containers-cold-private": ("ineffective_compile", [0, 1]),
    "realism-recompile-cold-private": ("recompile_divergence", [1]),
    "realism-graph-break-cold-shared": (None, [1]),
    "realism-autocast-cold-shared": ("graph_divergence", [1]),
    "realism-raise-cold-private": ("rank_crashed", [0, 1, 2]),
    "realism-inf-cold-private": ("nonfinite_grad", [1]),  # rank 1 logged the non-finite loss first
    "realism-late-cause-cold-private": ("recompile_divergence", [1]),
    "realism-handmade-h100": ("param_divergence", [3]),  # a hand-written all-reduce, rank 3 seeded apart
}
RECORDINGS = ("realism_clean.tgz", "realism_controls.tgz", "realism_races.tgz", "realism_handmade.tgz")
WRAPPER = "demo/per_rank_env.py"
HELPERS = [
    "--branch-rank",
    "99",
    "--slow-rank",
    "99",
    "--slow-seconds",
    "0",
    "--fail-rank",
    "99",
    "--collective-rank",
    "99",
    "--elementwise-check",
]
SHAPES = {
    "demo": (["demo/ddp_job.py"], {}),
    "scenarios": (["demo/scenarios.py", *HELPERS], {}),
    "same-isa": (
        ["demo/scenarios.py", "--elementwise-check"],
        {str(r): {"ATEN_CPU_CAPABILITY": "avx2"} for r in range(RANKS)},
    ),
    "hf-trainer": (["demo/hf_trainer_job.py"], {}),
    "lightning": (["demo/lightning_job.py"], {}),
    "accelerate": (["demo/accelerate_job.py"], {}),
    "handmade": (["demo/handmade_dp_job.py"], {}),
    "handmade-compiled-step": (["demo/handmade_dp_job.py", "--compiled-step"], {}),
    "independent": (["demo/handmade_dp_job.py", "--independent"], {}),
}
TRAINERS = ("hf-trainer", "lightning", "accelerate")
SCHEDULE = [
    (shape, mode)
    for shape in ("demo", "scenarios")
    for mode in ("cold-shared", "warm-shared", "cold-private", "warm-private")
]
SCHEDULE += [("same-isa", "cold-shared"), ("same-isa", "warm-shared")]
# the trainers last, a cache mode at a time: `--shapes` of the three and `--runs 3` runs each once, cold
SCHEDULE += [
    (shape, mode) for mode in ("cold-shared", "warm-shared", "cold-private", "warm-private") for shape in TRAINERS
]
# replicas without DDP's class (a hand-written all-reduce, its optimizer step compiled) and ranks that
# share nothing: `--shapes` of the three and `--runs 3` runs each once, cold
HANDMADE = ("handmade", "handmade-compiled-step", "independent")
SCHEDULE += [(shape, mode) for mode in ("cold-shared", "cold-private") for shape in HANDMADE]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the run's slots settled")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ", ".join(SHAPES))
    p.add_argument(
        "--no-control",
        action="store_true",
        help="skip the positive control (one faulty run at the end, not counted: rank 1 traces another "
        "graph, which must raise graph_divergence, or the zero above proves nothing)",
    )
    p.add_argument(
        "--no-fixtures", action="store_true", help="skip the uploaded GPU recordings (tests/fixtures/realism_*)"
    )
    p.add_argument("--keep", action="store_true", help="keep the cache and spool dirs (printed at the end)")
    return p.parse_args(argv)


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
    per_rank = {
        str(r): dict(SHAPES[shape][1].get(str(r), {}), TORCHINDUCTOR_CACHE_DIR=str(dirs[r])) for r in range(RANKS)
    }
    return dict(
        env,
        LOCKSTEP_URL=url,
        LOCKSTEP_TOKEN=token,
        LOCKSTEP_RUN=key,
        LOCKSTEP_SPOOL_DIR=str(spool),
        OMP_NUM_THREADS="1",
        TORCHINDUCTOR_COMPILE_THREADS="1",
        PER_RANK_ENV=json.dumps(per_rank),
    )


def run_job(env: dict, shape: str, steps: int, timeout: float = 400) -> tuple[int, str, float]:
    cmd = torchrun(RANKS, WRAPPER, *SHAPES[shape][0], "--steps", str(steps), port=free_port(), agent=False)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
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
    from dashboard.tenancy.models import Rank, Run

    run = Run.objects.filter(key=key).first()
    ranks = Rank.objects.filter(run__key=key)
    if run is None or ranks.count() < run.world_size or ranks.filter(status="running").exists():
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


def alerts_of(key: str, info: bool = False) -> list:
    """The run's alerts that can open an incident (warning, critical); with `info`, its information."""
    from dashboard.detection.models import Alert
    from dashboard.detection.rules import INFO

    found = Alert.objects.filter(run__key=key).order_by("id")
    return list(found.filter(severity=INFO) if info else found.exclude(severity=INFO))


def upload(url: str, token: str, fixture: str, into: Path) -> list[str]:
    """Every run spool of a recorded fixture, sent as the agent would (`python -m agents upload`); their keys."""
    import tarfile

    with tarfile.open(FIXTURES / fixture) as tar:
        tar.extractall(into, filter="data")
    keys = sorted(p.name for p in into.iterdir())
    for key in keys:
        subprocess.run(
            [sys.executable, "-m", "agents", "upload", str(into / key), "--url", url, "--token", token],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return keys


def recorded_shape(key: str) -> tuple[str, str]:
    """(shape, cache mode) of a recorded run key: the setup before a dot or a repetition's digit."""
    name = key.removeprefix("realism-")
    setup, mode = name.rsplit("-", 2)[0].split(".")[0], "-".join(name.rsplit("-", 2)[1:])  # ".p": own cache dirs
    return f"h200 {'race' if setup.startswith('race') else setup.removesuffix('b')}", mode


def recordings(url: str, token: str, work: Path, settle: float) -> tuple[list[tuple], str, bool]:
    """The GPU recordings, uploaded: rows (like a live job's) of the clean runs, and whether each
    positive control is one incident rooted at its ranks."""
    from dashboard.detection.models import Incident

    keys = [k for name in RECORDINGS for k in upload(url, token, name, work / name.removesuffix(".tgz"))]
    ok = {key: wait_settled(key, 0.0) for key in keys}
    time.sleep(settle)  # the sweep's look at runs just ended
    rows = [
        (key, *recorded_shape(key), 0.0, 0, ok[key], collections.Counter(a.kind for a in alerts_of(key)))
        for key in keys
        if key not in CONTROLS
    ]
    parts, right = [], True
    for key in (k for k in keys if k in CONTROLS):
        kind, ranks = CONTROLS[key]
        found = [
            (i.root.kind, i.root.ranks)
            for i in Incident.objects.filter(run__key=key).select_related("root")
            if i.root is not None
        ]
        good = len(found) == 1 and found[0][1] == ranks and kind in (None, found[0][0])
        right &= good
        parts.append(
            f"{key.removeprefix('realism-')}: {len(found)} incident(s) {found} ({'right' if good else 'WRONG'})"
        )
    return rows, "; ".join(parts), right


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = bench_env("lockstep_false_alarms")
    env["REDIS_URL"] = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    print("fresh database lockstep_false_alarms ...", flush=True)
    fresh_database(env)
    setup_django(env)
    from dashboard.tenancy.models import Project, ProjectToken

    project = Project.objects.create(name="false-alarms")
    token = ProjectToken.issue(project)
    servers = start_servers(env, ingest=1, celery=0)
    servers.add_worker(env, "lockstep-false-alarms-worker")
    work = Path(tempfile.mkdtemp(prefix="lockstep-false-alarms-"))
    caches = Caches(work)
    rows, details, informed, failed, control, recorded_right = [], [], [], [], "skipped", False
    schedule = [(shape, mode) for shape, mode in SCHEDULE if shape in args.shapes.split(",")]
    try:
        for i in range(args.runs):
            shape, mode = schedule[i % len(schedule)]
            key = f"fa-{i:02d}-{shape}-{mode}-{uuid.uuid4().hex[:4]}"
            dirs = caches.dirs(shape, mode, RANKS)
            rc, out, wall = run_job(
                job_env(env, servers.url, token, key, work / f"spool-{i}", shape, dirs), shape, args.steps
            )
            ok = rc == 0 and wait_settled(key, args.settle)
            found = alerts_of(key)
            kinds = collections.Counter(a.kind for a in found)
            if rc != 0:
                failed.append((key, rc, out[-3000:]))
            rows.append((i, shape, mode, wall, rc, ok, kinds))
            details += [(key, a) for a in found]
            informed += [(key, a) for a in alerts_of(key, info=True)]
            text = ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) or "none"
            print(
                f"{i:>3}  {shape:<9}  {mode:<12}  {wall:6.1f} s  rc={rc}  {'settled' if ok else 'NOT SETTLED'}  "
                f"alerts: {text}",
                flush=True,
            )
        if not args.no_control:
            key = f"fa-control-{uuid.uuid4().hex[:4]}"
            dirs = caches.dirs("scenarios", "cold-private", RANKS)
            env_c = job_env(env, servers.url, token, key, work / "spool-control", "scenarios", dirs)
            cmd = torchrun(
                RANKS,
                WRAPPER,
                "demo/scenarios.py",
                "--branch-rank",
                "1",
                "--steps",
                str(args.steps),
                port=free_port(),
                agent=False,
            )
            rc = subprocess.run(cmd, cwd=ROOT, env=env_c, capture_output=True, timeout=400).returncode
            wait_settled(key, args.settle)
            kinds = collections.Counter(a.kind for a in alerts_of(key))
            control = f"rc={rc}, alerts: {dict(sorted(kinds.items())) or 'none'} " + (
                "(graph_divergence raised: the stack detects)"
                if "graph_divergence" in kinds
                else "(NO graph_divergence: the stack did not detect a real fault; the zero proves nothing)"
            )
            print(f"control  scenarios --branch-rank 1  {control}", flush=True)
        if not args.no_fixtures:
            recorded_rows, recorded_text, recorded_right = recordings(servers.url, token, work, args.settle)
            for key, shape, mode, wall, rc, ok, kinds in recorded_rows:
                rows.append((key, shape, mode, wall, rc, ok, kinds))
                details += [(key, a) for a in alerts_of(key)]
                informed += [(key, a) for a in alerts_of(key, info=True)]
                text = ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())) or "none"
                print(f"{key:<40}  {'settled' if ok else 'NOT SETTLED'}  alerts: {text}", flush=True)
            print(f"recorded controls  {recorded_text}", flush=True)
            control += f"; recorded GPU controls: {recorded_text}"
    finally:
        servers.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    total: collections.Counter[str] = collections.Counter()
    recorded = sum(1 for row in rows if str(row[1]).startswith("h200 "))
    print(
        f"\nFalse alarms: {len(rows) - recorded} live clean runs ({RANKS} ranks, {args.steps} steps each, gloo, torch.compile, "
        f"agent) and {recorded} recorded on an H200 (2-3 ranks, 8 steps each, uploaded)"
    )
    print(f"{'shape':<10} {'cache':<13} {'runs':>4} {'alerts raised':<40}")
    by: dict[tuple[str, str], list[Any]] = collections.defaultdict(lambda: [0, collections.Counter()])
    for _, shape, mode, _, _, _, kinds in rows:
        by[(shape, mode)][0] += 1
        by[(shape, mode)][1].update(kinds)
        total.update(kinds)
    table = []
    for (shape, mode), (n, kinds) in by.items():
        raised = ", ".join(f"{k}: {c}" for k, c in sorted(kinds.items())) or "-"
        print(f"{shape:<10} {mode:<13} {n:>4} {raised:<40}")
        table.append((shape, mode, n, raised))
    n_alerts = sum(total.values())
    table.append(
        (
            "**total**",
            "",
            len(rows),
            f"**{n_alerts} alerts = {n_alerts / max(len(rows), 1):.2f} per clean run** (target 0)",
        )
    )
    print(
        f"total: {n_alerts} alerts in {len(rows)} runs = {n_alerts / max(len(rows), 1):.2f} alerts per clean run"
        f" (target 0); by kind: {dict(sorted(total.items())) or '-'}"
    )
    print(f"jobs that failed: {len(failed)}; runs not settled in time: {sum(1 for r in rows if not r[5])}")
    print(f"positive control (not counted): {control}")
    for key, alert in details:
        print(f"  {key}: {alert.kind} [{alert.severity}] ranks={alert.ranks} frame={alert.frame}: {alert.message}")
    print(f"information (shown on the pages, never an incident or a page): {len(informed)}")
    for key, alert in informed:
        print(f"  {key}: {alert.kind} ranks={alert.ranks}: {alert.message}")
    for key, rc, out in failed:
        print(f"\n--- {key} exited {rc}; last output:\n{out}")
    if args.keep:
        print(f"kept: {work}")
    record(
        "false_alarms" if args.shapes == ",".join(SHAPES) else f"false_alarms ({args.shapes})",
        markdown(("shape", "cache", "runs", "alerts raised"), table),
        rerun("false_alarms", argv),
        f"F1: clean {RANKS}-rank gloo jobs with torch.compile and the agent, {args.steps} steps each, and {recorded} clean "
        "runs recorded on an H200 (tests/fixtures/realism_clean.tgz and realism_races.tgz, uploaded; information, such as a "
        "cache hit/miss race, not counted); jobs failed: "
        f"{len(failed)}; runs not settled in time: {sum(1 for r in rows if not r[5])}; positive control (not counted): "
        f"{control}.",
    )
    return 0 if n_alerts == 0 and not failed and (args.no_fixtures or recorded_right) else 1


if __name__ == "__main__":
    raise SystemExit(main())
