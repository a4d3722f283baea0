"""One project floods, another is paged: project B's fault -> its alert on a websocket, while project A's
thousands of compile slots (every one of them a graph divergence, all in one growing incident) settle.

Project A's two ranks report `--flood` distinct compile slots whose graphs differ; then, while they
settle, project B's two ranks report one diverging gradient step every `--every` seconds, and the
clock runs from B's last batch accepted to B's grad_divergence alert on a websocket of B's member.
The same trials on an idle stack first give the anchor.

    python -m bench fair_settling                       # 3,000 slots, 10 trials
    python -m bench fair_settling --flood 40000 --trials 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import requests

from bench.common import AlertClock, bench_env, fresh_database, gzip_body, project_member, setup_django, start_servers
from bench.results import report


def post(url: str, token: str, batch: dict) -> float:
    response = requests.post(
        f"{url}/api/v1/ingest",
        data=gzip_body(batch),
        timeout=120,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    if not response.ok:
        raise SystemExit(f"ingest answered {response.status_code}: {response.text[:500]}")
    return time.perf_counter()


def batch(run: str, rank: int, seq: int, events: list[dict]) -> dict:
    return {
        "v": 1,
        "run": {"key": run, "world_size": 2},
        "rank": rank,
        "session": f"session-{run}-{rank}",
        "seq": seq,
        "events": events,
    }


def flood(url: str, token: str, run: str, slots: int) -> None:
    """Both ranks report every slot, rank 1 with another graph: each settles into a graph_divergence."""
    for rank in (0, 1):
        graph = ("a" if rank == 0 else "b") * 32
        events = [
            {
                "t": "compile",
                "frame": f"gen.py:{i}:block{i}",
                "index": 0,
                "step": 0,
                "hashes": {"dynamo": {"raw": graph, "norm": graph}},
            }
            for i in range(slots)
        ]
        for seq, start in enumerate(range(0, slots, 20_000)):
            post(url, token, batch(run, rank, seq, events[start : start + 20_000]))


def trials(url: str, token: str, clock: AlertClock, run: str, n: int, every: float) -> list[float]:
    waits = []
    for trial in range(n):
        group = f"{run}-g{trial}"
        for rank in (0, 1):
            grad = {"t": "grad", "step": trial, "group": group, "fps": [trial, rank]}
            accepted = post(url, token, batch(run, rank, trial, [grad]))
        deadline = accepted + 60
        while group not in clock.seen and time.perf_counter() < deadline:
            time.sleep(0.005)
        waits.append(clock.seen.get(group, float("inf")) - accepted)
        time.sleep(every)
    return waits


def unsettled(run: str) -> int:
    from dashboard.ledger.models import CompileSlot

    return CompileSlot.objects.filter(run__key=run, settled_at__isnull=True).count()


def summary(waits: list[float]) -> str:
    finite = sorted(w for w in waits if w != float("inf"))
    missed = len(waits) - len(finite)
    if not finite:
        return f"no alert in {len(waits)} trials"
    p99 = statistics.quantiles(finite, n=100, method="inclusive")[98] if len(finite) > 1 else finite[0]
    return (
        f"p50 {statistics.median(finite) * 1000:.0f} ms / p99 {p99 * 1000:.0f} ms / max {finite[-1] * 1000:.0f} ms"
        + (f"; {missed} of {len(waits)} never alerted" if missed else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=3000, help="project A's compile slots")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between project B's faults")
    parser.add_argument("--celery", type=int, default=1, help="Celery worker processes")
    args = parser.parse_args(argv)
    env = dict(bench_env("lockstep_bench_fairness"), LOCKSTEP_SETTLE_TIMEOUT="600")
    fresh_database(env)
    setup_django(env)
    token_a, _ = project_member("flooding-project")
    token_b, session_b = project_member("paged-project")
    servers = start_servers(env, ingest=1, celery=args.celery)
    try:
        time.sleep(3)  # Celery workers ready
        clock = AlertClock(servers.url, session_b, "grad_divergence", lambda a: (a.get("details") or {}).get("group"))
        clock.start()
        idle = trials(servers.url, token_b, clock, "idle", args.trials, args.every)
        started = time.perf_counter()
        flood(servers.url, token_a, "flood", args.flood)
        flooded = time.perf_counter() - started
        busy = trials(servers.url, token_b, clock, "during-flood", args.trials, args.every)
        left = unsettled("flood")
    finally:
        servers.stop()
    report(
        f"fair_settling ({args.flood} slots)",
        argv,
        f"Project B's fault -> alert on its websocket while project A's {args.flood} diverging compile slots settle "
        f"({args.celery} Celery process)",
        [
            ("idle stack (anchor)", summary(idle), f"{args.trials} trials, one every {args.every:g} s"),
            (
                f"A flooding ({args.flood} slots)",
                summary(busy),
                f"A's flood sent in {flooded:.1f} s; {left} of its slots still unsettled after B's last trial",
            ),
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
