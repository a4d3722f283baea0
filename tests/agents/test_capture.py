"""Real torch.compile in this process: Compile and GraphBreak events from the trace log."""

import json
import subprocess
import sys

import torch

from agents import protocol
from agents.capture import CompileCapture, frame_key, install, uninstall

from .conftest import REPO


def _capture(fn):
    events: list = []
    step = {"n": 7}
    handler = CompileCapture(events.append, lambda: step["n"])
    torch._dynamo.reset()
    install(handler)
    try:
        fn(step)
    finally:
        uninstall(handler)
    return events


def scale(x):
    return (x * 2).relu() + 1


def broken(x):
    y = x * 2
    torch._dynamo.graph_break()
    return y.relu()


def test_recompile_gets_index_1_and_reason():
    compiled = torch.compile(scale)

    def run(step):
        compiled(torch.randn(4, 3))
        step["n"] = 9
        compiled(torch.randn(5, 3))

    events = _capture(run)
    compiles = [e for e in events if isinstance(e, protocol.Compile) and e.frame.endswith(":scale")]
    assert [c.index for c in compiles] == [0, 1]
    first, second = compiles
    assert first.frame == second.frame == frame_key(scale.__code__.co_filename, scale.__code__.co_firstlineno, "scale")
    assert first.frame.startswith("tests/agents/test_capture.py:") or "test_capture.py" in first.frame
    assert first.recompile_reason is None
    assert "size mismatch" in second.recompile_reason
    assert (first.step, second.step) == (7, 9)
    assert first.status == "ok" and first.counts["graph_op_count"] >= 1
    assert set(first.hashes) >= {"dynamo", "inductor"}
    assert first.hashes["dynamo"].norm != second.hashes["dynamo"].norm  # static vs dynamic shape graph
    assert first.cache.get("inductor") in ("hit", "miss", "bypass")
    assert first.times["entire_frame_compile_time_s"] > 0
    protocol.decode_batch(
        protocol.encode(
            protocol.Batch(  # the events are valid on the wire
                v=1, run=protocol.RunInfo(key="k", world_size=1), rank=0, session="abcdefgh", seq=0, events=events
            )
        )
    )


def test_graph_break_event():
    compiled = torch.compile(broken)
    events = _capture(lambda step: compiled(torch.randn(3)))
    breaks = [e for e in events if isinstance(e, protocol.GraphBreak)]
    assert len(breaks) == 1
    assert breaks[0].frame.endswith(":broken") and "graph_break" in breaks[0].reason.lower()
    compile_ = next(e for e in events if isinstance(e, protocol.Compile) and e.frame.endswith(":broken"))
    assert compile_.graph_breaks == 1


def test_frame_key_is_rank_independent(tmp_path, monkeypatch):
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    assert frame_key(site + "/torch/nn/x.py", 3, "f") == "torch/nn/x.py:3:f"
    monkeypatch.chdir(tmp_path)
    assert frame_key(str(tmp_path / "train.py"), 10, "step") == "train.py:10:step"


def test_failed_and_eager_fallback_status_and_missing_fields():
    """Fields absent on other torch versions degrade to defaults; fail_type maps to a status."""
    events: list = []
    handler = CompileCapture(events.append, lambda: None)
    base = {"co_name": "f", "co_filename": "/x/train.py", "co_firstlineno": 3}
    handler.feed({"compilation_metrics": dict(base, compile_id="0/0")}, None)
    handler.feed({"compilation_metrics": dict(base, fail_type="RecompileLimitExceeded", fail_reason="limit hit")}, None)
    handler.feed({"compilation_metrics": dict(base, fail_type="Unsupported", config_suppress_errors=True)}, None)
    handler.feed({"compilation_metrics": dict(base, fail_type="BackendCompilerFailed", fail_reason="boom")}, None)
    handler.feed({"compilation_metrics": None}, None)  # malformed: ignored or defaulted, never raises
    compiles = [e for e in events if isinstance(e, protocol.Compile) and e.frame.endswith(":f")]
    assert [c.status for c in compiles] == ["ok", "eager", "eager", "failed"]
    assert compiles[0].times == {} and compiles[0].counts == {} and compiles[0].hashes == {}
    assert [c.index for c in compiles] == [0, 1, 2, 3]


def test_autotune_and_triton_times_where_torch_reports_them():
    """CUDA builds report autotuning and Triton build times in microseconds; older or CPU builds
    leave them out (or None), and then nothing is sent."""
    events: list = []
    handler = CompileCapture(events.append, lambda: None)
    base = {"co_name": "g", "co_filename": "/x/train.py", "co_firstlineno": 9, "entire_frame_compile_time_s": 2.5}
    handler.feed(
        {
            "compilation_metrics": dict(
                base,
                compile_time_autotune_time_us=1_250_000,
                triton_compile_time_us=400_000,
                runtime_triton_autotune_time_us=None,
                num_triton_bundles=3,
            )
        },
        None,
    )
    handler.feed({"compilation_metrics": base}, None)
    tuned, plain = [e for e in events if isinstance(e, protocol.Compile)]
    assert tuned.times == {"entire_frame_compile_time_s": 2.5, "autotune_time_s": 1.25, "triton_compile_time_s": 0.4}
    assert tuned.counts == {"num_triton_bundles": 3}
    assert plain.times == {"entire_frame_compile_time_s": 2.5} and plain.counts == {}


