"""Provoke the divergences Lockstep must catch, in one real DDP job (run it under torchrun).

Each flag adds one failure on top of demo/ddp_job.py's training loop:
  --branch-rank R        rank R takes another Python branch in a compiled helper (graph_divergence)
  --nan-rank R --nan-step S   rank R's gradient turns NaN at step S (nonfinite_grad, grad_divergence)
  --storm                a helper recompiles on every step with dynamic=False (recompile_storm)
  --slow-rank R          rank R's backend takes --slow-seconds to compile a helper (compile_straggler)
  --freeze-rank R --freeze-step S  rank R stops dead (SIGSTOP) at step S, like a rank hung in the
                         driver: it goes silent (rank_silent) while the others wait in the next collective
  --compile-ddp          torch.compile(DDP(model)): only empty graphs compile (ineffective_compile)
  --eager-model          the model runs eagerly under DDP: the job compiles only the helpers the other
                         flags add (a cold cache then costs one small kernel, not the model's)
  --fail-rank R          rank R's backend fails to compile a helper; Dynamo falls back to eager there
                         (compile_failure_divergence)
  --nudge-weight-rank R --nudge-weight-step S  rank R's weights are nudged before step S's update, as a
                         rank-local weight update would (param_divergence at the next weight fingerprint)
  --kill-rank R --kill-step S  rank R is SIGKILLed at step S, as by the OOM killer (printing `FAULT_AT
                         <epoch seconds>` first): it never says goodbye, the ranks of its node see it go
                         (rank_crashed), torchrun stops them
  --collective-rank R    rank R folds a second all_reduce into a compiled helper that the other ranks
                         issue eagerly: the same traffic at run time, but another collective schedule
                         in that graph (collective_schedule_divergence), one reordering away from a hang
  --elementwise-check    every step, a compiled elementwise helper (sin(x) * y + 1 on 1000 floats, the same
                         input on every rank) is checked against eager and its result feeds the batch. Run
                         with ranks that share one Inductor cache dir while one has another CPU ISA
                         (ATEN_CPU_CAPABILITY=avx2): the FX-graph cache keys are the same, the C++ code is
                         not, and a rank that loads the other ISA's entry computes garbage
                         (rank_specific_artifact); each rank prints "rank R: compiled != eager in N of 1000
                         elements" when it does, and a summary line at the end
  --raise-rank R --raise-step S  rank R raises a RuntimeError in the training step at step S (rank_crashed);
                         torchrun then stops the other ranks
  --recompile-rank R     rank R feeds a helper compiled with dynamic=False one more row every
                         --recompile-every steps, and its backend takes --recompile-seconds per compile: it
                         recompiles alone ("dimension 0 of x changes") while the others wait (compile_cost)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# the repository root: demo.* and agents import however this starts (python demo/x.py, torchrun, -m agents run)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from demo.ddp_job import batch_for, compile_module, end_distributed, first_grad, make_model, slow_backend  # noqa: E402


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
    p.add_argument("--eager-model", action="store_true")
    p.add_argument("--collective-rank", type=int)
    p.add_argument("--fail-rank", type=int)
    p.add_argument("--nudge-weight-rank", type=int)
    p.add_argument("--nudge-weight-step", type=int)
    p.add_argument("--kill-rank", type=int)
    p.add_argument("--kill-step", type=int)
    p.add_argument("--elementwise-check", action="store_true")
    p.add_argument("--raise-rank", type=int)
    p.add_argument("--raise-step", type=int)
    p.add_argument("--recompile-rank", type=int)
    p.add_argument("--recompile-every", type=int, default=2)
    p.add_argument("--recompile-seconds", type=float, default=1.0)
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


def widen(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x).mean(dim=0)


def fragile(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x) * 0.5


def failing_backend(fail: bool) -> Callable[[torch.fx.GraphModule, list[torch.Tensor]], Callable[..., Any]]:
    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        if fail:
            raise RuntimeError("this rank's compiler toolchain is broken")
        return gm.forward

    return backend


def pulse(x: torch.Tensor, fold: bool) -> torch.Tensor:
    """A compiled helper with collectives inside: Inductor logs its collective schedule."""
    # the ignores: WORLD is typed optional, None only before init_process_group (narrowing it here would be traced)
    y: torch.Tensor = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)  # type: ignore[arg-type]
    if fold:
        y = funcol.all_reduce(y + 1, "sum", dist.group.WORLD)  # type: ignore[arg-type]
    return y


def elementwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A vectorized C++ kernel under Inductor: its vector width follows the rank's CPU ISA."""
    return torch.sin(x) * y + 1.0


