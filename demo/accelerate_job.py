"""An Accelerate training loop as teams write it, with torch.compile through
`Accelerator(dynamo_backend=...)` (run it under torchrun with the agent:
`torchrun --nproc-per-node 3 -m agents run demo/accelerate_job.py`).

`accelerator.prepare` joins the gloo process group (cpu=True), wraps the model in
DistributedDataParallel and then compiles the wrapper: torch.compile(DDP(model)); it also shards the
data loader across the ranks and wraps the optimizer. Faults, on `--fault-rank` alone: `--fault lr`
(its optimizer gets ten times the learning rate: the gradients, averaged by DDP, still agree; its
weights drift from the first update on) and `--fault shape` (its batch at `--fault-step` has a row
more: it alone recompiles).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from demo.ddp_job import end_distributed
from demo.trainer_parts import fault_of, job_parser, regression_data, tiny_net


def parse_args() -> argparse.Namespace:
    p = job_parser(__doc__, batch=8)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    from accelerate import Accelerator

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, dynamo_backend=args.backend)
    rank, world = accelerator.process_index, accelerator.num_processes
    lr, collate = fault_of(args, rank, 0.01)
    model = tiny_net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = DataLoader(regression_data(args.steps * args.batch * world), batch_size=args.batch, collate_fn=collate)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    model.train()
    for x, y in data:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
    # end_training destroys the process group, without the barrier gloo on torch 2.13 needs first
    end_distributed()
    accelerator.end_training()


if __name__ == "__main__":
    main()
