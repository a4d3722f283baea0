"""A small real DDP training job for tests and the live demo (run it under torchrun).

`DDP(torch.compile(model))` so real graphs are compiled (torch.compile(DDP(model)) compiles
only empty graphs on torch 2.13). Optional provocations: one rank gets one extra row at one
step (it alone recompiles: "size mismatch"), one rank nudges one gradient (grad divergence).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--shape-rank", type=int, default=None, help="rank that gets batch+1 rows at --shape-step")
    p.add_argument("--shape-step", type=int, default=None)
    p.add_argument("--perturb-rank", type=int, default=None, help="rank that nudges one grad at --perturb-step")
    p.add_argument("--perturb-step", type=int, default=None)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    return p.parse_args()


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def batch_for(rank: int, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(rows, 32, generator=g), torch.randn(rows, 4, generator=g)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.compile(make_model()))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(args.steps):
        rows = args.batch + (1 if (rank, step) == (args.shape_rank, args.shape_step) else 0)
        x, y = batch_for(rank, step, rows)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if (rank, step) == (args.perturb_rank, args.perturb_step):
            with torch.no_grad():
                next(model.parameters()).grad.view(-1)[0] += 1e-3
        opt.step()
        if args.sleep:
            time.sleep(args.sleep)
        if rank == 0 and os.environ.get("DEMO_VERBOSE"):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
