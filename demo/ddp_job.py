"""A small real DDP training job for tests and the live demo (run it under torchrun).

`DDP(torch.compile(model))` so real graphs are compiled (torch.compile(DDP(model)) compiles
only empty graphs on torch 2.13). Optional provocations: one rank gets one extra row at one
step (it alone recompiles: "size mismatch"), one rank nudges one gradient (grad divergence).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any, cast

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
    p.add_argument(
        "--stop-file",
        default=None,
        help="end early, every rank at the same step, once this file exists (rank 0 looks, all agree)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: nccl with one GPU per rank when CUDA is available, else gloo on the CPU",
    )
    p.add_argument("--width", type=int, default=64, help="hidden width of the MLP")
    p.add_argument("--depth", type=int, default=2, help="hidden layers of the MLP")
    p.add_argument(
        "--time-from",
        type=int,
        default=None,
        help="print the mean step time of steps >= this one (rank 0, one line: STEPTIME ...)",
    )
    return p.parse_args()


def make_model(width: int = 64, depth: int = 2) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(32, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def end_distributed(settle_s: float = 0.5) -> None:
    """Leave the process group so the process can exit, which a bare destroy does not ensure.

    The barrier: 3-rank gloo jobs on torch 2.13 abort at exit without it. The sleep: each gloo
    run-loop thread frees its last finished work after the work completes, and that takes the GIL
    (the work holds captured Python thread-local state). If the last reference to the process group
    goes first (DDP's reducer, freed with this frame), ~ProcessGroupGloo joins those threads while
    holding the GIL and the rank never exits (gdb stack in docs/testing.md). Sleeping frees the GIL.
    """
    dist.barrier()
    time.sleep(settle_s)
    dist.destroy_process_group()


def compile_module(module: nn.Module) -> nn.Module:
    """`torch.compile(module)`: an OptimizedModule, itself a Module (torch's hints say only a callable)."""
    return cast(nn.Module, torch.compile(module))


def first_grad(model: nn.Module) -> torch.Tensor:
    """The first parameter's gradient, which the backward just filled."""
    grad = next(model.parameters()).grad
    assert grad is not None
    return grad


def slow_backend(seconds: float) -> Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]:
    """A torch.compile backend that waits `seconds` before returning the graph as is: a slow compile on demand."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        time.sleep(seconds)
        return gm.forward

    return backend


def pick_backend(choice: str) -> str:
    if choice != "auto":
        return choice
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch_for(rank: int, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(rows, 32, generator=g), torch.randn(rows, 4, generator=g)


def asked_to_stop(path: str, rank: int, device: torch.device) -> bool:
    """Rank 0 looks for the file, every rank learns its answer: they leave the loop at the same step."""
    flag = torch.tensor([float(rank == 0 and os.path.exists(path))], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    backend = pick_backend(args.backend)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank = dist.get_rank()
    module = make_model(args.width, args.depth).to(device)
    model = DDP(torch.compile(module), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    t0 = None
    for step in range(args.steps):
        if step == args.time_from:
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
        rows = args.batch + (1 if (rank, step) == (args.shape_rank, args.shape_step) else 0)
        x, y = (t.to(device) for t in batch_for(rank, step, rows))
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if (rank, step) == (args.perturb_rank, args.perturb_step):
            with torch.no_grad():
                first_grad(model).view(-1)[0] += 1e-3
        opt.step()
        if args.sleep:
            time.sleep(args.sleep)
        if rank == 0 and os.environ.get("DEMO_VERBOSE"):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if args.stop_file and asked_to_stop(args.stop_file, rank, device):
            break
    _sync(device)
    if t0 is not None and rank == 0:
        n = args.steps - args.time_from
        print(
            f"STEPTIME backend={backend} steps={n} mean_ms={(time.perf_counter() - t0) / n * 1e3:.4f} "
            f"cpu_ms={(time.process_time() - c0) / n * 1e3:.4f} "
            f"agent={'off' if os.environ.get('LOCKSTEP_DISABLE') == '1' else 'on'}",
            flush=True,
        )
    end_distributed()


if __name__ == "__main__":
    main()
