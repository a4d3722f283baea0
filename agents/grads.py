"""Gradient fingerprints at every optimizer step (docs/design.md, What the agent captures).

A global optimizer step pre-hook sees the final gradients (after DDP's all-reduce) just before
the update. Step numbering: every `optimizer.step()` call is one step, counted from 0 per
process; `set_step(n)` makes the next call step n. Parameters managed by a
DistributedDataParallel module form group "ddp" (true replicas, compared across ranks); all
other parameters form group "local", named by their module path, which the server compares only
once their gradients agree on every rank (a data parallelism of the job's own). With several optimizers,
the k-th one seen (k >= 1) gets groups "ddp.k" / "local.k".

No device synchronization inside the step: fingerprints travel to the host with one async
copy and are read at the next step (immediately on CPU, where the copy is already done).

Invisible to the compiler: when Dynamo traces an optimizer step (`torch.compile` of the step, or
of a whole train step), the hooks do nothing but one attribute store (`COMPILED_STEP`), which
Dynamo replays after the graph without a graph break, a guard or a recompile; so the user's
compiled regions compile to the same graphs as without the agent. A step that runs compiled has
no eager moment to fingerprint in: the agent says so once (`notices`, a `notice` event).

Weights are fingerprinted every `param_every` steps, after the steps the server asks for, and
after the last step as the process closes (`final_weights`): a divergence that starts between two
weight checks is seen at the end of the run at the latest.
"""

from __future__ import annotations

import collections
import gc
import itertools
import math
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from agents import protocol
from agents.fingerprinting import Pending, balanced_buckets, bucket_fingerprints, device_pending, host_pending

RING_STEPS = 128
# the sender thread reads landed fingerprints at every flush; the step itself only past this many waiting
DRAIN_IN_STEP_AT = 1024
RECENT_STEPS = 16  # an optimizer that has not stepped for this many steps is no longer held for the final weights
Groups = dict[str, tuple[list[str], list[torch.Tensor]]]  # group -> (names, parameters)
GroupKey = tuple[tuple[int, ...], tuple[int, ...]]  # ids of the optimizer's parameters and of the DDP modules
NBUCKETS = 16

_ddp_modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_ddp_patched = False


def _ddp_class() -> type[torch.nn.Module] | None:
    try:
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel
    except Exception:
        return None


def track_ddp() -> None:
    """Record every DDP instance: a wrapper on DDP.__init__ for new ones (idempotent)."""
    global _ddp_patched
    cls = _ddp_class()
    if cls is None or _ddp_patched:
        return
    original = cls.__init__

    def __init__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _ddp_modules.add(self)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[method-assign]
    _ddp_patched = True


def _scan_ddp() -> None:
    """Find DDP instances created before the agent attached (once, at attach: under `agents run`
    that is before the script's objects exist, so the heap is small)."""
    cls = _ddp_class()
    if cls is None:
        return
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads `obj.__class__` of every object on the heap, and
        # torch's deprecated aliases (`torch.distributed.reduce_op`) warn on any attribute read.
        if issubclass(type(obj), cls):
            _ddp_modules.add(obj)


def _ddp_params() -> dict[int, str]:
    """id(param) -> qualified name, for parameters DDP synchronizes."""
    out: dict[int, str] = {}
    for module in list(_ddp_modules):
        ignored = set(getattr(module, "parameters_to_ignore", ()) or ())
        inner: torch.nn.Module = getattr(module, "module", module)  # DDP's wrapped model
        for name, p in inner.named_parameters():
            if p.requires_grad and name not in ignored:
                out.setdefault(id(p), name)
    return out


class _CompiledStep:
    """Whether an optimizer step ran inside a compiled region (set by the hooks while Dynamo traces)."""

    seen = False


