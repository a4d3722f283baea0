"""Synthetic but protocol-true runs for the page tests, screenshots and the P6 benchmark.

`job_batches` builds what the agents of one small training job send (wire protocol v1):
rank_start with versions, compiles with cache outcomes, a recompile and a graph break, grad
fingerprints and step times. Knobs provoke the divergences the pages must show.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

TORCH_213 = {"python": "3.11.2", "torch": "2.13.0+cpu", "triton": "", "cuda": "", "gpu": ""}
TORCH_211 = {"python": "3.11.9", "torch": "2.11.0+cu128", "triton": "3.5.0", "cuda": "12.8", "gpu": "NVIDIA H200"}

GRAPH_MAJORITY = """def forward(self, L_x_: "f32[16, 64][64, 1]cpu"):
    l_x_ = L_x_
    linear = torch._C._nn.linear(l_x_, self.L__self___fc1_weight, self.L__self___fc1_bias)
    relu = torch.relu(linear)
    linear_1 = torch._C._nn.linear(relu, self.L__self___fc2_weight, self.L__self___fc2_bias)
    return (linear_1,)"""
GRAPH_MINORITY = """def forward(self, L_x_: "f32[17, 64][64, 1]cpu"):
    l_x_ = L_x_
    linear = torch._C._nn.linear(l_x_, self.L__self___fc1_weight, self.L__self___fc1_bias)
    relu = torch.relu(linear)
    dropout = torch.nn.functional.dropout(relu, 0.1, True)
    linear_1 = torch._C._nn.linear(dropout, self.L__self___fc2_weight, self.L__self___fc2_bias)
    return (linear_1,)"""


def blob_hash(text: str) -> str:
    from agents.protocol import blob_hash as content_address

    return content_address(text)


def graph_blobs() -> dict:
    """The body of POST /api/v1/blobs carrying both graph texts of `Job.graph_frame`."""
    return {"v": 1, "blobs": [{"hash": blob_hash(t), "text": t} for t in (GRAPH_MAJORITY, GRAPH_MINORITY)]}


FRAMES = ("demo/ddp_job.py:41:forward", "torch/nn/modules/linear.py:124:forward", "demo/ddp_job.py:58:loss_fn")


@dataclass
class Job:
    key: str
    world: int = 4
    steps: int = 40
    name: str = ""
    versions: dict = field(default_factory=lambda: dict(TORCH_213))
    config_hash: str = "cfg-7f3a"
    grad_diverge: tuple[int, int] | None = None  # (rank, first step)
    recompile: tuple[int, int] | None = None  # (rank, step): that rank alone recompiles frame 0
    recompile_reason: str = "tensor 'x' size mismatch at index 0. expected 16, actual 17"
    graph_frame: str | None = None  # extra frame whose graph differs on rank 1
    step_time: float = 0.05
    cache_miss_rank: int | None = None  # this rank misses the cache the others hit
    fp_seed: int = 1000
    fp_change_step: int | None = None  # every rank's fingerprints change from here (another kernel)
    t0: float = field(default_factory=lambda: time.time() - 120)


def _compile(job: Job, rank: int, frame: str, index: int, step: int, ts: float, *, cache: str, reason: str | None = None,
             graph: str = "a" * 32, ops: int = 12) -> dict:
    return {"t": "compile", "ts": ts, "frame": frame, "index": index, "compile_id": f"{index}/0", "step": step,
            "status": "ok", "recompile_reason": reason,
            "times": {"entire_frame_compile_time_s": 1.5 + 0.1 * rank + index},
            "counts": {"graph_op_count": ops, "graph_node_count": ops + 4, "guard_count": 9},
            "hashes": {"dynamo": {"raw": graph, "norm": graph}, "inductor": {"raw": "c" * 32, "norm": "c" * 32}},
            "cache": {"inductor": cache, "aotautograd": cache}, "cache_keys": {"inductor": f"fx{index}{cache}"}}


def rank_events(job: Job, rank: int) -> list[dict]:
    t = job.t0 + rank * 0.05
    events: list[dict] = [{
        "t": "rank_start", "ts": t, "host": f"node{rank // 8}", "pid": 4000 + rank, "local_rank": rank % 8,
        "device": "cpu" if not job.versions.get("cuda") else f"cuda:{rank % 8}", "versions": job.versions,
        "config_hash": job.config_hash, "env": {"OMP_NUM_THREADS": "1", "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"},
        "cache_dirs": {"inductor": "/tmp/torchinductor_root"}, "collective_timeout_s": 600.0,
    }]
    clock = t + 2
    for i, frame in enumerate(FRAMES):
        clock += 2.0
        cache = "miss" if i == 0 or rank == job.cache_miss_rank else "hit"
        events.append(_compile(job, rank, frame, 0, 0, clock, cache=cache))
    if job.graph_frame:
        clock += 1.0
        graph = blob_hash(GRAPH_MINORITY if rank == 1 else GRAPH_MAJORITY)
        events.append(_compile(job, rank, job.graph_frame, 0, 0, clock, cache="miss", graph=graph, ops=7 if rank == 1 else 6))
    events.append({"t": "graph_break", "ts": clock + 0.5, "frame": FRAMES[0], "step": 0,
                   "reason": "call_function BuiltinVariable(print) [ConstantVariable(str)] {}"})
    for step in range(job.steps):
        clock += job.step_time
        if job.recompile and job.recompile == (rank, step):
            events.append(_compile(job, rank, FRAMES[0], 1, step, clock + 1.0, cache="miss", reason=job.recompile_reason))
            clock += 2.5
        diverged = job.grad_diverge is not None and rank == job.grad_diverge[0] and step >= job.grad_diverge[1]
        fps = [job.fp_seed + step * 16 + b for b in range(4)]
        if job.fp_change_step is not None and step >= job.fp_change_step:
            fps[0] += 7
        if diverged:
            fps[2] += 1
        events.append({"t": "grad", "ts": clock, "step": step, "fps": fps, "norm": 1.0})
        events.append({"t": "step", "ts": clock, "step": step, "loss": 2.0 / (step + 1),
                       "step_time": job.step_time * (1.3 if rank == 0 else 1.0)})
    events.append({"t": "rank_end", "ts": clock + 0.1, "status": "ok", "exit_code": 0})
    return events


def job_batches(job: Job, per_batch: int = 500) -> list[dict]:
    """Every rank's events as protocol batches (one session per rank, seq from 0)."""
    out = []
    for rank in range(job.world):
        events = rank_events(job, rank)
        for seq, start in enumerate(range(0, len(events), per_batch)):
            out.append({"v": 1, "run": {"key": job.key, "world_size": job.world, "name": job.name or job.key},
                        "rank": rank, "session": f"s-{job.key}-{rank}"[:64].replace(".", "-").replace("_", "-").replace(":", "-"),
                        "seq": seq, "events": events[start:start + per_batch]})
    return out


def settle_all(run) -> None:
    """Settle every slot in-process (what the Celery worker does), for tests without a worker."""
    from dashboard.detection.settle import settle_compile, settle_grad
    from dashboard.ledger.models import CompileSlot, GradSlot

    for slot_id in CompileSlot.objects.filter(run=run).values_list("id", flat=True):
        settle_compile(slot_id)
    for slot_id in GradSlot.objects.filter(run=run).values_list("id", flat=True):
        settle_grad(slot_id)
