"""Where the suite's CPU goes, per test file: `scripts/test.sh -p tests.cpu_profile --cpu-profile PATH`
appends one line per test (its test process's own CPU-seconds, and those of every process it reaped:
torchrun jobs with their ranks and compilers, stacks, browsers), then
`python -m tests.cpu_profile PATH` prints the files by CPU. Wall time alone cannot say which files to
make cheaper: on two cores three workers slow each other down, so a file's wall time is mostly its
neighbours'. PostgreSQL's and Redis's own CPU is not counted (they are not the tests' children)."""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-profile", metavar="PATH", help="append each test's CPU-seconds to PATH")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = item.config.getoption("--cpu-profile")
    before, started, began = os.times(), time.monotonic(), time.time()
    result = yield
    if path:
        after = os.times()
        own = after.user + after.system - before.user - before.system
        reaped = after.children_user + after.children_system - before.children_user - before.children_system
        with open(path, "a") as out:
            worker = getattr(item.config, "workerinput", {}).get("workerid", "main")  # not the env: children inherit it
            wall = time.monotonic() - started
            out.write(f"{item.nodeid}\t{own:.2f}\t{reaped:.2f}\t{wall:.2f}\t{worker}\t{began:.2f}\n")
    return result


def table(lines: list[str]) -> str:
    """Files by CPU-seconds (own + reaped), with the wall time their tests took."""
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for line in lines:
        nodeid, own, reaped, wall = line.rstrip("\n").split("\t")[:4]
        totals = files[nodeid.split("::")[0]]
        for i, value in enumerate((own, reaped, wall)):
            totals[i] += float(value)
    rows = sorted(files.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    out = [f"{'cpu s':>8} {'own':>7} {'reaped':>7} {'wall s':>7}  file"]
    out += [f"{own + reaped:8.1f} {own:7.1f} {reaped:7.1f} {wall:7.1f}  {name}" for name, (own, reaped, wall) in rows]
    own_all, reaped_all = sum(v[0] for v in files.values()), sum(v[1] for v in files.values())
    out.append(f"{own_all + reaped_all:8.1f} {own_all:7.1f} {reaped_all:7.1f} {'':>7}  all {len(files)} files")
    return "\n".join(out + workers(lines))


def workers(lines: list[str]) -> list[str]:
    """When each worker finished its last test, counted from the run's first test: the gap between the
    first and the last to finish is time one core had nothing to run."""
    spans: dict[str, list[float]] = defaultdict(lambda: [float("inf"), 0.0, 0.0])
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 6:
            continue
        wall, worker, began = float(fields[3]), fields[4], float(fields[5])
        span = spans[worker]
        span[0], span[1], span[2] = min(span[0], began), max(span[1], began + wall), span[2] + wall
    if not spans:
        return []
    start = min(span[0] for span in spans.values())
    return [""] + [
        f"{worker}: done at {end - start:6.1f} s, {busy:6.1f} s in tests"
        for worker, (_, end, busy) in sorted(spans.items())
    ]


if __name__ == "__main__":
    with open(sys.argv[1]) as profile:
        print(table(profile.readlines()))
