"""The suite's CPU profile counts a test's own work and the processes it started, per file."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.cpu_profile import table
from tests.stack import ROOT

BUSY = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end:\n    pass\n"


def test_a_child_process_counts_for_the_file_that_started_it(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_heavy.py").write_text(
        "import subprocess, sys\n"
        f"def test_starts_a_busy_child():\n    subprocess.run([sys.executable, '-c', {BUSY.format(s=0.6)!r}], check=True)\n"
    )
    (tmp_path / "test_light.py").write_text(f"def test_busy_itself():\n    exec({BUSY.format(s=0.3)!r})\n")
    profile = tmp_path / "profile.tsv"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:django", "-p", "no:cacheprovider", "-p", "tests.cpu_profile"]
        + ["--cpu-profile", str(profile), "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    files, _, spans = table(profile.read_text().splitlines()).partition(" files\n")
    rows = {line.split()[-1]: [float(x) for x in line.split()[:4]] for line in files.splitlines()[1:-1]}
    heavy, light = rows["test_heavy.py"], rows["test_light.py"]
    assert heavy[2] >= 0.55 and heavy[1] < 0.3  # the child's CPU is reaped, not the test process's own
    assert light[1] >= 0.28 and light[2] < 0.05
    assert list(rows) == ["test_heavy.py", "test_light.py"]  # most CPU first
    [span] = [line for line in spans.splitlines() if line]
    worker, _, rest = span.partition(": done at ")
    assert worker == "main" and float(rest.split()[0]) >= heavy[3] + light[3] - 0.1
