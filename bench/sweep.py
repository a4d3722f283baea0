"""What detection does each second for one large running run: the Celery worker checks every active
run (the sweep) and settles the slots the ranks opened, so at 100,000 ranks their cost bounds how many
such runs one worker follows.

    python -m bench sweep [--ranks 100000] [--params 150] [--heartbeat 5] [--compiles 1] [-n 7] [--rebuild]

Uses its own database (`lockstep_bench_sweep` on the DATABASE_URL server) and one run of the
"bench" project whose ranks are all running and fresh (reporting now), each of which reported
`--compiles` compiles (one frame's, then a model's other frames', all settled) at step 0 and passed that step, with start facts like a real job's (the
H200 recording's settings, environment and cache locations, each rank's node, GPU and pid, and a parameter layout of `--params` names and their buckets), and which sent a progress
sample every `--heartbeat` seconds through the silent window, as agents do. Times, in this process,
median (min-max) of N after one warm-up: `runs.view_of` (the ranks' liveness, crashes,
the longest wait in a collective, the compile bill), every rank's progress (`runs.progress_of`,
which the view reads only once a wait could warn), what the pages' progress push reads every 2 s
(`runs.strip`, `runs.rank_rows`), the rules on that view (`rules.evaluate`), the subjects found clean
(`rules.clean_subjects`), the whole `runs.check` (those, the compiled-work view, and the
alerts' lifecycle in one transaction), the settle of the compile slot every rank reported
(`settle.settle_compile`: its reports, where the ranks stand, their start facts, the rules), and
that of one step's gradients, stored a row per 256 agreeing ranks as rack relays' requests leave
them (`settle.settle_grad`), and the first settle of a step whose gradients one rank holds apart
(the alert opened, the differing ranks asked for their parameters and every rank for its weights,
all before the commit that lets the page go).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from bench import common, results

BENCH_DB = "lockstep_bench_sweep"
T = TypeVar("T")
KEY = "sweep"


FRAME = "model.py:10:forward"
GRAD_STEP = 998  # every rank's gradients of this step, in rows of a rack's 256 ranks
DIVERGED_STEP = 997  # ... and of this one, but rank APART's, which differ
APART = 777


# A rank's start facts as an 8-GPU node's torchrun rank sends them (the shape of the H200 recording's
# rank_start, tests/fixtures/ddp_h200_spool.tgz, as today's agent sends it): what every rank shares, then
# what is a rank's own (its node, GPU, pid, local rank, clock).
SHARED_FACTS = {
    "versions": {"python": "3.12.3", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "gpu": "NVIDIA H200"},
    "config_hash": "747d92c327b18c675a2414a9dbb055cb",
    "settings": {"inductor.fx_graph_cache": "True"},
    "env": {
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_VERSION": "2.28.3-1",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root",
        "TORCH_CUDA_ARCH_LIST": "9.0a",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    },
    "cache_dirs": {"inductor": "/tmp/torchinductor_root"},
    "cache_fs": {"inductor": {"path": "/tmp/torchinductor_root", "fs": "ext4", "shared": False}},
    "codegen": {"cpu_capability": "AVX512"},
    "collective_timeout_s": 600,
    "fp_algo": "lockstep-fp64-v3",
}
FACTS = (
    "(%(shared)s::jsonb || jsonb_build_object('host', 'node' || r / 8, 'device', 'cuda:' || r %% 8, 'pid', 1000 + r,"
    " 'local_rank', r %% 8, 'ts', 1796046697.68 + r / 1000.0))"
)


def populate(ranks: int, params: int, compiles: int) -> None:
    from django.db import connection, transaction
    from django.utils import timezone

    from dashboard.evidence.models import CompileAgreement, GradReport
    from dashboard.ledger.models import CompileSlot, GradSlot
    from dashboard.tenancy.models import OWN_FACTS, Rank

    run = common.fresh_run(KEY, ranks, 1000, "2.13.0+cpu")
    layout = (
        "jsonb_build_object('params', (SELECT jsonb_agg('ddp:model.layers.' || i || '.weight') FROM"
        " generate_series(1, %(params)s) i), 'buckets', (SELECT jsonb_agg(jsonb_build_array(i)) FROM"
        " generate_series(0, %(params)s - 1) i))"
    )
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {Rank._meta.db_table} (run_id, rank, host, pid, info, facts, facts_key, device,"
            " collective_timeout_s, status, last_step, last_seen)"
            f" SELECT %(run)s, r, 'node' || r / 8, 1000 + r, {layout} || {FACTS}, {FACTS},"
            f" md5(({FACTS} - %(own)s::text[])::text), 'cuda:' || r %% 8, 600, 'running', 999, now()"
            " FROM generate_series(0, %(ranks)s - 1) r",
            {
                "run": run.id,
                "ranks": ranks,
                "params": params,
                "shared": json.dumps(SHARED_FACTS),
                "own": list(OWN_FACTS),
            },
        )
        cur.execute(  # every rank's compiles, alike, stored as a rack relay's requests store them
            f"INSERT INTO {CompileAgreement._meta.db_table} (run_id, ranks, frame, index, compile_id, step, status,"
            " graph_raw, graph_norm, code_raw, code_norm, times, cache, detail, ends)"
            " SELECT %(run)s, array_agg(r ORDER BY r), CASE WHEN k = 0 THEN %(frame)s ELSE 'model.py:' || k || ':block'"
            " END, 0, '0/0', 0, 'ok', 'g', 'g', 'c', 'c', array_agg(2.0 + r %% 7 * 0.01 ORDER BY r), '{}',"
            ' \'{"counts": {"graph_op_count": 12}}\', array_agg(now() ORDER BY r)'
            " FROM generate_series(0, %(ranks)s - 1) r, generate_series(0, %(compiles)s - 1) k GROUP BY k, r / %(rack)s",
            {"run": run.id, "ranks": ranks, "frame": FRAME, "compiles": compiles, "rack": 256},
        )
        cur.execute(  # a step's gradients, agreeing, stored as a rack relay's requests store them
            f'INSERT INTO {GradReport._meta.db_table} (run_id, ranks, step, "group", fps, nonfinite, norm, ts)'
            " SELECT %(run)s, array_agg(r ORDER BY r), %(step)s, 'ddp', %(fps)s, 0, 1.0, now()"
            " FROM generate_series(0, %(ranks)s - 1) r GROUP BY r / %(rack)s",
            {
                "run": run.id,
                "ranks": ranks,
                "step": GRAD_STEP,
                "fps": [f - (1 << 64) if f >= 1 << 63 else f for f in common.fingerprints(GRAD_STEP, 16)],
                "rack": 256,
            },
        )
    diverged = [f - (1 << 64) if f >= 1 << 63 else f for f in common.fingerprints(DIVERGED_STEP, 16)]
    with transaction.atomic(), connection.cursor() as cur:  # a step whose gradients one rank holds apart
        insert = f'INSERT INTO {GradReport._meta.db_table} (run_id, ranks, step, "group", fps, nonfinite, norm, ts)'
        values: dict[str, Any] = {
            "run": run.id,
            "ranks": ranks,
            "step": DIVERGED_STEP,
            "fps": diverged,
            "apart": APART,
            "rack": 256,
        }
        cur.execute(
            f"{insert} SELECT %(run)s, array_agg(r ORDER BY r), %(step)s, 'ddp', %(fps)s, 0, 1.0, now()"
            " FROM generate_series(0, %(ranks)s - 1) r WHERE r <> %(apart)s GROUP BY r / %(rack)s",
            values,
        )
        cur.execute(
            f"{insert} VALUES (%(run)s, ARRAY[%(apart)s], %(step)s, 'ddp', %(fps)s, 0, 1.0, now())",
            {**values, "fps": [diverged[0] ^ 1, *diverged[1:]]},
        )
    GradSlot.objects.bulk_create(
        GradSlot(
            run=run,
            step=step,
            group="ddp",
            reported=ranks,
            first_seen=timezone.now(),
            settled_at=timezone.now(),
            settled_n=ranks,
            dissenters=[],
            consensus={},
        )
        for step in (DIVERGED_STEP, GRAD_STEP)
    )
    CompileSlot.objects.bulk_create(
        CompileSlot(
            run=run,
            frame=FRAME if k == 0 else f"model.py:{k}:block",
            index=0,
            step=0,
            reported=ranks,
            first_seen=timezone.now(),
            settled_at=timezone.now() if k else None,
            settled_n=ranks if k else 0,
        )
        for k in range(compiles)
    )
    common.analyze(Rank, CompileAgreement)


SAMPLE = (
    "jsonb_build_object('t', 'progress', 'phase', 'backward', 'phase_s', 0.2, 'step', 999, 'since_step_s', 0.4,"
    " 'where', 'train.py:88 step')"
)


def sampled(run_id: int, ranks: int, heartbeat: float) -> int:
    """Each rank's progress samples of the silent window up to now, one per heartbeat, as agents send
    them (the older ones deleted), the latest also in its rank's row, as ingest keeps it (the ranks'
    heartbeats spread over the interval); how many. They age as the timings run: the log's figures
    are lower bounds."""
    from django.conf import settings
    from django.db import connection, transaction

    from dashboard.evidence.models import EventLog
    from dashboard.tenancy.models import Rank

    samples = int(settings.LOCKSTEP_SILENT_AFTER // heartbeat) if heartbeat > 0 else 0
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"DELETE FROM {EventLog._meta.db_table} WHERE run_id = %s AND t = 'progress'", [run_id])
        cur.execute(
            f"INSERT INTO {EventLog._meta.db_table} (run_id, rank, t, body, ts, received)"
            f" SELECT %(run)s, r, 'progress', {SAMPLE}, now() - make_interval(secs => k * %(hb)s),"
            " now() - make_interval(secs => k * %(hb)s)"
            " FROM generate_series(0, %(ranks)s - 1) r, generate_series(0, %(samples)s - 1) k",
            {"run": run_id, "ranks": ranks, "hb": heartbeat, "samples": samples},
        )
        cur.execute(
            f"UPDATE {Rank._meta.db_table} SET progress = CASE WHEN %(samples)s > 0 THEN {SAMPLE} END"
            " WHERE run_id = %(run)s",
            {"run": run_id, "samples": samples},
        )
    latest(run_id, heartbeat)
    common.analyze(EventLog, Rank)
    return ranks * samples


def latest(run_id: int, heartbeat: float) -> None:
    """The ranks' latest samples received within the last heartbeat, as a steady job's are (their
    heartbeats spread over it): the view is timed in the steady state, not as the samples age."""
    from django.db import connection

    from dashboard.tenancy.models import Rank

    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {Rank._meta.db_table} SET progress_at = now() - make_interval(secs => rank %% 100 * %(hb)s / 100)"
            " WHERE run_id = %(run)s AND progress IS NOT NULL",
            {"run": run_id, "hb": heartbeat},
        )


def timed(work: Callable[[], T], n: int, before: Callable[[], object] = lambda: None) -> tuple[list[float], T]:
    """Seconds of each of `n` calls after one warm-up, and the last call's result; `before` runs,
    untimed, ahead of each call."""
    before()
    out = work()
    samples = []
    for _ in range(n):
        before()
        start = time.perf_counter()
        out = work()
        samples.append(time.perf_counter() - start)
    return samples, out


def spread(samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"{statistics.median(ms):.0f} ms ({min(ms):.0f}-{max(ms):.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=100_000)
    parser.add_argument("--params", type=int, default=150, help="parameter names in each rank's start facts")
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=5.0,
        help="seconds between a rank's progress samples (the agent's default); 0: none",
    )
    parser.add_argument("--compiles", type=int, default=1, help="compiles each rank reported (frames of a model)")
    parser.add_argument("-n", type=int, default=7)
    parser.add_argument("--rebuild", action="store_true", help="make the run anew even if it exists")
    args = parser.parse_args(argv)
    common.configure_in_process(BENCH_DB)
    from django.utils import timezone

    from dashboard.detection import runs, settle
    from dashboard.detection.models import Alert, Incident
    from dashboard.detection.rules import clean_subjects, evaluate
    from dashboard.evidence.models import CompileEvent, GradReport
    from dashboard.ledger.models import CompileSlot, DetailRequest, GradSlot, WeightsRequest
    from dashboard.tenancy.models import Rank, Run

    common.populate_once(KEY, args.rebuild, lambda: populate(args.ranks, args.params, args.compiles))
    run = Run.objects.get(project__name="bench", key=KEY)
    ranks = Rank.objects.filter(run=run).count()
    compiles = CompileEvent.objects.filter(run=run).count()

    def fresh() -> None:  # every rank reported just now: nothing silent, nothing to page
        Rank.objects.filter(run=run).update(last_seen=timezone.now())
        Run.objects.filter(id=run.id).update(last_seen=timezone.now())

    fresh()
    samples = sampled(run.id, ranks, args.heartbeat)

    def steady() -> None:
        latest(run.id, args.heartbeat)

    view_s, view = timed(lambda: runs.view_of(run), args.n, steady)
    wait_s, wait = timed(lambda: runs.longest_wait(run), args.n, steady)
    progress_s, progress = timed(lambda: runs.progress_of(run), args.n, steady)
    strip_s, strip = timed(lambda: runs.strip(run), args.n, steady)
    rows_s, rows = timed(lambda: runs.rank_rows(run), args.n)
    evaluate_s, findings = timed(lambda: evaluate(view), args.n)
    clean_s, clean = timed(lambda: clean_subjects(view, findings), args.n)
    compiled_s, _ = timed(lambda: runs.read_compiled(run), args.n)
    fresh()
    check_s, _ = timed(lambda: runs.check(run), args.n, steady)
    slot = CompileSlot.objects.get(run=run, frame=FRAME)

    def settled() -> list[int]:  # the slot pending again, as a late report leaves it
        CompileSlot.objects.filter(id=slot.id).update(settled_at=None, settled_n=0)
        return settle.settle_compile(slot.id)

    settle_s, changed = timed(settled, args.n)
    assert not changed and CompileSlot.objects.get(id=slot.id).settled_at is not None  # settled, all agreeing
    grad_slot = GradSlot.objects.get(run=run, step=GRAD_STEP, group="ddp")

    def grads_settled() -> list[int]:
        GradSlot.objects.filter(id=grad_slot.id).update(settled_at=None, settled_n=0)
        return settle.settle_grad(grad_slot.id)

    grad_s, changed = timed(grads_settled, args.n)
    assert not changed and GradSlot.objects.get(id=grad_slot.id).settled_at is not None
    diverged = GradSlot.objects.get(run=run, step=DIVERGED_STEP, group="ddp")

    def undiverged() -> None:  # the divergence not found yet: no alert, nobody asked for weights
        Alert.objects.filter(run=run).delete()
        Incident.objects.filter(run=run).delete()
        DetailRequest.objects.filter(run=run).delete()
        WeightsRequest.objects.filter(run=run).delete()
        GradSlot.objects.filter(id=diverged.id).update(settled_at=None, settled_n=0)

    diverged_s, changed = timed(lambda: settle.settle_grad(diverged.id), args.n, undiverged)
    assert changed and Alert.objects.get(id=changed[0]).ranks == [APART]
    asked = DetailRequest.objects.filter(run=run).count(), WeightsRequest.objects.filter(run=run).count()
    print(f"{ranks:,} ranks, {len(clean):,} clean subjects, {len(findings)} findings", file=sys.stderr)
    detail = f"{ranks:,} running ranks, median (min-max) of {args.n} after a warm-up, python_speed {common.python_speed():.2f} s"
    results.report(
        "sweep",
        argv,
        f"the sweep's check of one run of {ranks:,} ranks, {compiles // max(ranks, 1)} compile(s) each",
        [
            ("runs.view_of", spread(view_s), detail),
            (
                "runs.longest_wait",
                spread(wait_s),
                f"of the view: the longest wait in a collective, {wait:.1f} s, of {samples:,} progress samples"
                f" (a sample per {args.heartbeat:g} s)",
            ),
            (
                "runs.progress_of",
                spread(progress_s),
                f"each rank's latest sample, {len(progress):,} ranks: the view's only once a wait could warn",
            ),
            ("runs.strip", spread(strip_s), f"the run page's {len(strip)} ranks, pushed every 2 s"),
            ("runs.rank_rows", spread(rows_s), f"the same push's counts of {rows.reporting:,} ranks"),
            ("rules.evaluate", spread(evaluate_s), f"{len(findings)} findings"),
            ("rules.clean_subjects", spread(clean_s), f"{len(clean):,} subjects found clean"),
            (
                "runs.read_compiled",
                spread(compiled_s),
                f"the check's aggregates over {compiles:,} compile rows, read once they changed (`compile_marks`)",
            ),
            ("runs.check", spread(check_s), "the whole check, lifecycle included, the compile rows unchanged"),
            (
                "settle.settle_compile",
                spread(settle_s),
                f"one compile every rank reported, {args.params} parameters in each start",
            ),
            (
                "settle.settle_grad",
                spread(grad_s),
                f"one step's gradients, every rank agreeing, in {GradReport.objects.filter(run=run, step=GRAD_STEP).count()} stored rows",
            ),
            (
                "settle.settle_grad, diverged",
                spread(diverged_s),
                f"the same, one rank apart: the alert opened, {asked[0]:,} parameter request(s) and {asked[1]} weights"
                " request(s) for every rank, before the commit that lets the page go",
            ),
        ],
    )
    return 0
