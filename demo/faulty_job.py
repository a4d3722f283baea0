"""A small compiled DDP job (gloo, CPU) in which one rank fails in a chosen way at a chosen step, as
real jobs fail: the fault matrix (`python -m bench fault_matrix`) runs it under the agent.

    torchrun --nproc-per-node 3 -m agents run demo/faulty_job.py --fault sigkill --fault-rank 1

Faults: `sigkill` (killed outright, e.g. the OOM killer), `exception` (a Python error in the step),
`exit137` (the process exits with code 137 from inside, no exception), `loader_hang` (the data
loader stops delivering: the other ranks wait in the gradient all-reduce), `slow_compile` (one rank's
compile of a fresh frame takes `--slow-seconds` while the others wait), and three divergences the
job survives: `recompile` (a compiled helper every rank calls each step gets another batch size on
one rank at the fault step: it recompiles alone), `graph` (a fresh frame every rank compiles at the
fault step, one rank tracing another branch), `grad` (one rank's gradient nudged after the
all-reduce); their helpers compile with aot_eager, so the figure is the detection's, not Inductor's.
The failing rank prints `FAULT_AT <epoch seconds>` the moment it injects its fault.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# the repository root: demo.* and agents import however this starts (python demo/x.py, torchrun, -m agents run)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from demo.ddp_job import batch_for, end_distributed, first_grad, make_model, slow_backend  # noqa: E402

FAULTS = ("sigkill", "exception", "exit137", "loader_hang", "slow_compile", "recompile", "graph", "grad")
DIVERGENCES = ("recompile", "graph", "grad")  # injected inside the step, where each happens


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fault", choices=FAULTS, required=True)
    p.add_argument("--fault-rank", type=int, required=True)
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--sleep", type=float, default=0.3, help="seconds per step, so heartbeats flow")
    p.add_argument("--slow-seconds", type=float, default=25.0)
    p.add_argument("--hang-seconds", type=float, default=40.0)
    return p.parse_args()


def head(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 0.5


def widen(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x).mean(dim=0)


def branchy(x: torch.Tensor, odd: bool) -> torch.Tensor:
    """A rank-dependent Python branch: Dynamo traces another graph on the odd rank."""
    return torch.tanh(x) * 0.5 if odd else torch.sigmoid(x) - 0.5


def announce(rank: int) -> None:
    print(f"FAULT_AT {time.time():.3f} rank {rank}", flush=True)


def inject(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    announce(rank)
    if args.fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if args.fault == "exception":
        raise RuntimeError(f"bad batch on rank {rank}: a label out of range")
    if args.fault == "exit137":
        os._exit(137)
    if args.fault == "loader_hang":
        time.sleep(args.hang_seconds)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.compile(make_model()))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    slow = args.slow_seconds if (args.fault, rank) == ("slow_compile", args.fault_rank) else 0.0
    late_head = torch.compile(head, backend=slow_backend(slow))
    late_branch = torch.compile(branchy, backend="aot_eager")
    widening = torch.compile(widen, backend="aot_eager", dynamic=False)
    for step in range(args.steps):
        failing = (rank, step) == (args.fault_rank, args.fault_step)
        x, y = batch_for(rank, step, 16)
        if failing and args.fault not in ("slow_compile", *DIVERGENCES):
            inject(args)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        if args.fault == "recompile":
            if failing:
                announce(rank)
            out = out + widening(torch.ones(3 if failing else 2, out.shape[1]))  # another size: a recompile
        if step == args.fault_step and args.fault == "slow_compile":
            if rank == args.fault_rank:
                announce(rank)
            out = late_head(out)  # a fresh frame: every rank compiles it here, one of them slowly
        if step == args.fault_step and args.fault == "graph":
            if failing:
                announce(rank)
            out = late_branch(out, failing)  # a fresh frame: every rank compiles it here, one another graph
        nn.functional.mse_loss(out, y).backward()
        if failing and args.fault == "grad":
            announce(rank)
            with torch.no_grad():
                first_grad(model).view(-1)[0] += 1e-3
        opt.step()
        time.sleep(args.sleep)
    end_distributed()


if __name__ == "__main__":
    main()
