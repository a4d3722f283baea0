"""The torchrun command line that starts a job under the agent: one builder for the demo stack,
the benches and the tests (`python -m torch.distributed.run`, so the interpreter's own torch runs
the ranks, and `-m agents run` in front of the script where the agent attaches from outside)."""

from __future__ import annotations

import sys


def torchrun(
    ranks: int,
    script: str,
    *args: str,
    port: int | str | None = None,
    agent: bool = True,
    python: str | None = None,
) -> list[str]:
    """`python -m torch.distributed.run --nproc-per-node RANKS [--master-port PORT] [-m agents run] SCRIPT ARGS`."""
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        *(["--master-port", str(port)] if port is not None else []),
        *(["-m", "agents", "run"] if agent else []),
        script,
        *args,
    ]
