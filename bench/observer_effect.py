"""The agent changes nothing it measures: per training pattern, graphs, graph breaks and compiled
frames, and the step time, with and without the agent (Inductor, real compiles). "same" means
every process of both sides compiled the same frames with the same op counts, graphs and breaks.

    python -m bench observer_effect                        # every pattern, 3 rounds each way
    python -m bench observer_effect --rounds 5 --steps 40 --pattern "compiled optimizer step"

Each (pattern, with/without) runs in a fresh process (`--child`), so no compile cache of one side
serves the other; the rounds alternate the two sides. The step time is the median of the steps
after `--warmup`; the table gives the median of the rounds' medians and their spread (min-max).
On a CUDA machine the model runs on `cuda:0` and CUDA graphs (`mode="reduce-overhead"`) join
the patterns. The table goes to bench/RESULTS.md, section `observer_effect (<device>)`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.results import markdown, record, rerun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH, DEPTH = 512, 8  # 8 Linear 512x512 with Adam: the compiled optimizer step that broke into 12 graphs


def _model(torch: Any, device: str, checkpointed: bool = False) -> Any:
    class Blocks(torch.nn.Module):  # type: ignore[misc]  # torch is imported in the child only
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))

        def forward(self, x: Any) -> Any:
            for layer in self.layers:
                if checkpointed:
                    x = torch.utils.checkpoint.checkpoint(lambda t, f=layer: f(t).relu(), x, use_reentrant=False)
                else:
                    x = layer(x).relu()
            return x

    return Blocks().to(device)


def _pattern(name: str, torch: Any, device: str) -> Callable[[Any], None]:
    """One training step of the pattern, built fresh."""
    model = _model(torch, device, checkpointed=name == "activation checkpointing")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if name == "compiled optimizer step":
        opt_step = torch.compile(opt.step)

        def step(x: Any) -> None:
            model(x).sum().backward()
            opt_step()
            opt.zero_grad()

        return step
    if name in ("compiled train step", "compiled autograd"):
        torch._dynamo.config.compiled_autograd = name == "compiled autograd"  # the backward as a graph of its own

        @torch.compile  # type: ignore[untyped-decorator]
        def train(x: Any) -> None:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()

        return train
    forward = torch.compile(model, mode="reduce-overhead" if name == "CUDA graphs" else None)

    def eager_step(x: Any) -> None:
        forward(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return eager_step


PATTERNS = (
    "compiled model",
    "compiled optimizer step",
    "compiled train step",
    "compiled autograd",
    "activation checkpointing",
)


def child(name: str, watched: bool, steps: int, warmup: int) -> dict[str, Any]:
    """One side of one pattern in this process: what Dynamo compiled and the step times."""
    import torch
    from torch._dynamo.utils import counters

    agent = None
    if watched:
        import agents

        agent = agents.attach(offline=True, spool_dir=tempfile.mkdtemp(prefix="lockstep-observer-"), run="observer")
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    step = _pattern(name, torch, device)
    x = torch.randn(64, WIDTH, device=device)
    times = []
    for _ in range(steps):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(x)
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if agent is not None:
        agent.close(timeout=5)
    metrics = torch._dynamo.utils.get_compilation_metrics()
    # a record without a frame is a backward graph compiled at its first use, or not, by the cache's state
    frames = [(m.co_name, m.graph_op_count) for m in metrics if m.co_name and not _agents_own(m.co_filename)]
    return {
        "agent_compiles": sum(_agents_own(m.co_filename) for m in metrics),
        "graphs": sum(1 for _, ops in frames if ops),  # torch's own count holds the agent's kernel too
        "breaks": sum(counters["graph_break"].values()),
        "frames": len(frames),
        "frame_ops": frames,
        "step_ms": statistics.median(times[warmup:]) * 1000,
        "device": torch.cuda.get_device_name(0) if device != "cpu" else "CPU",
        "torch": torch.__version__,
    }


def _agents_own(filename: str | None) -> bool:
    """A frame of the agent's own code (its compiled fingerprint kernel), never the user's: the capture
    leaves it out of the run's compile events, and so does this comparison (counted on its own)."""
    return bool(filename) and os.path.join(ROOT, "agents", "") in os.path.abspath(filename or "")


def _side(name: str, watched: bool, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    env.update(dict(item.split("=", 1) for item in args.agent_env))
    cmd = [sys.executable, "-m", "bench", "observer_effect", "--child", name, "--steps", str(args.steps)]
    cmd += ["--warmup", str(args.warmup)] + (["--watched"] if watched else [])
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{name} ({'with' if watched else 'without'} the agent) failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the step time (compiles)")
    parser.add_argument("--pattern", action="append", help="only these patterns (repeatable)")
    parser.add_argument(
        "--agent-env", action="append", default=[], metavar="NAME=VALUE", help="an agent setting for both sides"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--watched", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.watched, args.steps, args.warmup)))
        return 0
    import torch

    patterns = args.pattern or [*PATTERNS, *(["CUDA graphs"] if torch.cuda.is_available() else [])]
    rows = []
    device = ""
    for name in patterns:
        sides: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for watched in (False, True):
                sides[watched].append(_side(name, watched, args))
        bare, watched_runs = sides[False], sides[True]
        device = f"{bare[0]['device']}, torch {bare[0]['torch']}"
        facts = [(r["graphs"], r["breaks"], json.dumps(r["frame_ops"])) for r in bare + watched_runs]
        same = "yes" if len(set(facts)) == 1 else "NO"
        if same == "NO":  # which process compiled what, to tell the agent from the machine
            for r in bare + watched_runs:
                print(f"  {name}: graphs {r['graphs']}, breaks {r['breaks']}, frames {r['frame_ops']}", flush=True)
        ratio = statistics.median(r["step_ms"] for r in watched_runs) / statistics.median(r["step_ms"] for r in bare)
        own = max(r["agent_compiles"] for r in watched_runs)
        rows.append(
            [
                name + (f" ({own} compiles of the agent's own kernel besides)" if own else ""),
                f"{bare[0]['graphs']} / {bare[0]['breaks']} / {bare[0]['frames']}",
                f"{watched_runs[0]['graphs']} / {watched_runs[0]['breaks']} / {watched_runs[0]['frames']}",
                same,
                _spread([r["step_ms"] for r in bare]),
                _spread([r["step_ms"] for r in watched_runs]),
                f"{ratio:.2f}x",
            ]
        )
        print(f"{name}: {rows[-1][1:]}", flush=True)
    header = [
        "pattern",
        "graphs / breaks / frames, bare",
        "with the agent",
        "same",
        "step ms bare (spread)",
        "step ms with agent",
        "ratio",
    ]
    table = markdown(header, rows)
    print(table)
    note = (
        f"{device}; {args.rounds} rounds each way, a fresh process each, median step time after "
        f"{args.warmup} warm-up steps of {args.steps}; model: {DEPTH} Linear {WIDTH}x{WIDTH}, Adam, batch 64."
    )
    record(f"observer_effect ({device.split(',')[0]})", table, rerun("observer_effect", argv), note)
    return 0
