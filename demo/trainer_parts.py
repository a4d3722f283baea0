"""What the trainer demos share (demo/lightning_job.py, demo/accelerate_job.py, demo/hf_trainer_job.py):
a tiny model with a forward of its own, synthetic data, a collate function that can give one rank's
batch a row more, and the fault options."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import TensorDataset
from torch.utils.data.dataloader import default_collate

FEATURES = 16


def fault_args(p: argparse.ArgumentParser, steps: int = 6) -> None:
    """--steps, --backend, --fault {none,lr,shape}, --fault-rank, --fault-step."""
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--backend", default="inductor", help="the torch.compile backend the trainer is given")
    p.add_argument(
        "--fault",
        choices=("none", "lr", "shape"),
        default="none",
        help="lr: --fault-rank trains with ten times the learning rate (its weights drift, the averaged "
        "gradients agree); shape: its batch at --fault-step has a row more (it alone recompiles)",
    )
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=2)


def job_parser(doc: str | None, batch: int) -> argparse.ArgumentParser:
    """A trainer job's options: the fault options and --batch (rows per rank and step)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    fault_args(p)
    p.add_argument("--batch", type=int, default=batch, help="rows per rank and step")
    return p


class TinyNet(nn.Module):
    """A residual MLP block: a forward of its own, so Dynamo traces it under any wrapper."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(FEATURES, dim), nn.Linear(dim, dim), nn.Linear(dim, 1)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = h + F.gelu(self.hidden(self.norm(h)))
        y: torch.Tensor = self.out(h)
        return y


def tiny_net() -> TinyNet:
    torch.manual_seed(0)  # the same initial weights on every rank
    return TinyNet()


def regression_data(rows: int) -> TensorDataset:
    """The same rows on every rank: the trainer's distributed sampler shards them."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, FEATURES, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(rows, 1, generator=g))


def announce(rank: int) -> None:
    """`FAULT_AT <epoch seconds> rank R`, the line the fault matrix (`python -m bench fault_matrix`) times from."""
    print(f"FAULT_AT {time.time():.3f} rank {rank}", flush=True)


class ExtraRowAt:
    """A collate function: batch number `at` (counted from 0) gets a copy of its first row more;
    `at=None`: none does. The trainers call it once per batch, in order, in the training process
    (Accelerate's loader one batch ahead)."""

    def __init__(self, at: int | None, rank: int, collate: Callable[[list[Any]], Any] = default_collate) -> None:
        self.at, self.rank, self.collate, self.calls = at, rank, collate, 0

    def __call__(self, rows: list[Any]) -> Any:
        if self.calls == self.at:
            rows = [*rows, rows[0]]
            announce(self.rank)
        self.calls += 1
        return self.collate(rows)


def announce_first_update(rank: int) -> None:
    """Announce the fault at the first optimizer step of this process, whichever optimizer the trainer made."""

    def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        handle.remove()
        announce(rank)

    handle = register_optimizer_step_post_hook(after_step)


def fault_of(args: argparse.Namespace, rank: int, lr: float) -> tuple[float, ExtraRowAt]:
    """This rank's learning rate and collate function under `--fault`."""
    faulty = rank == args.fault_rank
    if faulty and args.fault == "lr":
        announce_first_update(rank)
    return (
        lr * 10 if faulty and args.fault == "lr" else lr,
        ExtraRowAt(args.fault_step if faulty and args.fault == "shape" else None, rank),
    )
