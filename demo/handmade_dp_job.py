"""Data parallelism without torch's DDP class, as Megatron-LM, DeepSpeed or a hand-written loop do it
(run it under torchrun, with the agent: `torchrun ... -m agents run demo/handmade_dp_job.py`).

Each rank trains a compiled MLP and averages its gradients itself with `all_reduce` before the
step, so the MLP's parameters are replicas the agent cannot learn about from a DDP module. Beside
it, each rank trains a head of its own on its own data with a second optimizer and never averages
it: an ensemble member, never to be compared. `--seed-rank R` initialises rank R's MLP from another
seed: its weights differ from every other rank's from the first step on (the fault a broadcast of
the initial weights prevents), while the averaged gradients still agree. `--independent`: no rank
averages anything and each starts from its own seed (independent models, an ensemble: nothing is
compared, nothing is raised); `--compiled-step`: the optimizer step runs under `torch.compile`, as
PyTorch documents it (the agent cannot fingerprint inside it, and says so once).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

from demo.ddp_job import batch_for, compile_module, end_distributed, make_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed-rank", type=int, default=None, help="rank whose replicated model starts from another seed")
    p.add_argument("--independent", action="store_true", help="no averaging, a seed per rank: independent models")
    p.add_argument("--compiled-step", action="store_true", help="the optimizer step under torch.compile")
    p.add_argument("--device", default="cpu", help="where every rank trains (cuda: all ranks on cuda:0, over gloo)")
    return p.parse_args()


def average_gradients(model: nn.Module, world_size: int) -> None:
    """The hand-written all-reduce: every rank ends with the mean gradient."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world_size


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    module = make_model()  # seeded: the same weights on every rank
    if rank == args.seed_rank or args.independent:
        torch.manual_seed(1234 + rank)
        for p in module.parameters():
            nn.init.normal_(p, std=0.1)
    model = compile_module(module.to(device))
    torch.manual_seed(rank)
    head = nn.Linear(4, 1).to(device)  # this rank's own
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.05)
    step_fn = torch.compile(opt.step) if args.compiled_step else opt.step
    for step in range(args.steps):
        x, y = (t.to(device) for t in batch_for(rank, step, 16))
        opt.zero_grad(set_to_none=True)
        head_opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = nn.functional.mse_loss(out, y) + head(out.detach()).pow(2).mean()
        loss.backward()
        if not args.independent:
            average_gradients(model, world_size)
        step_fn()
        head_opt.step()
    end_distributed()


if __name__ == "__main__":
    main()
