"""The reliability drills as one table. Each drill is a test of the suite;
this script runs them with pytest and prints what they measured (pytest's junit properties).

    python -m bench reliability            # ~5 minutes on 2 cores
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.results import markdown, record, rerun

ROOT = Path(__file__).resolve().parent.parent

DRILLS = [
    (
        "backend down 60 s mid-run (2-rank torchrun job)",
        "tests/e2e/test_drills.py",
        lambda p: (
            f"down {float(p['down_s']):.0f} s: lost {p['events_lost']}, duplicated {p['events_duplicated']}; step p99 {p['step_p99_up_ms']} ms "
            f"while up, {p['step_p99_down_ms']} ms while down"
        ),
    ),
    (
        "Celery worker killed (SIGKILL) mid-task",
        "tests/e2e/test_worker_killed.py",
        lambda p: f"{p['alerts']} alert, {p['websocket_pushes']} websocket push",
    ),
    (
        "PostgreSQL stopped and restarted mid-ingest (2 ASGI workers)",
        "tests/ingest/test_faults.py::test_two_workers_then_database_outage_then_recovery",
        lambda p: (
            f"{p['accepted_batches_stored']} of {p['accepted_batches']} accepted batches stored, once each; 503 + Retry-After while down"
        ),
    ),
    (
        "10k fuzzed bad requests",
        "tests/ingest/test_fuzz_volume.py",
        lambda p: f"{p['bad_requests']} refused with 4xx {p['statuses']}; {p['stored']} rows stored",
    ),
    (
        "agent spool cap respected (drops counted)",
        "tests/agents/test_transport.py::test_spool_cap_drops_and_counts",
        lambda p: "spool stays under its cap; overflow counted as `dropped` events",
    ),
    (
        "project B attacks project A (every endpoint, page, websocket)",
        "tests/security/test_cross_project.py",
        lambda p: f"{p['attempts']} attempts, {p['through']} got through",
    ),
    (
        "token rotated mid-job, spool uploaded with the new one",
        "tests/security/test_agent_drills.py::test_a_token_rotated_mid_job_loses_nothing",
        lambda p: f"{p['through']} steps got in with the revoked token; {p['events_lost']} events lost",
    ),
    (
        "proxy answers 404, then 413, mid-job",
        "tests/security/test_agent_drills.py::test_a_proxy_answering_404_then_413_mid_job_loses_nothing",
        lambda p: f"{p['refused']} answered by the proxy; {p['events_lost']} events lost",
    ),
    (
        "webhook receiver down 1 h (time simulated)",
        "tests/security/test_receiver_outage.py",
        lambda p: f"{p['attempts']} attempts in all, delivered once when back; 0 notifications lost",
    ),
    (
        "200 stalled request bodies",
        "tests/security/test_hostile_bodies.py",
        lambda p: (
            f"+{int(p['stalled_rss_kib']) / 1024:.1f} MiB server RSS; each cut with 408; the server kept answering"
        ),
    ),
]


def run(target: str) -> tuple[str, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                target,
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                "-o",
                "junit_family=xunit1",
            ],
            cwd=ROOT,
            env={**os.environ, "LOCKSTEP_DRILL_DOWN_S": "60"},  # the drill's full outage (10 s in the suite)
            capture_output=True,
            text=True,
        )
        props = {}
        if report.exists():
            for prop in ET.parse(report).iter("property"):
                props[prop.get("name")] = prop.get("value")
    return ("pass" if proc.returncode == 0 else "FAIL"), props


def main(argv: list[str] | None = None) -> int:
    rows = []
    for name, target, describe in DRILLS:
        verdict, props = run(target)
        try:
            detail = describe(props)
        except KeyError:
            detail = "(no measurements: see `pytest " + target + "`)"
        rows.append((name, verdict, detail))
        print(f"{verdict:4}  {name}", file=sys.stderr)
    width = max(len(r[0]) for r in rows)
    print(f"\nReliability drills\n{'-' * (width + 60)}")
    for name, verdict, detail in rows:
        print(f"{name:<{width}}  {verdict:<4}  {detail}")
    record(
        "reliability",
        markdown(("drill", "result", "measured"), rows),
        rerun("reliability", argv),
        "Each drill is a test of the suite (docs/reliability.md names them); the table is what they measured.",
    )
    return 0 if all(verdict == "pass" for _, verdict, _ in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
