"""The demo's torchrun jobs: what `manage.py up` launches to provoke every divergence the CPU can,
and what the tests that check those divergences run, so the two cannot drift apart."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from agents.launch import torchrun


@dataclass
class DemoJob:
    """One torchrun job of the demo; `baseline` names an earlier job this one is compared with."""

    name: str
    what: str
    script: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    max_seconds: float = 240
    baseline: str | None = None
    before: list[str] | None = None  # a command run first (e.g. warming a cache), without the agent
    before_env: dict[str, str] = field(default_factory=dict)
    via_agent_cli: bool = True  # False: the script attaches the agent itself


def demo_jobs(data: str) -> list[DemoJob]:
    """The demo's jobs in the order they run; `data` holds their Inductor cache folders."""
    warm, cold, shared = (f"{data}/demo-cache-{name}" for name in ("warm", "cold", "shared"))
    return [
        DemoJob(
            "reference",
            "a clean run of the job, kept as the baseline of the next one",
            "demo/ddp_job.py",
            ["--steps", "20", "--sleep", "0.1"],
        ),
        DemoJob(
            "divergence",
            "rank 1 recompiles alone (a 17-row batch at step 5), rank 2's gradient is nudged at step 12",
            "demo/ddp_job.py",
            [
                "--steps",
                "30",
                "--sleep",
                "0.3",
                "--shape-rank",
                "1",
                "--shape-step",
                "5",
                "--perturb-rank",
                "2",
                "--perturb-step",
                "12",
            ],
            baseline="reference",
        ),
        DemoJob(
            "compile-trouble",
            "rank 1 traces another graph, rank 2 gets NaN, a recompile storm, rank 0 compiles slowly",
            "demo/scenarios.py",
            [
                "--steps",
                "10",
                "--branch-rank",
                "1",
                "--nan-rank",
                "2",
                "--nan-step",
                "4",
                "--storm",
                "--slow-rank",
                "0",
                "--slow-seconds",
                "8",  # 3x the others' compile of `ramp` even when a loaded machine makes theirs take 2-3 s
            ],
        ),
        DemoJob(
            "cold-cache",
            "rank 1 starts with a cold Inductor cache, the others with a warm one",
            "demo/per_rank_env.py",
            ["demo/ddp_job.py", "--steps", "6"],
            env={
                "PER_RANK_ENV": json.dumps(
                    {
                        "0": {"TORCHINDUCTOR_CACHE_DIR": warm},
                        "1": {"TORCHINDUCTOR_CACHE_DIR": cold},
                        "2": {"TORCHINDUCTOR_CACHE_DIR": warm},
                    }
                )
            },
            before=torchrun(1, "demo/ddp_job.py", "--steps", "1", port=29400, agent=False),
            before_env={"TORCHINDUCTOR_CACHE_DIR": warm},
            via_agent_cli=False,
        ),
        DemoJob(
            "shared-cache",
            "ranks share one cache directory but rank 1 runs other Inductor settings (its misses go to the "
            "compile bill, never a page); rank 2 folds an extra all_reduce into a compiled graph",
            "demo/per_rank_env.py",
            ["demo/scenarios.py", "--steps", "6", "--collective-rank", "2"],
            env={
                "TORCHINDUCTOR_CACHE_DIR": shared,
                "PER_RANK_ENV": json.dumps({"1": {"TORCHINDUCTOR_SIZE_ASSERTS": "0"}}),
            },
            via_agent_cli=False,
        ),
        DemoJob(
            "killed-rank",
            "rank 1's compiler fails, rank 0's weights are nudged, rank 2 is SIGKILLed at step 8",
            "demo/scenarios.py",
            [
                "--steps",
                "30",
                "--sleep",
                "0.25",
                "--fail-rank",
                "1",
                "--nudge-weight-rank",
                "0",
                "--nudge-weight-step",
                "4",
                "--kill-rank",
                "2",
                "--kill-step",
                "8",
            ],
            env={"LOCKSTEP_PARAM_EVERY": "4"},
        ),
        DemoJob(
            "hung-rank",
            "torch.compile(DDP(model)) compiles empty graphs; rank 2 freezes at step 5",
            "demo/scenarios.py",
            ["--steps", "200", "--sleep", "0.2", "--compile-ddp", "--freeze-rank", "2", "--freeze-step", "5"],
            max_seconds=60,
        ),
    ]


def demo_job(name: str, data: str = "") -> DemoJob:
    """One of the demo's jobs by name: the tests run the very arguments the demo runs."""
    return next(job for job in demo_jobs(data) if job.name == name)
