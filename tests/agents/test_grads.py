"""GradTracker in-process: grad and param (weight) fingerprints, statistics, groups."""

import math

import msgspec
import torch
from torch import nn

from agents import protocol
from agents.fingerprinting import bucket_fingerprints
from agents.grads import GradTracker, _dtensor_group


def _train(tracker_kwargs, steps=5, poison_step=None):
    events: list = []
    tracker = GradTracker(events.append, **tracker_kwargs)
    tracker.install()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weights = {}
    try:
        for step in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            if step == poison_step:
                model[0].weight.grad[0, 0] = float("nan")
            opt.step()
            weights[step] = [p.detach().clone() for p in model.parameters()]
        tracker.final_weights()
        tracker.drain(block=True)
    finally:
        tracker.uninstall()
    return events, weights


def test_param_events_every_k_steps_before_the_next_update_and_after_the_last_step():
    events, weights = _train({"grad_every": 1, "param_every": 2}, steps=5)
    params = [e for e in events if isinstance(e, protocol.Param)]
    assert [p.step for p in params] == [0, 2, 4] and {p.group for p in params} == {"local"}
    for p in params:  # weights after the update of that step, same buckets as grads
        expected = bucket_fingerprints(weights[p.step], 16).result()[1]
        assert p.fps == expected
    grads = [e for e in events if isinstance(e, protocol.Grad)]
    assert [g.step for g in grads] == list(range(5)) and len(grads[0].fps) == len(params[0].fps) == 4


def test_weights_are_fingerprinted_after_the_steps_the_server_asks_for():
    events: list = []
    tracker = GradTracker(events.append, grad_every=1, param_every=50)
    tracker.install()
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(6):
            if step == 2:
                tracker.weights_at([1, 4])  # 1 is past: the ranks could no longer agree on it
            opt.zero_grad()
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
        tracker.drain(block=True)
    finally:
        tracker.uninstall()
    assert [e.step for e in events if isinstance(e, protocol.Param)] == [0, 4]


def test_weights_after_the_last_step_are_fingerprinted_whatever_param_every():
    """A run of 24 steps with weight checks every 50: its weights are still compared, at its end."""
    events, weights = _train({"grad_every": 1, "param_every": 50}, steps=24)
    params = [e for e in events if isinstance(e, protocol.Param)]
    assert [p.step for p in params] == [0, 23]
    assert params[-1].fps == bucket_fingerprints(weights[23], 16).result()[1]


def test_param_every_zero_disables_and_stats_count_nonfinite():
    events, _ = _train({"grad_every": 1, "param_every": 0}, steps=3, poison_step=1)
    assert not [e for e in events if isinstance(e, protocol.Param)]
    grads = {e.step: e for e in events if isinstance(e, protocol.Grad)}
    assert grads[0].nonfinite == 0 and grads[0].norm > 0 and math.isfinite(grads[0].norm)
    assert grads[1].nonfinite == 1 and math.isnan(grads[1].norm)


def test_plain_tensors_have_no_dtensor_group():
    assert _dtensor_group(nn.Parameter(torch.zeros(3))) is None


_FSDP2 = r"""
import os, sys, torch, torch.distributed as dist
from torch import nn
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from agents.grads import GradTracker
from agents import protocol
for shape in ((1,), (1, 1)):
    events = []
    t = GradTracker(events.append, 1, 1); t.install()
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    fully_shard(m, mesh=init_device_mesh("cpu", shape, mesh_dim_names=("rep", "shard")[-len(shape):]))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(3, 8)).sum().backward(); opt.step(); t.final_weights(); t.drain(); t.uninstall()
    print("GROUPS", shape, sorted({(type(e).__name__, e.group) for e in events
                                   if isinstance(e, (protocol.Grad, protocol.Param))}))
dist.destroy_process_group()
"""


