"""The smallest real DDP job (2 steps of one Linear layer on gloo, no compile), for tests that need
whole torchrun processes with and without the agent and not what they compile."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(steps: int = 2) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    time.sleep(0.3)  # gloo's threads free their last work before the group goes (demo/ddp_job.py says why)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
