"""A Lightning job as teams write it: `Trainer(strategy="ddp")` fitting a `torch.compile`d
LightningModule (run it under torchrun with the agent:
`torchrun --nproc-per-node 3 -m agents run demo/lightning_job.py`).

Under torchrun Lightning takes the ranks from the launcher (its TorchElastic environment) and joins
the gloo process group itself; `devices` is the launcher's ranks per node. Lightning unwraps the
compiled module, compiles its `forward` and `training_step` in place and wraps the module in
DistributedDataParallel: DDP around compiled code. Faults, on `--fault-rank` alone: `--fault lr`
(its optimizer gets ten times the learning rate: the gradients, averaged by DDP, still agree; its
weights drift from the first update on) and `--fault shape` (its batch at `--fault-step` has a row
more: it alone recompiles).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, cast

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from demo.ddp_job import end_distributed
from demo.trainer_parts import fault_of, job_parser, regression_data, tiny_net


def parse_args() -> argparse.Namespace:
    p = job_parser(__doc__, batch=8)
    return p.parse_args()


class Regression(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.net, self.lr = tiny_net(), lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.net(x)
        return y

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    lr, collate = fault_of(args, rank, 0.01)
    data = DataLoader(regression_data(args.steps * args.batch * world), batch_size=args.batch, collate_fn=collate)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=world // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    # Lightning takes the compiled module (an OptimizedModule, not a LightningModule to type checkers)
    trainer.fit(cast(L.LightningModule, torch.compile(Regression(lr), backend=args.backend)), data)
    # Lightning leaves the process group up; gloo on torch 2.13 needs the barrier before destroying it
    end_distributed()


if __name__ == "__main__":
    main()