def test_fsdp2_shards_get_shard_groups_never_ddp_or_local():
    """FSDP2 (fully_shard): each shard is its own comparison group; HSDP replicas share the shard
    coordinate of the sharded mesh dimension only (here one rank, so coordinates are 0)."""
    import subprocess
    import sys

    from tests.stack import free_port

    from .conftest import REPO

    out = subprocess.run(
        [sys.executable, "-c", _FSDP2, str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("GROUPS")]
    assert lines == [
        "GROUPS (1,) [('Grad', 'shard:0=0'), ('Param', 'shard:0=0')]",
        "GROUPS (1, 1) [('Grad', 'shard:1=0'), ('Param', 'shard:1=0')]",
    ]


_LATE_ATTACH = r"""
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
model = DDP(nn.Linear(4, 2))  # made before the agent attaches
from agents import protocol
from agents.grads import GradTracker
events = []
t = GradTracker(events.append, 1, 0); t.install()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(3, 4)).sum().backward(); opt.step(); t.drain(); t.uninstall()
print("GROUPS", sorted({e.group for e in events if isinstance(e, protocol.Grad)}))
from demo.ddp_job import end_distributed
end_distributed()
"""


def test_ddp_made_before_attach_is_still_the_ddp_group():
    import subprocess
    import sys

    from tests.stack import free_port

    from .conftest import REPO

    out = subprocess.run(
        [sys.executable, "-c", _LATE_ATTACH, str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "GROUPS ['ddp']" in out.stdout


def test_layout_is_told_once_per_change_with_two_optimizers():
    """Two optimizers stepping in turn: each one's buckets are cached on their own, so the layout
    (both optimizers' groups) is reported when the second one first steps, then never again."""
    layouts: list = []
    tracker = GradTracker(lambda e: None, 1, 0, on_layout=lambda names, buckets: layouts.append((names, buckets)))
    tracker.install()
    torch.manual_seed(0)
    enc, head = nn.Linear(4, 8), nn.Linear(8, 2)
    opts = [torch.optim.SGD(enc.parameters(), lr=0.1), torch.optim.SGD(head.parameters(), lr=0.1)]
    try:
        for _ in range(3):
            for opt in opts:
                opt.zero_grad()
                head(enc(torch.randn(2, 4))).sum().backward()
                opt.step()
    finally:
        tracker.uninstall()
    assert len(layouts) == 2
    names, buckets = layouts[-1]
    assert names == ["local:group0.0", "local:group0.1", "local.1:group0.0", "local.1:group0.1"]
    assert sorted(i for b in buckets for i in b) == [0, 1, 2, 3]


def test_groups_follow_a_param_group_added_mid_run():
    """Groups are cached per optimizer between steps; a parameter group added later is picked up
    at the next step (layout told again, and its gradient changes the fingerprints)."""
    layouts: list = []
    events: list = []
    tracker = GradTracker(events.append, 1, 0, on_layout=lambda names, buckets: layouts.append(names))
    tracker.install()
    torch.manual_seed(0)
    body, extra = nn.Linear(4, 2), nn.Linear(2, 1)
    opt = torch.optim.SGD(body.parameters(), lr=0.1)
    try:
        for step in range(4):
            if step == 2:
                opt.add_param_group({"params": list(extra.parameters())})
            opt.zero_grad()
            extra(body(torch.randn(3, 4))).sum().backward()
            opt.step()
        tracker.drain(block=True)
    finally:
        tracker.uninstall()
    assert layouts == [
        ["local:group0.0", "local:group0.1"],
        ["local:group0.0", "local:group0.1", "local:group1.0", "local:group1.1"],
    ]
    grads = [e for e in events if isinstance(e, protocol.Grad)]
    assert [len(e.fps) for e in grads] == [2, 2, 4, 4]


def _losses(log_before_step: bool, steps: int = 4, explicit: dict | None = None) -> dict[int, float]:
    events: list = []
    tracker = GradTracker(events.append, grad_every=1, param_every=0)
    tracker.install()
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(steps):
            opt.zero_grad()
            loss = model(torch.full((2, 4), float(step))).pow(2).mean() + 100 * step
            loss.backward()
            if log_before_step:
                tracker.log_loss(loss)
            opt.step()
            if not log_before_step:
                tracker.log_loss(loss.item())
        for step, value in (explicit or {}).items():
            tracker.log_loss(torch.tensor(value), step=step)
        tracker.drain(block=True)
    finally:
        tracker.uninstall()
    return {e.step: e.loss for e in events if isinstance(e, protocol.Step) and e.loss is not None}


def test_a_logged_loss_belongs_to_its_step_whether_logged_before_or_after_optimizer_step():
    for before in (True, False):
        losses = _losses(before)
        assert sorted(losses) == [0, 1, 2, 3], before
        assert [int(losses[s] // 100) for s in range(4)] == [0, 1, 2, 3], before  # step s's loss is 100 s + ...
    assert _losses(True, steps=1, explicit={7: 2.5})[7] == 2.5


def test_a_non_finite_loss_is_flagged_not_lost_as_null():
    """JSON has no NaN: a plain NaN loss would arrive as null, the same as no loss at all."""
    events: list = []
    tracker = GradTracker(events.append, grad_every=1, param_every=0)
    tracker.log_loss(float("inf"), step=3)
    tracker.log_loss(torch.tensor(float("nan")), step=4)
    tracker.log_loss(1.5, step=5)
    tracker.drain(block=True)
    wire = [msgspec.json.decode(protocol.encode(e)) for e in events if isinstance(e, protocol.Step)]
    assert [(w["step"], w.get("loss"), w.get("nonfinite_loss", False)) for w in wire] == [
        (3, None, True),
        (4, None, True),
        (5, 1.5, False),
    ]


def test_parameters_outside_ddp_are_named_by_their_module_path():
    """A data parallelism of the job's own (a hand-written all-reduce) names parameters as DDP would."""
    events: list = []
    tracker = GradTracker(events.append, grad_every=1, param_every=0, on_layout=lambda names, _: events.append(names))
    tracker.install()
    model = torch.compile(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    finally:
        tracker.uninstall()
    [names] = [e for e in events if isinstance(e, list)]
    assert names == ["local:0.weight", "local:0.bias", "local:2.weight", "local:2.bias"]


class _IgnoresClosure(torch.optim.Optimizer):
    """An optimizer whose step takes a closure and never calls it."""

    def __init__(self, params):
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.1)


def test_a_step_given_a_closure_fingerprints_the_gradients_its_closure_computed():
    """Lightning's automatic optimization calls `optimizer.step(closure)` with the forward and backward
    inside the closure, after the pre-hook: each step's fingerprints are of the gradients its closure
    made (never the previous step's), an LBFGS step calling its closure again counts once with its
    first call's gradients, and a step whose optimizer never calls the closure is still counted."""
    events: list = []
    tracker = GradTracker(events.append, grad_every=1, param_every=50)
    tracker.install()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    made: dict[int, list[torch.Tensor]] = {}

    def closure_of(step: int, opt: torch.optim.Optimizer):
        def closure():
            opt.zero_grad()  # as Lightning does, inside the closure
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            made.setdefault(step, [p.grad.detach().clone() for p in model.parameters()])
            return loss

        return closure

    try:
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        sgd.step(closure_of(0, sgd))
        sgd.step(closure=closure_of(1, sgd))
        lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
        lbfgs.step(closure_of(2, lbfgs))
        assert len(made) == 3
        sgd.step(closure_of(3, sgd))
        _IgnoresClosure(model.parameters()).step(closure_of(4, sgd))  # counted at the next step
        sgd.step(closure_of(5, sgd))
        _IgnoresClosure(model.parameters()).step(closure_of(6, sgd))  # counted as the agent closes
        tracker.final_weights()
        tracker.drain(block=True)
    finally:
        tracker.uninstall()
    grads = [e for e in events if isinstance(e, protocol.Grad)]
    assert [g.step for g in grads] == list(range(7)) and 4 not in made and 6 not in made
    for g in grads:
        if g.step in made:
            assert g.norm and g.fps == bucket_fingerprints(made[g.step], 16).result()[1], g.step
    assert {e.step for e in events if isinstance(e, protocol.Param)} == {0, 6}  # the last step counted at close
