"""P8: a rank stalls -> hang_forecast on the websocket, on real 3-rank gloo torchrun jobs.

Each trial runs demo/hang_job.py under the agent with the agent's and the server's defaults
(5 s heartbeats, 0.5 s progress sampling, the 2 s sweep, LOCKSTEP_HANG_WARN_AFTER=10): rank 1
stalls at step 2 (its DataLoader item never arrives, or `--stall compile`: a guard failure makes it
compile a large graph afresh) while ranks 0 and 2 wait in the next all_reduce. The clock starts
when rank 1 prints that it stalls (its wall clock, the same host) and stops when the forecast
reaches a websocket client; the job is then killed (it would die at the collective timeout).

    python -m bench hang_forecast --trials 5
    python -m bench hang_forecast --stall compile --depth 40 --trials 3
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time

from agents.launch import torchrun
from bench.common import ROOT, bench_env, free_port, fresh_database, project_member, setup_django, start_servers
from bench.results import report

TARGET_S = 15.0


class ForecastClock(threading.Thread):
    """Wall time at which each run's first hang_forecast arrives on the project's websocket; a
    dropped connection is reopened (and counted), so a trial is never lost to the client."""

    def __init__(self, url: str, session: str) -> None:
        super().__init__(daemon=True)
        self.url, self.session = url, session
        self.seen: dict[str, tuple[float, dict]] = {}
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self.ws = self._connect()

    def stop(self) -> None:
        """Before the servers go: what the client sees after this is the shutdown, not a drop."""
        self.stopped.set()
        self.ws.close()

    def _connect(self):
        from websockets.sync.client import connect

        return connect(
            self.url.replace("http", "ws") + "/ws/alerts/",
            open_timeout=10,
            additional_headers={"Cookie": f"sessionid={self.session}", "Origin": self.url},
        )

    def run(self) -> None:
        while True:
            try:
                for raw in self.ws:
                    alert = json.loads(raw).get("alert") or {}
                    if alert.get("kind") == "hang_forecast" and alert.get("run") not in self.seen:
                        self.seen[alert["run"]] = (time.time(), alert)
                if not self.stopped.is_set():
                    self.errors.append("closed by the server")
            except Exception as exc:  # the server closed or the socket broke: note it, reconnect
                if not self.stopped.is_set():
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            if self.stopped.wait(0.5):
                return
            try:
                self.ws = self._connect()
            except Exception as exc:
                self.errors.append(f"reconnect: {type(exc).__name__}: {exc}")


def trial(url: str, token: str, env: dict, args, n: int, clock: ForecastClock) -> tuple[float | None, float, dict]:
    """(stall -> forecast seconds or None when it never came, collective timeout, the alert or what was stored)."""
    from dashboard.devstack.processes import kill_tree

    run = f"hang-{args.stall}-{int(time.time())}-{n}"
    cache = tempfile.mkdtemp(prefix="lockstep-bench-hang-inductor-")  # rank 1's graph is compiled afresh
    job_env = dict(
        env,
        LOCKSTEP_URL=url,
        LOCKSTEP_TOKEN=token,
        LOCKSTEP_RUN=run,
        OMP_NUM_THREADS="1",
        TORCHINDUCTOR_COMPILE_THREADS="1",
        LOCKSTEP_SPOOL_DIR=f"/tmp/lockstep-bench-hang/{run}",
        TORCHINDUCTOR_CACHE_DIR=cache,
    )
    cmd = torchrun(
        3,
        "demo/hang_job.py",
        *("--stall", args.stall, "--depth", str(args.depth), "--timeout", str(args.timeout)),
        port=free_port(),
    )
    job = subprocess.Popen(
        cmd, cwd=ROOT, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    stalled = None
    assert job.stdout is not None  # stdout=PIPE
    try:
        for line in job.stdout:
            match = re.search(r"STALL (\d+\.\d+)", line)
            if match:
                stalled = float(match.group(1))
                break
        deadline = time.time() + args.timeout
        while run not in clock.seen and time.time() < deadline:
            time.sleep(0.05)
    finally:
        kill_tree(job)
        job.wait()
        shutil.rmtree(cache, ignore_errors=True)
    if stalled is None or run not in clock.seen:
        return None, float(args.timeout), {"run": run, "stalled": stalled, "stored": stored_alerts(url, token, run)}
    arrived, alert = clock.seen[run]
    return arrived - stalled, float(args.timeout), alert


def stored_alerts(url: str, token: str, run: str) -> list[str]:
    """What the server holds for a trial whose forecast never reached the websocket (a missed trial)."""
    import requests

    answer = requests.get(f"{url}/api/v1/runs/{run}/alerts", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    if answer.status_code != 200:
        return [f"HTTP {answer.status_code}"]
    return [f"{a['kind']} {a['severity']} {a['state']} ranks {a['ranks']}" for a in answer.json()["alerts"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--stall", choices=("data", "compile"), default="data")
    parser.add_argument("--depth", type=int, default=40, help="layers of the graph rank 1 recompiles (--stall compile)")
    parser.add_argument("--timeout", type=float, default=60.0, help="the job's collective timeout, seconds")
    args = parser.parse_args(argv)
    env = bench_env("lockstep_bench_hang")
    fresh_database(env)
    setup_django(env)
    token, session = project_member("bench-hang")
    servers = start_servers(env, ingest=1, celery=0)
    servers.add_worker(env, "lockstep-bench-hang-worker")
    latencies, alerts, missed = [], [], []
    try:
        time.sleep(3)
        clock = ForecastClock(servers.url, session)
        clock.start()
        for n in range(args.trials):
            seconds, timeout, alert = trial(servers.url, token, env, args, n, clock)
            if seconds is None:
                missed.append(alert)
                print(f"trial {n}: no forecast within {timeout:.0f} s; stored: {alert['stored']}", flush=True)
                continue
            latencies.append(seconds)
            alerts.append(alert)
            print(f"trial {n}: {seconds:.1f} s, {alert['severity']}: {alert['message'][:160]}", flush=True)
        clock.stop()
    finally:
        servers.stop()
    half = args.timeout / 2
    latencies = latencies or [float("inf")]
    verdict = "ok" if not missed and max(latencies) <= TARGET_S and max(latencies) < half else "MISSED"
    report(
        f"hang_forecast ({args.stall} stall)",
        argv,
        f"P8 stall -> hang_forecast on the websocket ({args.stall} stall, 3-rank gloo jobs, "
        f"{args.timeout:.0f} s collective timeout, defaults)",
        [
            (
                "stall -> forecast",
                f"median {statistics.median(latencies):.1f} s / max {max(latencies):.1f} s "
                f"(min {min(latencies):.1f} s)",
                f"target <= {TARGET_S:.0f} s and < {half:.0f} s (half the timeout): {verdict} ({len(latencies)} trials)",
            ),
            ("late rank named", f"{sum(a['ranks'] == [1] for a in alerts)} of {len(alerts)}", "rank 1 every time"),
            ("trials without a forecast", str(len(missed)), "; ".join(str(m["stored"]) for m in missed)[:200]),
            ("websocket drops", str(len(clock.errors)), "; ".join(clock.errors)[:200]),
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