COMPILED_STEP = _CompiledStep()
COMPILED_STEP_NOTICE = (
    "the optimizer step runs under torch.compile: its gradients are not fingerprinted at each step "
    "(taking them inside the compiled step would change its graph), nor are its weights. Call "
    "optimizer.step() outside the compiled region to have its replicas compared."
)


def _module_paths(wanted: set[int]) -> dict[int, str]:
    """id(param) -> its path in the outermost module holding it ("layers.0.weight"), for parameters no
    DDP module names (a hand-written all-reduce, Megatron-LM, DeepSpeed): one walk of the heap, once per
    optimizer layout, and only for such parameters. Wrappers' own prefixes (torch.compile's
    `_orig_mod`) are left out; Dynamo's graph modules, which hold the parameters too, are skipped."""
    import torch.fx

    modules = [
        o
        for o in gc.get_objects()
        if issubclass(type(o), torch.nn.Module) and not issubclass(type(o), torch.fx.GraphModule)
    ]
    parent: dict[int, tuple[torch.nn.Module, str]] = {}
    for module in modules:
        for name, child in module.named_children():
            parent.setdefault(id(child), (module, name))
    paths: dict[int, str] = {}
    for module in modules:
        for name, p in module.named_parameters(recurse=False):
            if id(p) in wanted and id(p) not in paths and (path := _path_up(module, parent)):
                paths[id(p)] = ".".join(path + [name])  # (a bare "weight" names nothing: left out)
    return paths


def _path_up(module: torch.nn.Module, parent: dict[int, tuple[torch.nn.Module, str]]) -> list[str]:
    """The names from the outermost module down to `module`, wrappers' `_orig_mod` left out."""
    parts: list[str] = []
    seen = {id(module)}
    while id(module) in parent:
        module, name = parent[id(module)]
        if id(module) in seen:  # a module that holds itself somewhere below
            break
        seen.add(id(module))
        if name != "_orig_mod":
            parts.append(name)
    return parts[::-1]


@dataclass
class _InFlight:
    step: int
    group: str
    names: list[str]
    pending: Pending
    weights: bool = False


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of a DTensor (FSDP2 / tensor parallel); plain tensors as they are
    (detached only when they require grad: this runs for every parameter at every step)."""
    if type(t).__name__ == "DTensor":
        try:
            local: torch.Tensor = t.to_local()  # type: ignore[attr-defined]  # a DTensor, known by name only
            return local
        except Exception:
            pass
    return t.detach() if t.requires_grad else t


def _dtensor_group(p: torch.Tensor) -> str | None:
    """Comparison group of a DTensor parameter (FSDP2 `fully_shard`, tensor parallel).

    Ranks holding the same shard (same coordinate on every non-replicated mesh dimension) are
    true replicas and share a group: "dtensor" when replicated on every dimension, else
    "shard:<coordinates>". Plain FSDP2 on a 1-D mesh gives every rank its own shard, hence its
    own group, so nothing is compared that need not agree; HSDP's replicas are compared.
    """
    if type(p).__name__ != "DTensor":
        return None
    try:
        dtensor: Any = p  # a DTensor, known by name only (torch.distributed.tensor may not import)
        coord = dtensor.device_mesh.get_coordinate() or []
        sharded = [str(c) for c, pl in zip(coord, dtensor.placements) if not pl.is_replicate()]
        dims = [str(i) for i, pl in enumerate(dtensor.placements) if not pl.is_replicate()]
        return "dtensor" if not sharded else f"shard:{','.join(dims)}={','.join(sharded)}"
    except Exception:
        return "local"


def _grad_stats(present: list[torch.Tensor]) -> torch.Tensor:
    """int64 [2] on the device: the float64 bits of the squared global norm, and the number of
    gradients holding a non-finite value (a NaN or inf element makes that tensor's norm
    non-finite). Three small ops per step from one fused foreach norm, never one per element.
    """
    try:
        norms = torch.stack(torch._foreach_norm(present, 2))
    except Exception:
        norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in present])
    norms = norms.double()
    sumsq = (norms * norms).sum()
    nonfinite = (~torch.isfinite(norms)).sum()
    return torch.stack([sumsq.view(torch.int64), nonfinite.to(torch.int64)])


def loss_event(step: int, loss: float) -> protocol.Step:
    """A logged loss; a NaN or inf one is flagged (JSON would carry it as null, the same as no loss),
    so the server can tell which rank's loss went non-finite first."""
    if math.isfinite(loss):
        return protocol.Step(ts=time.time(), step=step, loss=loss)
    return protocol.Step(ts=time.time(), step=step, nonfinite_loss=True)


