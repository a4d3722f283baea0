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
  gpt2          torch.compile(DDP(model)) of a Hugging Face transformers GPT-2 (a small random-init
                GPT2Config, nothing downloaded), trained as a language model on random tokens
Positive controls on top of any setup:
  --recompile-rank R --recompile-step S   rank R's batch has a longer sequence at step S (it alone recompiles)
  --break-rank R                          rank R's blocks call torch._dynamo.graph_break() (it alone breaks)
  --autocast-rank R                       rank R alone runs its forward under bf16 autocast (another graph)
  --late-rank R                           rank R starts its first step once the shared cache holds an FX graph
                                          entry (its data came later): it loads what the others compile
  --raise-step S                          every rank raises the same RuntimeError at step S
  --inf-rank R --inf-step S               rank R's loss turns inf at step S (the all-reduce spreads NaN to all)
  --skew-rank R --skew-step S             from step S on, rank R scales its own gradients after the
                                          all-reduce (its gradients and weights diverge); with
                                          --recompile-rank R --recompile-step S its recompile is the cause
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

# the repository root: demo.* and agents import however this starts (python demo/x.py, torchrun, -m agents run)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import agents  # noqa: E402
from demo.ddp_job import compile_module, end_distributed  # noqa: E402

SETUPS = ("compile-ddp", "ddp-compile", "per-block", "checkpoint", "bf16", "no-sync", "fsdp2", "containers", "gpt2")
FEATURES, SEQ, VOCAB = 16, 32, 256


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, d))
        return out


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
        mixed: torch.Tensor = checkpoint(self.mlp, h, use_reentrant=False) if self.checkpointed else self.mlp(h)
        return x + mixed


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
        out: torch.Tensor = self.head(self.norm(h))
        return out


def containers(dim: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, dim), nn.GELU(), nn.LayerNorm(dim), nn.Linear(dim, FEATURES))


def gpt2() -> nn.Module:
    """A 2-layer GPT-2 of transformers' own modeling code, random weights (no hub access)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
    )
    model: nn.Module = GPT2LMHeadModel(config)  # transformers' hints are not read: Any to mypy
    return model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", choices=SETUPS, required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--recompile-rank", type=int)
    p.add_argument("--recompile-step", type=int, default=3)
    p.add_argument("--break-rank", type=int)
    p.add_argument("--autocast-rank", type=int)
    p.add_argument("--late-rank", type=int)
    p.add_argument("--raise-step", type=int)
    p.add_argument("--inf-rank", type=int)
    p.add_argument("--inf-step", type=int, default=3)
    p.add_argument("--skew-rank", type=int)
    p.add_argument("--skew-step", type=int, default=3)
    return p.parse_args()


def build(setup: str, rank: int, device: torch.device, break_rank: int | None) -> nn.Module:
    """The setup's model, wrapped as that setup wraps it."""
    torch.manual_seed(0)
    if setup == "containers":
        return compile_module(DDP(containers().to(device)))
    if setup == "gpt2":
        return compile_module(DDP(gpt2().to(device)))
    net = Net(checkpointed=setup == "checkpoint", graph_break=rank == break_rank).to(device)
    if setup == "compile-ddp":
        return compile_module(DDP(net))
    if setup == "per-block":
        for block in net.blocks:
            block.compile()
        return DDP(net)
    if setup == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        return compile_module(net)
    return DDP(torch.compile(net))


def batch(
    setup: str, rank: int, step: int, rows: int, seq: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    if setup == "gpt2":
        tokens = torch.randint(0, VOCAB, (rows, seq + 1), generator=g)
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    x, y = torch.randn(rows, seq, FEATURES, generator=g), torch.randn(rows, seq, FEATURES, generator=g)
    return x.to(device), y.to(device)


def loss_of(model: nn.Module, setup: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if setup == "gpt2":
        logits = model(input_ids=x).logits
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
    return F.mse_loss(model(x).float(), y)


def train_step(
    model: nn.Module, setup: str, x: torch.Tensor, y: torch.Tensor, device: torch.device, bf16: bool, scale: float
) -> float:
    """One forward and backward; `scale` multiplies the loss (inf: the loss turns inf)."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    if setup != "no-sync":
        with autocast:
            loss = loss_of(model, setup, x, y) * scale
        loss.backward()
        return loss.item()
    half = x.shape[0] // 2
    assert isinstance(model, DDP)  # build wraps no-sync's model in DDP, whose no_sync this needs
    with model.no_sync():
        F.mse_loss(model(x[:half]), y[:half]).backward()
    loss = F.mse_loss(model(x[half:]), y[half:])
    loss.backward()
    return loss.item()


def wait_for_cache_entry(timeout_s: float = 120.0) -> None:
    """Sleep until another rank wrote an FX graph entry into the shared Inductor cache dir."""
    entries = os.path.join(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent"), "fxgraph", "*", "*")
    deadline = time.monotonic() + timeout_s
    while not glob.glob(entries) and time.monotonic() < deadline:
        time.sleep(0.1)


def skew(model: nn.Module) -> None:
    """A rank-local change to gradients already all-reduced: this rank's weights drift from the others'."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(1.001)


def main() -> None:
    args = parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = build(args.setup, rank, device, args.break_rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    bf16 = args.setup == "bf16" or rank == args.autocast_rank
    if rank == args.late_rank:
        wait_for_cache_entry()
    for step in range(args.steps):
        if step == args.raise_step:
            raise RuntimeError(f"loss went out of range at step {step}: check the learning rate schedule")
        seq = SEQ + (8 if (rank, step) == (args.recompile_rank, args.recompile_step) else 0)
        x, y = batch(args.setup, rank, step, args.batch, seq, device)
        opt.zero_grad(set_to_none=True)
        scale = float("inf") if (rank, step) == (args.inf_rank, args.inf_step) else 1.0
        loss = train_step(model, args.setup, x, y, device, bf16, scale)
        agents.attach().log(loss)  # the agent `agents run` attached: a non-finite loss names its rank
        if rank == args.skew_rank and step >= args.skew_step:
            skew(model)
        opt.step()
        if rank == 0:
            print(f"{args.setup} step {step} loss {loss:.4f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    end_distributed()


if __name__ == "__main__":
    main()