def test_h200_trace_carries_triton_build_and_runtime_autotune_times():
    """On the recorded 2 x H200 trace (torch 2.11) the compiles that built Triton kernels report it,
    and runtime autotuning arrives later (`compilation_metrics_runtime`) as `compile_runtime` events
    naming the compile they belong to."""
    import tarfile

    from .test_normalize import FIXTURE, _parse

    with tarfile.open(FIXTURE) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith(".log")), key=lambda m: m.name)
        records = _parse(tar.extractfile(members[0]))
    events: list = []
    handler = CompileCapture(events.append, lambda: None)
    for metadata, payload in records:
        handler.feed(metadata, payload or None)
    compiles = [e for e in events if isinstance(e, protocol.Compile)]
    built = [c for c in compiles if "triton_compile_time_s" in c.times]
    assert built and all(0 < c.times["triton_compile_time_s"] < 60 for c in built)
    [tuned] = [e for e in events if isinstance(e, protocol.CompileRuntime)]
    assert 0 < tuned.times["runtime_autotune_time_s"] < 60
    assert any((c.compile_id, c.frame) == (tuned.compile_id, tuned.frame) for c in compiles)


def stormy(x):
    return (x * 3).sum(dim=0)


def test_recompile_limit_hit_keeps_its_frame():
    """torch reports the compile that hits the recompile limit without a code object; it keeps
    the frame of its Dynamo frame id's earlier compiles (not '?:0:?'), as the 9th of that frame."""

    def run(step):
        f = torch.compile(stormy, backend="eager", dynamic=False)
        for n in range(2, 12):
            f(torch.ones(n, 3))

    compiles = [e for e in _capture(run) if isinstance(e, protocol.Compile)]
    assert len({e.frame for e in compiles}) == 1 and compiles[0].frame.endswith(":stormy")
    limit = compiles[-1]
    assert (limit.index, limit.status) == (torch._dynamo.config.recompile_limit, "eager")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_a_compiled_module_is_named_by_its_class_and_a_torch_module_by_the_users_call_site():
    block, seq = torch.compile(Block()), torch.compile(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()))

    def run(step):
        block(torch.randn(2, 3))
        seq(torch.randn(2, 3))  # Dynamo compiles its own wrapper around torch's Sequential

    frames = {e.frame for e in _capture(run) if isinstance(e, protocol.Compile)}
    line = Block.forward.__code__.co_firstlineno
    call = run.__code__.co_firstlineno + 2
    assert frames == {f"test_capture.py:{line}:Block.forward", f"test_capture.py:{call}:run"}


def ddp_frames(store: str) -> tuple[list[str], str]:
    """torch.compile(DDP(Block())) under the capture: the frames it names, and the prefix of the
    calling line's key. Run in a process of its own (`test_ddp_wrapper_frames...`)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    model = torch.compile(DDP(Block()), backend="eager")

    def run(step):
        model(torch.randn(2, 3)).sum().backward()

    frames = [e.frame for e in _capture(run) if isinstance(e, protocol.Compile)]
    return frames, f"test_capture.py:{run.__code__.co_firstlineno + 1}:run"


_DDP_FRAMES = r"""
import json, os, sys
from tests.agents.test_capture import ddp_frames
print(json.dumps(ddp_frames(sys.argv[1])), flush=True)
os._exit(0)  # no teardown: gloo's process group can hang joining its threads when DDP's reducer goes
"""


def test_ddp_wrapper_frames_inside_torch_and_contextlib_are_named_by_the_users_line(tmp_path):
    """torch.compile(DDP(model)): Dynamo compiles DDP's context managers (contextlib.py) on the way to
    the model; each such frame is keyed by the user's line that entered it, plus the code it compiled
    (distinct frames keep distinct keys), while the model's own block keeps its own name. In a process
    of its own: a process group torn down inside the test process once hung the suite in gloo's
    destructor (torch 2.13)."""
    out = subprocess.run(
        [sys.executable, "-c", _DDP_FRAMES, str(tmp_path / "store")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    frames, call = json.loads(out.stdout.splitlines()[-1])
    assert f"test_capture.py:{Block.forward.__code__.co_firstlineno}:Block.forward" in frames
    wrappers = [f for f in frames if "Block.forward" not in f]
    assert wrappers and all(f.startswith(call) for f in wrappers), frames
    assert f"{call} via contextlib.__init__" in wrappers and len(set(wrappers)) == len(wrappers)
    assert not [f for f in frames if f.startswith(("contextlib.py", "torch/"))]