class GradTracker:
    """Owns the step counter, the optimizer hook, in-flight fingerprints and the detail ring."""

    def __init__(
        self,
        emit: Callable[[protocol.Event], None],
        grad_every: int = 1,
        param_every: int = 50,
        on_layout: Callable[[list[str], list[list[int]]], None] | None = None,
    ) -> None:
        self._emit = emit
        self._on_layout = on_layout
        self._layout: tuple[list[str], list[list[int]]] | None = None  # as last reported
        self.device: torch.device | None = None  # where the first optimizer's first parameter lives
        # optimizer index -> (parameter identity, {group: buckets}, {group: names})
        self._bucket_cache: dict[
            int, tuple[tuple[tuple[str, tuple[int, ...]], ...], dict[str, list[list[int]]], dict[str, list[str]]]
        ] = {}
        self._every = max(1, grad_every)
        self._param_every = max(0, param_every)  # 0: no weight fingerprints
        self._next_step = 0
        self._current: int | None = None
        self._last_time: float | None = None
        self._optimizers: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        self._group_cache: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[GroupKey, Groups]] = (
            weakref.WeakKeyDictionary()
        )
        self._inflight: list[_InFlight] = []
        self._losses: list[tuple[int, torch.Tensor, torch.cuda.Event]] = []  # (step, host copy, device event) in flight
        self._steps_seen = 0
        self._log_after: bool | None = None  # log() called after optimizer.step() (learned at its first call)
        self._ring: collections.deque[tuple[int, str, dict[str, int]]] = collections.deque()
        self._weights_asked: set[int] = set()  # steps the server asked weight fingerprints after (`weights_at`)
        self._lock = threading.Lock()
        self._handle: RemovableHandle | None = None
        self._told_compiled = False
        self._weights_taken: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = weakref.WeakKeyDictionary()
        # the optimizers that stepped lately, held (a script's objects are gone by the time it exits and the
        # agent closes: its final weights need them), let go once they stop stepping (a sweep's old trials)
        self._recent: dict[torch.optim.Optimizer, int] = {}
        self._uncalled: torch.optim.Optimizer | None = None  # stepped with a closure not called yet

    @property
    def step(self) -> int:
        """The optimizer step in progress (the number the next optimizer.step() gets)."""
        return self._next_step

    def set_step(self, n: int) -> None:
        self._next_step = max(0, int(n))

    def install(self) -> None:
        track_ddp()
        _scan_ddp()  # at attach, never inside a training step: DDP modules made before the hook
        self._handle = register_optimizer_step_pre_hook(self._hook)

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # the hook ------------------------------------------------------------------------
    def _hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """Before the update: the weights as the previous step left them, then the gradients.

        One pre-hook and no post-hook: torch runs post-hooks after the step's last graph break, so a
        traced one (even one that does nothing) turns that graphless frame into a 0-op graph.

        A step given a closure (`optimizer.step(closure)`: Lightning's automatic optimization, LBFGS)
        computes its gradients inside `step()`, after this hook: what `.grad` holds here is the previous
        step's. Its gradients are taken as the closure's first call returns, before the update: the hook
        hands torch the same arguments with the closure wrapped."""
        if torch.compiler.is_compiling():  # traced by Dynamo: leave the user's graph as it is
            COMPILED_STEP.seen = True
            return None
        try:
            self._step_of_uncalled_closure()
            self._weights_before()
            if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer itself
                return (args[0], self._closure_then_step(optimizer, args[1]), *args[2:]), kwargs
            if callable(kwargs.get("closure")):
                return args, dict(kwargs, closure=self._closure_then_step(optimizer, kwargs["closure"]))
            self._on_step(optimizer)
        except Exception:  # never raise into user code
            pass
        return None

    def _closure_then_step(self, optimizer: torch.optim.Optimizer, closure: Callable[..., Any]) -> Callable[..., Any]:
        """`closure`, counting the step and taking its gradients once its first call returned (an LBFGS
        step calls it again at trial weights). A step whose optimizer never calls it is counted at the
        next step or as the agent closes, with the gradients then in `.grad`."""
        self._uncalled = optimizer

        def closure_then_step(*args: Any, **kwargs: Any) -> Any:
            result = closure(*args, **kwargs)  # the user's errors are the user's
            if self._uncalled is optimizer:
                self._uncalled = None
                try:
                    self._on_step(optimizer)
                except Exception:  # never raise into user code
                    pass
            return result

        return closure_then_step

    def _step_of_uncalled_closure(self) -> None:
        if self._uncalled is not None:
            optimizer, self._uncalled = self._uncalled, None
            self._on_step(optimizer)

    def _weights_before(self) -> None:
        """Weight fingerprints after the previous step, every `param_every` steps (same groups and
        buckets) and after the steps the server asked for, taken before this step changes any: of
        every optimizer that stepped before (with several, the previous step may have been another's)."""
        step = self._next_step - 1
        if step >= 0 and self._param_every and (step % self._param_every == 0 or self._asked_now(step)):
            for optimizer in list(self._optimizers):
                self._fingerprint(optimizer, step, weights=True)

    def notices(self) -> list[protocol.Event]:
        """What the agent could not capture, once per process: a compiled optimizer step."""
        if not COMPILED_STEP.seen or self._told_compiled:
            return []
        self._told_compiled = True
        return [protocol.Notice(ts=time.time(), code="compiled_optimizer_step", text=COMPILED_STEP_NOTICE)]

    def final_weights(self) -> None:
        """Weights after the last step, as the process closes, for every optimizer whose weights were
        not just fingerprinted at that step (the ranks of a run that ends together agree on it)."""
        try:
            self._step_of_uncalled_closure()
        except Exception:  # never raise into user code
            pass
        step = self._next_step - 1
        if step < 0 or not self._param_every:
            return
        for optimizer in list(self._recent):
            cached = self._group_cache.get(optimizer)  # the groups of training: its DDP module may be gone by now
            if cached is not None and self._weights_taken.get(optimizer) != step:
                self._fingerprint(optimizer, step, weights=True, groups=cached[1])
        self._recent.clear()

    def weights_at(self, steps: list[int]) -> None:
        """The server wants weight fingerprints after these steps (every rank is asked for the same
        ones, so their slots compare); a step already past is never taken: the ranks could not agree on it.
        Called from the sender thread. Without weight fingerprints (LOCKSTEP_PARAM_EVERY=0) nothing is kept."""
        if not self._param_every:
            return
        with self._lock:
            self._weights_asked.update(s for s in steps if s >= self._next_step)

    def _asked_now(self, step: int) -> bool:
        """Whether `step` was asked for; forgets the asks up to it."""
        if not self._weights_asked:
            return False
        with self._lock:
            asked = step in self._weights_asked
            self._weights_asked = {s for s in self._weights_asked if s > step}
        return asked

    def _on_step(self, optimizer: torch.optim.Optimizer) -> None:
        step = self._next_step
        self._next_step = step + 1
        self._recent[optimizer] = step
        if len(self._recent) > 1:
            self._recent = {o: s for o, s in self._recent.items() if s > step - RECENT_STEPS}
        self._steps_seen += 1
        now = time.perf_counter()
        step_time = None if self._last_time is None else now - self._last_time
        self._last_time = now
        self._emit(protocol.Step(ts=time.time(), step=step, step_time=step_time))
        if step % self._every == 0:
            self._fingerprint(optimizer, step)
        if len(self._inflight) >= DRAIN_IN_STEP_AT:  # the sender fell behind: bound what waits
            self.drain(block=False)

    def _groups(self, optimizer: torch.optim.Optimizer) -> Groups:
        """Comparison groups of the optimizer's parameters; computed again only when its parameters
        or the DDP modules change (the cache holds the parameters, so their ids stay theirs)."""
        k = self._optimizers.setdefault(optimizer, len(self._optimizers))
        key = (
            tuple(map(id, itertools.chain.from_iterable(g["params"] for g in optimizer.param_groups))),
            tuple(map(id, _ddp_modules)),
        )
        cached = self._group_cache.get(optimizer)
        if cached is None or cached[0] != key:
            cached = self._group_cache[optimizer] = (key, self._make_groups(optimizer, k))
        return cached[1]

    def _make_groups(self, optimizer: torch.optim.Optimizer, k: int) -> Groups:
        suffix = f".{k}" if k else ""
        ddp = _ddp_params()
        unnamed = {id(p) for g in optimizer.param_groups for p in g["params"] if id(p) not in ddp}
        paths = _module_paths(unnamed) if unnamed else {}
        groups: Groups = {}
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                name = ddp.get(id(p))
                shard = _dtensor_group(p) if name is None else None
                key = (shard or ("ddp" if name is not None else "local")) + suffix
                names, params = groups.setdefault(key, ([], []))
                names.append(name if name is not None else paths.get(id(p), f"group{gi}.{pi}"))
                params.append(p)
        return groups

    @torch.no_grad()
    def _fingerprint(
        self, optimizer: torch.optim.Optimizer, step: int, weights: bool = False, groups: Groups | None = None
    ) -> None:
        groups = groups or self._groups(optimizer)
        layout = self._buckets(self._optimizers[optimizer], groups)
        if weights:
            self._weights_taken[optimizer] = step
        for group, (names, params) in groups.items():
            if weights:
                pending = bucket_fingerprints([_local(p) for p in params], buckets=layout[group])
            else:
                pending = self._grad_pending(
                    [_local(p.grad) if p.grad is not None else None for p in params], layout[group]
                )
            with self._lock:
                self._inflight.append(_InFlight(step, group, names, pending, weights=weights))

    @staticmethod
    def _grad_pending(grads: list[torch.Tensor | None], buckets: list[list[int]]) -> Pending:
        """Fingerprints and statistics of one group's gradients: one native pass on the CPU, two launches on CUDA, else
        the device kernels plus three small ops for the statistics."""
        pending = host_pending(grads, buckets, stats=True) or device_pending(grads, buckets, stats=True)
        if pending is not None:
            return pending
        present = [g for g in grads if g is not None]
        return bucket_fingerprints(grads, buckets=buckets, extra=_grad_stats(present) if present else None)

    def _buckets(self, k: int, groups: dict[str, tuple[list[str], list[torch.Tensor]]]) -> dict[str, list[list[int]]]:
        """The k-th optimizer's buckets per group, from the parameters' sizes (never from which
        gradients exist at a step, so a bucket holds the same parameters on every step); computed
        again, and the layout reported, only when that optimizer's parameters change."""
        key = tuple((group, tuple(map(id, params))) for group, (_, params) in groups.items())
        cached = self._bucket_cache.get(k)
        if cached is None or cached[0] != key:
            layout = {
                group: balanced_buckets([_local(p).numel() for p in params], NBUCKETS)
                for group, (_, params) in groups.items()
            }
            self._bucket_cache[k] = (key, layout, {group: names for group, (names, _) in groups.items()})
            self.device = self.device or next((_local(p).device for _, params in groups.values() for p in params), None)
            self._report_layout()
        return self._bucket_cache[k][1]

    def _report_layout(self) -> None:
        """Parameter names ("group:name") and buckets (indices into them) of every optimizer's
        groups in order, told when they differ from what was told last."""
        names: list[str] = []
        buckets: list[list[int]] = []
        for k in sorted(self._bucket_cache):
            _, layout, group_names = self._bucket_cache[k]
            for group, members in group_names.items():
                base = len(names)
                names += [f"{group}:{n}"[:512] for n in members]
                buckets += [[base + i for i in bucket] for bucket in layout[group]]
        if (names, buckets) != self._layout:
            self._layout = (names, buckets)
            if self._on_layout is not None:
                self._on_layout(names, buckets)

    # the loss ------------------------------------------------------------------------
    def log_loss(self, loss: float | torch.Tensor, step: int | None = None) -> None:
        """The loss of `step`, by default of the step in progress: the next optimizer.step()'s when
        the job logs before stepping, the one just taken when it logs after (told by the first call:
        had a step run already?). A device tensor travels with one async copy, read a step later."""
        if step is None:
            if self._log_after is None:
                self._log_after = self._steps_seen > 0
            step = self._next_step - 1 if self._log_after else self._next_step
        if step < 0:
            return
        if not isinstance(loss, torch.Tensor):
            self._emit(loss_event(step, float(loss)))
            return
        value = loss.detach().reshape(-1)[:1].to(torch.float64)
        if value.device.type != "cuda":
            self._emit(loss_event(step, float(value.sum())))
            return
        host = torch.empty(value.shape, dtype=torch.float64, pin_memory=True)
        host.copy_(value, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        with self._lock:
            self._losses.append((step, host, event))

    def _drain_losses(self, block: bool) -> None:
        with self._lock:
            done = [block or item[2].query() for item in self._losses]
            ready = [item for item, d in zip(self._losses, done) if d]
            self._losses = [item for item, d in zip(self._losses, done) if not d]
        for step, host, event in ready:
            event.synchronize()
            self._emit(loss_event(step, float(host.sum())))

    # reading results ----------------------------------------------------------------
    def drain(self, block: bool = True) -> None:
        """Emit Grad events whose copies are done (all of them when `block`)."""
        self._drain_losses(block)
        with self._lock:
            done = [block or i.pending.ready() for i in self._inflight]
            ready = [i for i, d in zip(self._inflight, done) if d]
            self._inflight = [i for i, d in zip(self._inflight, done) if not d]
        for item in ready:
            self._finish(item)

    def _finish(self, item: _InFlight) -> None:
        per, buckets = item.pending.result()
        if item.weights:
            self._emit(protocol.Param(ts=time.time(), step=item.step, group=item.group, fps=buckets))
            return
        extra = item.pending.extra()
        norm = nonfinite = None
        if len(extra) == 2:
            norm = struct.unpack("<d", struct.pack("<q", extra[0]))[0] ** 0.5
            nonfinite = int(extra[1])
        self._emit(
            protocol.Grad(
                ts=time.time(), step=item.step, group=item.group, fps=buckets, norm=norm, nonfinite=nonfinite or 0
            )
        )
        with self._lock:
            self._ring.append((item.step, item.group, dict(zip(item.names, per))))
            while self._ring and self._ring[0][0] <= item.step - RING_STEPS:
                self._ring.popleft()

    def detail(self, step: int) -> list[protocol.Detail]:
        """Per-parameter fingerprints of `step` from the ring (empty if it has aged out)."""
        with self._lock:
            found = [(g, params) for s, g, params in self._ring if s == step]
        return [
            protocol.Detail(ts=time.time(), step=step, group=g, params={k[:512]: v for k, v in params.items()})
            for g, params in found
        ]
