"""bench/RESULTS.md is generated: a run replaces its own section, keeps the others, sorted by name;
`python -m bench` is the one entry point and every bench has a `main(argv)`."""

from __future__ import annotations

import importlib
import subprocess
import sys
from datetime import UTC, datetime

from bench import results
from bench.__main__ import benches
from tests.stack import ROOT


def test_a_run_replaces_its_section_and_keeps_the_others(tmp_path):
    path = tmp_path / "RESULTS.md"
    table = results.markdown(("measure", "value"), [("rate", "1|2")])
    results.write_section("pages", table, "python -m bench pages", "first", datetime(2026, 1, 2, tzinfo=UTC), path)
    results.write_section("compare", table, "python -m bench compare -n 3", "", datetime(2026, 1, 3, tzinfo=UTC), path)
    results.write_section("pages", table, "python -m bench pages -n 5", "again", datetime(2026, 1, 4, tzinfo=UTC), path)
    text = path.read_text()
    assert text.startswith(results.HEADER)
    assert text.index("## compare") < text.index("## pages")
    assert text.count("## pages") == 1 and "first" not in text
    assert "Run 2026-01-04T00:00:00+00:00: `python -m bench pages -n 5`" in text
    assert "Run 2026-01-03T00:00:00+00:00: `python -m bench compare -n 3`" in text
    assert "| rate | 1\\|2 |" in text


def test_every_bench_has_main_and_runs_through_one_entry_point():
    names = benches()
    assert {"ingest", "ingest_cadence", "pages", "reliability"} <= set(names)
    for name in names:
        assert callable(importlib.import_module(f"bench.{name}").main), name
    listed = subprocess.run([sys.executable, "-m", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 2 and "ingest_cadence" in listed.stdout
    help_ = subprocess.run(
        [sys.executable, "-m", "bench", "pages", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert help_.returncode == 0 and "python -m bench pages" in help_.stdout


def test_no_bench_edits_the_import_path():
    for path in (ROOT / "bench").glob("*.py"):
        assert "sys.path" not in path.read_text(), path