ELEMENTS = 1000


def elementwise_inputs(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same input on every rank, so compiled and eager results can be compared across ranks too."""
    g = torch.Generator().manual_seed(7 + step)
    return torch.randn(ELEMENTS, generator=g), torch.randn(ELEMENTS, generator=g)


def checked_elementwise(
    compiled: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], rank: int, step: int, mismatches: list[int]
) -> torch.Tensor:
    """Run the compiled helper and the eager one on the same input; print where they differ."""
    a, b = elementwise_inputs(step)
    out = compiled(a, b)
    wrong = int(((out - elementwise(a, b)).abs() > 1e-4).sum())
    if wrong:
        mismatches.append(step)
        print(f"rank {rank}: compiled != eager in {wrong} of {ELEMENTS} elements (step {step})", flush=True)
    return out


def make_model_for(args: argparse.Namespace) -> nn.Module:
    if args.eager_model:
        return DDP(make_model())
    return compile_module(DDP(make_model())) if args.compile_ddp else DDP(torch.compile(make_model()))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = make_model_for(args)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    branch = torch.compile(branchy, backend="aot_eager")
    storm = torch.compile(stormy, backend="aot_eager", dynamic=False)
    slow = torch.compile(ramp, backend=slow_backend(args.slow_seconds if rank == args.slow_rank else 0.0))
    collective = torch.compile(pulse)
    if args.fail_rank is not None:
        torch._dynamo.config.suppress_errors = True  # a failed compile runs the frame eagerly
    breakable = torch.compile(fragile, backend=failing_backend(rank == args.fail_rank))
    checked = torch.compile(elementwise)
    alone = rank == args.recompile_rank
    widening = torch.compile(widen, backend=slow_backend(args.recompile_seconds if alone else 0.0), dynamic=False)
    mismatches: list[int] = []
    for step in range(args.steps):
        if (rank, step) == (args.freeze_rank, args.freeze_step):
            os.kill(os.getpid(), signal.SIGSTOP)
        if (rank, step) == (args.kill_rank, args.kill_step):
            print(f"FAULT_AT {time.time():.3f} rank {rank}", flush=True)
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
        if args.recompile_rank is not None:
            rows = 2 + (step // args.recompile_every if alone else 0)
            x = x + 0.01 * widening(torch.ones(rows, x.shape[1]))
        if args.elementwise_check:
            x = x + 0.01 * checked_elementwise(checked, rank, step, mismatches)[: x.shape[1]]
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        if (rank, step) == (args.raise_rank, args.raise_step):
            raise RuntimeError(f"rank {rank} hit a bad batch at step {step}")
        loss.backward()
        if (rank, step) == (args.nan_rank, args.nan_step):
            with torch.no_grad():
                first_grad(model).view(-1)[0] = float("nan")
        if (rank, step) == (args.nudge_weight_rank, args.nudge_weight_step):
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1e-3
        opt.step()
        if args.sleep:
            time.sleep(args.sleep)
    if args.elementwise_check:
        isa = torch.backends.cpu.get_cpu_capability()
        verdict = f"compiled != eager at steps {mismatches}" if mismatches else "compiled == eager at every step"
        print(f"rank {rank}: elementwise check ({isa}, {args.steps} steps): {verdict}", flush=True)
    end_distributed()


if __name__ == "__main__":
    main()
