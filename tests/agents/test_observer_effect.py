"""The agent changes nothing it measures: every compiled region traces to the same graphs, graph
breaks and recompiles with the agent attached as without it (real torch.compile, this process).

Each pattern runs twice from a reset Dynamo, once bare and once with a real agent (offline, its
spool in a temporary folder); a backend that records every graph Dynamo hands it tells the graphs
apart by their code. Step time is measured by `python -m bench observer_effect`, not here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.utils.checkpoint
from torch._dynamo.utils import counters

from agents import Agent, protocol
from agents.config import resolve
from tests.agents.conftest import events_of, read_spool

STEPS = 4


@dataclass
class Traced:
    graphs: list[str]  # each graph's code, in the order Dynamo compiled them (a recompile is one more)
    breaks: Counter[str]  # graph break reasons
    frames: list[tuple[str, int | None]]  # every frame Dynamo compiled and its op count (None: no graph)


class Blocks(torch.nn.Module):
    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(3))
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.checkpointed:
                x = torch.utils.checkpoint.checkpoint(lambda t, f=layer: f(t).relu(), x, use_reentrant=False)
            else:
                x = layer(x).relu()
        return x


def compiled_model(backend: Callable, checkpointed: bool = False) -> Callable[[torch.Tensor], None]:
    model = Blocks(checkpointed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    forward = torch.compile(model, backend=backend)

    def step(x: torch.Tensor) -> None:
        forward(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return step


def compiled_optimizer_step(backend: Callable) -> Callable[[torch.Tensor], None]:
    """As PyTorch's tutorial compiles it: `@torch.compile def step(): opt.step()`."""
    model = Blocks()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    @torch.compile(backend=backend)
    def opt_step() -> None:
        opt.step()

    def step(x: torch.Tensor) -> None:
        model(x).sum().backward()
        opt_step()
        opt.zero_grad()

    return step


def compiled_train_step(backend: Callable) -> Callable[[torch.Tensor], None]:
    """Forward, backward and the optimizer step under one torch.compile."""
    model = Blocks()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    @torch.compile(backend=backend)
    def step(x: torch.Tensor) -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return step


PATTERNS = {
    "compiled model": (compiled_model, "grad"),
    "compiled autograd": (compiled_train_step, "notice"),
    "compiled optimizer step": (compiled_optimizer_step, "notice"),
    "compiled train step": (compiled_train_step, "notice"),
    "activation checkpointing": (lambda backend: compiled_model(backend, checkpointed=True), "grad"),
}


def trace(make: Callable[[Callable], Callable[[torch.Tensor], None]], config: dict[str, bool]) -> Traced:
    graphs: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
        graphs.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    torch._dynamo.utils.clear_compilation_metrics()
    counters.clear()
    torch.manual_seed(0)
    with torch._dynamo.config.patch(**config):
        step = make(record)
        for i in range(STEPS):
            step(torch.randn(8 if i < 2 else 12, 32))  # a new batch size at step 2: a recompile to match
    frames = [(m.co_name or "", m.graph_op_count) for m in torch._dynamo.utils.get_compilation_metrics()]
    return Traced(graphs, Counter(counters["graph_break"]), frames)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_same_graphs_breaks_and_recompiles_with_the_agent_attached(pattern, tmp_path):
    make, seen_as = PATTERNS[pattern]
    config = {"compiled_autograd": True} if pattern == "compiled autograd" else {}
    bare = trace(make, config)
    agent = Agent(resolve(offline=True, spool_dir=str(tmp_path), run="observer", rank=0, world_size=1))
    try:
        watched = trace(make, config)
    finally:
        agent.close(timeout=5)
    assert bare.graphs, "the pattern compiled nothing: it proves nothing"
    if config:  # compiled autograd traced the backward: a frame of its own (its graph is named forward)
        assert "forward" in [name for name, _ in bare.frames], bare.frames
    assert watched.graphs == bare.graphs
    assert watched.breaks == bare.breaks
    assert watched.frames == bare.frames  # not even a frame without a graph becomes a 0-op one
    events = [e for batches in read_spool(str(tmp_path)).values() for e in events_of(batches)]
    kinds = {type(e).__struct_config__.tag for e in events}
    if seen_as == "grad":  # the step ran eagerly: fingerprinted at every step
        assert {"grad", "grads"} & kinds
    else:  # the step ran compiled: said once, never silently
        notices = [e for e in events if isinstance(e, protocol.Notice)]
        assert [n.code for n in notices] == ["compiled_optimizer_step"]
