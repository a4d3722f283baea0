"""A job that hangs the way a compile straggler does: one rank falls behind, the others wait
in the next all_reduce until the collective timeout kills the job (issue 15: hang_forecast).

Run under torchrun with the agent (`-m agents run demo/hang_job.py --stall compile`). Every rank
trains a small compiled model and all-reduces its gradients itself (so the waiting ranks sit in
`dist.all_reduce`). At `--stall-step`, rank `--late-rank`:
  * `compile`: its model gets deeper (a Python attribute Dynamo guards on), so the guard fails and
    Dynamo compiles a fresh, `--depth`-layer unrolled graph: a real slow recompile;
  * `data`: its DataLoader's next item blocks (a read that never returns: a real stall).
With `--ddp` the model is `DDP(torch.compile(model))` instead, so the waiting ranks sit in DDP's
bucket all-reduce inside backward, as most real jobs do. The process group's timeout is
`--timeout` seconds; nothing here sleeps in place of the work.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

# the repository root: demo.* and agents import however this starts (python demo/x.py, torchrun, -m agents run)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from demo.ddp_job import end_distributed  # noqa: E402


class Net(torch.nn.Module):
    """`depth` tanh layers sharing one weight: deeper means a larger graph, the same parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(32, 32) * 0.1)
        self.b = torch.nn.Parameter(torch.zeros(32))
        self.depth = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.depth):
            x = torch.tanh(x @ self.w + self.b) * (1.0 + 0.001 * i)
        return x


class Batches(Dataset[torch.Tensor]):
    """Item `stall_at` never arrives on the stalling rank (it waits for an event nobody sets)."""

    def __init__(self, stall_at: int | None) -> None:
        self.stall_at = stall_at
        self.never = threading.Event()

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.stall_at:
            print(f"STALL {time.time():.3f}", flush=True)  # bench/hang_forecast.py starts its clock here
            self.never.wait()
        return torch.full((32,), float(i % 7))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stall", choices=("compile", "data"), required=True)
    parser.add_argument("--stall-step", type=int, default=2)
    parser.add_argument("--late-rank", type=int, default=1)
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--ddp", action="store_true", help="DDP(torch.compile(model)): gradients all-reduced in backward"
    )
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    late = rank == args.late_rank
    torch.manual_seed(0)
    net = Net()
    model = torch.compile(net, dynamic=False)
    if args.ddp:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    batch = 8
    stall_item = args.stall_step * batch if late and args.stall == "data" else None
    loader = DataLoader(Batches(stall_item), batch_size=batch)
    for step, x in zip(range(args.steps), loader):
        if late and args.stall == "compile" and step == args.stall_step:
            net.depth = args.depth
            print(f"rank {rank}: step {step} recompiles a {args.depth}-layer graph", flush=True)
            print(f"STALL {time.time():.3f}", flush=True)
        model(x).sum().backward()
        if not args.ddp:
            for p in net.parameters():
                dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()
        print(f"rank {rank}: step {step} done", flush=True)
    end_distributed()


if __name__ == "__main__":
    main()
