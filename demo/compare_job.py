"""One job recorded under two PyTorch versions for the compare page (run it under torchrun).

A user module (`Net`, made of `Block`s) under `DDP(torch.compile(net))`, a compiled loss
function, a batch that grows at `--grow-step` on every rank (each compiled frame recompiles once,
with `automatic_dynamic_shapes` off), the loss handed to the agent with `agent.log`, and two
compiler settings away from torch's defaults, so the compare page has frames to align, settings
to name and curves to plot. The agent is attached in code (settings from LOCKSTEP_* as usual).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# the repository root: demo.* and agents import however this starts (python demo/x.py, torchrun, -m agents run)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import agents  # noqa: E402
from demo.ddp_job import batch_for, end_distributed  # noqa: E402

torch._dynamo.config.automatic_dynamic_shapes = False  # a grown batch recompiles with static shapes
torch._inductor.config.fallback_random = True


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self, width: int = 64, depth: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(32, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.inp(x)))
        return out


@torch.compile
def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.smooth_l1_loss(out, target) + 1e-4 * out.pow(2).mean()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--grow-step", type=int, default=6, help="step from which every rank's batch has 8 more rows")
    args = p.parse_args()
    agent = agents.attach()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.compile(Net()))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(args.steps):
        rows = args.batch + (8 if step >= args.grow_step else 0)
        x, y = batch_for(rank, step, rows)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        agent.log(loss=loss)
    end_distributed()
    agent.close()


if __name__ == "__main__":
    main()
