"""P2: detection latency, from the last rank's batch accepted to the alert on a websocket.

For each trial, N-1 ranks report one agreeing gradient step and the last rank reports a
divergent one; the clock starts when that last batch's 200 arrives and stops when the
grad_divergence alert reaches a websocket client of the project. Each trial uses its own
comparison group, so each is a new alert (one desync = one notification).

    python -m bench detection_latency                 # 256 and 1024 ranks
    python -m bench detection_latency --ranks 256 --trials 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from bench.common import AlertClock, bench_env, fresh_database, project_member, setup_django, start_servers
from bench.results import report

TARGETS = {256: (0.25, 1.0), 1024: (None, 2.0)}  # p50, p99 seconds (P2)


def post(http: requests.Session, url: str, token: str, run: str, ranks: int, rank: int, trial: int, bad: bool) -> float:
    body = {
        "v": 1,
        "run": {"key": run, "world_size": ranks},
        "rank": rank,
        "session": f"lat-{run}-{rank}-{trial}",
        "seq": 0,
        "events": [{"t": "grad", "step": trial, "group": f"g{trial}", "fps": [trial, 1 if bad else 0]}],
    }
    response = http.post(
        f"{url}/api/v1/ingest",
        data=json.dumps(body),
        timeout=30,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    response.raise_for_status()
    return time.perf_counter()


def trial(url: str, token: str, run: str, ranks: int, n: int, clock: AlertClock, pool: ThreadPoolExecutor) -> float:
    sessions = [requests.Session() for _ in range(8)]
    list(pool.map(lambda r: post(sessions[r % 8], url, token, run, ranks, r, n, False), range(ranks - 1)))
    accepted = post(sessions[0], url, token, run, ranks, ranks - 1, n, True)
    deadline, key = accepted + 30, (run, f"g{n}")
    while key not in clock.seen and time.perf_counter() < deadline:
        time.sleep(0.001)
    if key not in clock.seen:
        raise RuntimeError(f"no alert for trial {n} within 30 s")
    return clock.seen[key] - accepted


def measure(url: str, token: str, clock: AlertClock, ranks: int, trials: int) -> list[float]:
    run = f"latency-{ranks}-{int(time.time())}"
    with ThreadPoolExecutor(8) as pool:
        trial(url, token, run, ranks, 0, clock, pool)  # warm-up: run/rank rows, connections
        return [trial(url, token, run, ranks, n, clock, pool) for n in range(1, trials + 1)]


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--ingest", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--celery", type=int, default=2, help="Celery worker processes")
    args = parser.parse_args(argv)
    env = dict(bench_env("lockstep_bench_latency"), LOCKSTEP_SETTLE_TIMEOUT="600")  # only complete slots settle
    fresh_database(env)
    setup_django(env)
    token, session = project_member("bench-latency")
    servers = start_servers(env, ingest=args.ingest, celery=args.celery)
    rows = []
    try:
        time.sleep(3)  # Celery workers ready
        clock = AlertClock(
            servers.url, session, "grad_divergence", lambda a: (a.get("run"), (a.get("details") or {}).get("group"))
        )
        clock.start()
        for ranks in args.ranks:
            lat = measure(servers.url, token, clock, ranks, args.trials)
            p50, p99 = pct(lat, 50), pct(lat, 99)
            goal50, goal99 = TARGETS.get(ranks, (None, None))
            verdict = "ok" if (goal50 is None or p50 <= goal50) and (goal99 is None or p99 <= goal99) else "MISSED"
            goal = " ".join(
                x for x in (goal50 and f"p50<={goal50 * 1000:.0f}ms", goal99 and f"p99<={goal99 * 1000:.0f}ms") if x
            )
            rows.append(
                (
                    f"{ranks} ranks",
                    f"p50 {p50 * 1000:.0f} ms / p99 {p99 * 1000:.0f} ms / max {max(lat) * 1000:.0f} ms",
                    f"target {goal or '-'}: {verdict} ({len(lat)} trials)",
                )
            )
    finally:
        servers.stop()
    report(
        "detection_latency",
        argv,
        f"P2 detection latency (last batch accepted -> alert on websocket; {args.ingest} ingest, "
        f"{args.celery} Celery processes)",
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
