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
from typing import NamedTuple

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


class Row(NamedTuple):
    """One test's line of the profile, as `pytest_runtest_protocol` writes it."""

    nodeid: str
    own: float
    reaped: float
    wall: float
    worker: str
    began: float

    @classmethod
    def parse(cls, line: str) -> Row:
        nodeid, own, reaped, wall, worker, began = line.rstrip("\n").split("\t")
        return cls(nodeid, float(own), float(reaped), float(wall), worker, float(began))


def table(lines: list[str]) -> str:
    """Files by CPU-seconds (own + reaped), with the wall time their tests took."""
    rows = [Row.parse(line) for line in lines]
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        totals = files[row.nodeid.split("::")[0]]
        totals[0], totals[1], totals[2] = totals[0] + row.own, totals[1] + row.reaped, totals[2] + row.wall
    ranked = sorted(files.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
    out = [f"{'cpu s':>8} {'own':>7} {'reaped':>7} {'wall s':>7}  file"]
    out += [f"{own + reaped:8.1f} {own:7.1f} {reaped:7.1f} {wall:7.1f}  {name}" for name, (own, reaped, wall) in ranked]
    own_all, reaped_all = sum(v[0] for v in files.values()), sum(v[1] for v in files.values())
    out.append(f"{own_all + reaped_all:8.1f} {own_all:7.1f} {reaped_all:7.1f} {'':>7}  all {len(files)} files")
    return "\n".join(out + workers(rows))


def workers(rows: list[Row]) -> list[str]:
    """When each worker finished its last test, counted from the run's first test: the gap between the
    first and the last to finish is time one core had nothing to run."""
    if not rows:
        return []
    start = min(row.began for row in rows)
    ends: dict[str, float] = defaultdict(float)
    busy: dict[str, float] = defaultdict(float)
    for row in rows:
        ends[row.worker] = max(ends[row.worker], row.began + row.wall)
        busy[row.worker] += row.wall
    return [""] + [
        f"{worker}: done at {ends[worker] - start:6.1f} s, {busy[worker]:6.1f} s in tests" for worker in sorted(ends)
    ]


if __name__ == "__main__":
    with open(sys.argv[1]) as profile:
        print(table(profile.readlines()))
