"""Provoke the divergences Lockstep must catch, in one real DDP job (run it under torchrun).

Each flag adds one failure on top of demo/ddp_job.py's training loop:
  --branch-rank R        rank R takes another Python branch in a compiled helper (graph_divergence)
  --nan-rank R --nan-step S   rank R's gradient turns NaN at step S (nonfinite_grad, grad_divergence)
  --storm                a helper recompiles on every step with dynamic=False (recompile_storm)
  --slow-rank R          rank R's backend takes --slow-seconds to compile a helper (compile_straggler)
  --freeze-rank R --freeze-step S  rank R stops dead (SIGSTOP) at step S, like a rank hung in the
                         driver: it goes silent (rank_silent) while the others wait in the next collective
  --compile-ddp          torch.compile(DDP(model)): only empty graphs compile (ineffective_compile)
  --fail-rank R          rank R's backend fails to compile a helper; Dynamo falls back to eager there
                         (compile_failure_divergence)
  --nudge-weight-rank R --nudge-weight-step S  rank R's weights are nudged before step S's update, as a
                         rank-local weight update would (param_divergence at the next weight fingerprint)
  --kill-rank R --kill-step S  rank R is SIGKILLed at step S, as by the OOM killer: torchrun stops the other
                         ranks, which end, while rank R never says goodbye (rank_silent)
  --collective-rank R    rank R folds a second all_reduce into a compiled helper that the other ranks
                         issue eagerly: the same traffic at run time, but another collective schedule
                         in that graph (collective_schedule_divergence), one reordering away from a hang
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_job import batch_for, end_distributed, make_model  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--branch-rank", type=int)
    p.add_argument("--nan-rank", type=int)
    p.add_argument("--nan-step", type=int)
    p.add_argument("--storm", action="store_true")
    p.add_argument("--slow-rank", type=int)
    p.add_argument("--slow-seconds", type=float, default=4.0)
    p.add_argument("--freeze-rank", type=int)
    p.add_argument("--freeze-step", type=int)
    p.add_argument("--compile-ddp", action="store_true")
    p.add_argument("--collective-rank", type=int)
    p.add_argument("--fail-rank", type=int)
    p.add_argument("--nudge-weight-rank", type=int)
    p.add_argument("--nudge-weight-step", type=int)
    p.add_argument("--kill-rank", type=int)
    p.add_argument("--kill-step", type=int)
    return p.parse_args()


def branchy(x: torch.Tensor, odd: bool) -> torch.Tensor:
    """A data/rank-dependent Python branch: Dynamo traces a different graph on the odd rank."""
    if odd:
        return torch.tanh(x) * 2
    return torch.relu(x) + 1


def stormy(x: torch.Tensor) -> torch.Tensor:
    return (x * 3).sum(dim=0)


def ramp(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) - 0.5


def fragile(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x) * 0.5


def failing_backend(fail: bool):
    def backend(gm: torch.fx.GraphModule, example_inputs):
        if fail:
            raise RuntimeError("this rank's compiler toolchain is broken")
        return gm.forward

    return backend


def pulse(x: torch.Tensor, fold: bool) -> torch.Tensor:
    """A compiled helper with collectives inside: Inductor logs its collective schedule."""
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    if fold:
        y = funcol.all_reduce(y + 1, "sum", dist.group.WORLD)
    return y


def slow_backend(seconds: float):
    def backend(gm: torch.fx.GraphModule, example_inputs):
        time.sleep(seconds)
        return gm.forward

    return backend


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.compile(DDP(make_model())) if args.compile_ddp else DDP(torch.compile(make_model()))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    branch = torch.compile(branchy, backend="aot_eager")
    storm = torch.compile(stormy, backend="aot_eager", dynamic=False)
    slow = torch.compile(ramp, backend=slow_backend(args.slow_seconds if rank == args.slow_rank else 0.0))
    collective = torch.compile(pulse)
    if args.fail_rank is not None:
        torch._dynamo.config.suppress_errors = True  # a failed compile runs the frame eagerly
    breakable = torch.compile(fragile, backend=failing_backend(rank == args.fail_rank))
    for step in range(args.steps):
        if (rank, step) == (args.freeze_rank, args.freeze_step):
            os.kill(os.getpid(), signal.SIGSTOP)
        if (rank, step) == (args.kill_rank, args.kill_step):
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch_for(rank, step, args.batch)
        if args.branch_rank is not None:
            x = branch(x, rank == args.branch_rank)
        if args.storm:
            storm(torch.ones(step + 2, 3))
        if args.slow_rank is not None:
            x = x + slow(x)
        if args.fail_rank is not None:
            x = x + breakable(x)
        if args.collective_rank is not None:
            folded = rank == args.collective_rank
            y_pulse = collective(torch.ones(4), folded)
            if not folded:
                dist.all_reduce(y_pulse + 1)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        if (rank, step) == (args.nan_rank, args.nan_step):
            with torch.no_grad():
                next(model.parameters()).grad.view(-1)[0] = float("nan")
        if (rank, step) == (args.nudge_weight_rank, args.nudge_weight_step):
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3
        opt.step()
        if args.sleep:
            time.sleep(args.sleep)
    end_distributed()


if __name__ == "__main__":
    main()
