"""Common real training setups of a small transformer, for the false-alarm recordings (run it
under torchrun; with CUDA every rank uses cuda:0, backend gloo, so one GPU hosts several ranks and
Inductor builds real Triton kernels).

--setup (all clean: Lockstep must raise nothing on them):
  compile-ddp   torch.compile(DDP(model)): DDP's wrapper frames compile to empty graphs, each block
                to a real one
  ddp-compile   DDP(torch.compile(model))
  per-block     every block compiled on its own (block.compile()), DDP around the model
  checkpoint    DDP(torch.compile(model)), each block's MLP under torch.utils.checkpoint
  bf16          DDP(torch.compile(model)), the forward under torch.autocast(bfloat16)
  no-sync       DDP(torch.compile(model)), two micro-batches a step, the first under no_sync()
  fsdp2         fully_shard on each block and on the model, then torch.compile(model)
  containers    torch.compile(DDP(model)) of a model made only of torch.nn containers and layers:
                Dynamo starts no frame inside torch, so it really runs eager (ineffective_compile)
Positive controls on top of any setup:
  --recompile-rank R --recompile-step S   rank R's batch has a longer sequence at step S (it alone recompiles)
  --break-rank R                          rank R's blocks call torch._dynamo.graph_break() (it alone breaks)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_job import end_distributed  # noqa: E402

SETUPS = ("compile-ddp", "ddp-compile", "per-block", "checkpoint", "bf16", "no-sync", "fsdp2", "containers")
FEATURES, SEQ = 16, 32


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, checkpointed: bool, graph_break: bool) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.checkpointed, self.graph_break = checkpointed, graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        if self.graph_break:
            torch._dynamo.graph_break()
        h = self.ln2(x)
        return x + (checkpoint(self.mlp, h, use_reentrant=False) if self.checkpointed else self.mlp(h))


class Net(nn.Module):
    def __init__(
        self, dim: int = 64, heads: int = 4, depth: int = 3, checkpointed: bool = False, graph_break: bool = False
    ) -> None:
        super().__init__()
        self.inp, self.norm, self.head = nn.Linear(FEATURES, dim), nn.LayerNorm(dim), nn.Linear(dim, FEATURES)
        self.blocks = nn.ModuleList(Block(dim, heads, checkpointed, graph_break) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def containers(dim: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, dim), nn.GELU(), nn.LayerNorm(dim), nn.Linear(dim, FEATURES))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", choices=SETUPS, required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--recompile-rank", type=int)
    p.add_argument("--recompile-step", type=int, default=3)
    p.add_argument("--break-rank", type=int)
    return p.parse_args()


def build(setup: str, rank: int, device: torch.device, break_rank: int | None) -> nn.Module:
    """The setup's model, wrapped as that setup wraps it."""
    torch.manual_seed(0)
    if setup == "containers":
        return torch.compile(DDP(containers().to(device)))
    net = Net(checkpointed=setup == "checkpoint", graph_break=rank == break_rank).to(device)
    if setup == "compile-ddp":
        return torch.compile(DDP(net))
    if setup == "per-block":
        for block in net.blocks:
            block.compile()
        return DDP(net)
    if setup == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        return torch.compile(net)
    return DDP(torch.compile(net))


def batch(rank: int, step: int, rows: int, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(rows, seq, FEATURES, generator=g), torch.randn(rows, seq, FEATURES, generator=g)
    return x.to(device), y.to(device)


def train_step(model: nn.Module, setup: str, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if setup == "bf16" else contextlib.nullcontext()
    if setup != "no-sync":
        with autocast:
            loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        return loss.item()
    half = x.shape[0] // 2
    with model.no_sync():
        F.mse_loss(model(x[:half]), y[:half]).backward()
    loss = F.mse_loss(model(x[half:]), y[half:])
    loss.backward()
    return loss.item()


def main() -> None:
    args = parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(args.setup, rank, device, args.break_rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        seq = SEQ + (8 if (rank, step) == (args.recompile_rank, args.recompile_step) else 0)
        x, y = batch(rank, step, args.batch, seq, device)
        opt.zero_grad(set_to_none=True)
        loss = train_step(model, args.setup, x, y, device)
        opt.step()
        if rank == 0:
            print(f"{args.setup} step {step} loss {loss:.4f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    end_distributed()


if __name__ == "__main__":
    main()
