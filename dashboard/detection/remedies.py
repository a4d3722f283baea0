"""What a compile cost line says and what to do about it, in one line each.

A guard failure reads differently every time it fires ("size mismatch at index 0. expected 16,
actual 17", then "... actual 23"), so `reason_line` turns it into what changed ("dimension 0 of x
changes"): a frame that recompiles a hundred times for one reason is one line of the bill. The
remedy names the one call or setting that removes the cost.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

_PREFIX = re.compile(r"^\s*-?\s*(?:!?\d+/)*\d+:\s*")  # "0/0: ", "!1/0/2: " (compile ids before each reason)
_COMMENT = re.compile(r"\s+#.*$")  # torch appends the user line as a comment
_TENSOR = re.compile(r"tensor '(?P<name>[^']+)' (?P<what>[\w ]+?) mismatch(?: at index (?P<dim>\d+))?")
_LEN = re.compile(r"^len\((?P<name>[^)]+)\)\s*==\s*\d+$")
_VALUE = re.compile(r"^(?P<name>[\w.\[\]'\"]+)\s*(?:==|is|!=|is not)\s*(?P<value>.+)$")
_IDENTITY = re.compile(r"___check_(?P<kind>type|obj)_id\((?P<name>[^,]+),")
_SOURCE = re.compile(r"""(?:L|G)\[['"]([^'"]+)['"]\]""")
_NUMBER = re.compile(r"\b\d+(?:\.\d+)?\b")

TENSOR_WHAT = {
    "size": "dimension {dim} of {name} changes",
    "stride": "stride {dim} of {name} changes",
    "rank": "number of dimensions of {name} changes",
    "dtype": "dtype of {name} changes",
    "device": "device of {name} changes",
    "requires_grad": "requires_grad of {name} changes",
}


def source_name(text: str) -> str:
    """`L['x']` -> x, `L['self'].w` -> self.w: the name as the user wrote it."""
    return _SOURCE.sub(lambda m: m.group(1), text.strip())


def first_reason(text: str) -> str:
    """The first guard that failed: torch lists one per cached entry, newest first, joined by the agent."""
    for part in re.split(r";\s+|\n", text or ""):
        part = _COMMENT.sub("", _PREFIX.sub("", part)).strip()
        if part and not part.startswith(("User stack trace", "File ", "-")):
            return part
    return ""


@functools.lru_cache(maxsize=4096)  # a run's guard failures repeat: 1,024 ranks recompiling for one reason
def reason_line(text: str | None) -> str:
    """The guard failure as what changed, the same however often and with whatever values it fired."""
    reason = source_name(first_reason(text or ""))
    if not reason:
        return "unknown guard"
    if m := _TENSOR.search(reason):
        name, what = source_name(m["name"]), m["what"].strip()
        template = TENSOR_WHAT.get(what, f"{what} of {{name}} changes")
        return template.format(name=name, dim=m["dim"] if m["dim"] is not None else "?")
    if m := _LEN.match(reason):
        return f"length of {source_name(m['name'])} changes"
    if m := _IDENTITY.search(reason):
        return f"{'type' if m['kind'] == 'type' else 'object'} of {source_name(m['name'])} changes"
    if m := _VALUE.match(reason):
        return f"value of {source_name(m['name'])} changes"
    return _NUMBER.sub("N", source_name(reason))[:160]


TORCH_OWN = "torch/"  # a frame key of torch's own files (library frames are keyed by their path in the install)
_TORCH_PATH = re.compile(r"(?:^|[/\\])(?:site|dist)-packages[/\\]torch[/\\]|^torch[/\\]")
_BROKE_AT = re.compile(
    r"Graph break in user code at (?P<path>[^\n]+?):\d+|from user code at:\s*File \"(?P<file>[^\"]+)\""
)
_SKIPPED_IN = re.compile(r"in file `(?P<path>[^`]+)`")
INSIDE_TORCH = "inside torch's own code"


def inside_torch(frame: str, reason: str = "") -> bool:
    """A graph break nobody but torch's developers can fix: in a frame of torch's own code (its key
    a path in torch, or the agent's `user line via torch.module.fn` for a torch wrapper frame), or,
    by Dynamo's text, at a line of torch (DDP's `_pre_forward` calling `Logger.set_runtime_stats_and_log`
    under torch.compile(DDP(model)), keyed by the user's line) or in a context manager (contextlib)
    that calls a function of torch Dynamo skips (DDP's `_inside_ddp_forward`)."""
    path, _, via = frame.partition(" via ")
    if _TORCH_PATH.search(path) or via.startswith("torch."):
        return True
    m = _BROKE_AT.search(reason or "")
    if m is None:
        return False
    at = (m["path"] or m["file"]).replace("\\", "/")
    if _TORCH_PATH.search(at):
        return True
    skipped = _SKIPPED_IN.search(reason)
    return at.rsplit("/", 1)[-1] == "contextlib.py" and bool(skipped and _TORCH_PATH.search(skipped["path"]))


def remedy(cause: str, line: str = "", frame: str = "") -> str:
    """One line: the change that removes this cost."""
    if cause == "recompile":
        return recompile_remedy(line)
    if cause == "avoidable_miss":
        return (
            "share one warm TORCHINDUCTOR_CACHE_DIR (a shared filesystem, or the remote FX graph cache) "
            "across ranks and runs: another rank or an earlier run already had this entry"
        )
    if cause == "compile_straggler":
        return (
            "give the slow ranks the warm cache the others had (share TORCHINDUCTOR_CACHE_DIR) and check "
            "their hosts' load; autotuning on one rank only also shows up here"
        )
    if cause == "failed_compile":
        return (
            f"fix the failure ({line}) or keep the frame out of compilation with "
            "torch.compiler.disable; every attempt costs the time until it fails"
        )
    if "graph break" in line and (INSIDE_TORCH in line or inside_torch(frame)):
        return (
            "the break is inside torch's own code (DDP's wrappers, its context managers), which you cannot "
            "change: compile the module inside it instead, DDP(torch.compile(model)) rather than "
            "torch.compile(DDP(model))"
        )
    if "graph break" in line:
        return (
            "fix the graph break (torch._dynamo.explain(fn)(*args) lists them): one graph compiles "
            "instead of one per piece"
        )
    return (
        "warm TORCHINDUCTOR_CACHE_DIR before the job (or share it across ranks and runs) so the first "
        "compile loads from the cache"
    )


def recompile_remedy(line: str) -> str:
    if m := re.fullmatch(r"dimension (\d+) of (.+) changes", line):
        return f"torch._dynamo.mark_dynamic({m[2]}, {m[1]}) before the call (or torch.compile(..., dynamic=True))"
    if line.startswith(("stride", "number of dimensions", "length of")):
        return "torch.compile(..., dynamic=True), or keep the input's layout and length the same every step"
    if line.startswith(("dtype", "device", "requires_grad")):
        return "feed the compiled function one dtype/device/requires_grad (cast before the call)"
    if line.startswith("value of"):
        return (
            "pass the changing value as a tensor (or torch.compile(..., dynamic=True) for an int); "
            "a Python constant is baked into the graph"
        )
    return "torch.compile(..., dynamic=True), or keep what the guard checks constant across steps"


ALERTS_DOC = "docs/alerts.md"
# What to do first about an incident, by its root's kind (docs/alerts.md has the whole story).
INCIDENT_REMEDIES = {
    "graph_divergence": (
        "make the rank-dependent branch rank-independent, mark dims dynamic up front "
        "(torch._dynamo.mark_dynamic), or enable torch._dynamo.config.enable_compiler_collectives"
    ),
    "recompile_divergence": (
        "give every rank the same shapes (pad or drop ragged batches, drop_last=True) or mark the changing dims dynamic"
    ),
    "compile_failure_divergence": "fix the failing ranks' hosts (their rank pages show the environment)",
    "rank_specific_artifact": (
        "clear the shared cache dir or give each node type its own TORCHINDUCTOR_CACHE_DIR; after a critical "
        "one, resume from a checkpoint written before it"
    ),
    "collective_schedule_divergence": "fix the graph divergence first; expect a hang at the next collective",
    "cache_divergence": "warm the caches uniformly (a shared or remote cache)",
    "compile_straggler": "warm or share the Inductor cache; raise the collective timeout for the first steps",
    "ineffective_compile": "use DDP(torch.compile(model)) or compile the inner module; fix the graph breaks",
    "recompile_storm": "mark the changing dims dynamic or move changing scalars into tensors",
    "grad_divergence": "check the named ranks' hosts, run with deterministic algorithms, compare with eager",
    "param_divergence": "restart from a checkpoint written by a majority rank; find the first grad_divergence",
    "nonfinite_grad": "inspect the named ranks' data at that step",
    "rank_silent": "look at that rank's host (py-spy, Flight Recorder): the other ranks wait for it",
    "hang_forecast": (
        "decide before the collective timeout: let it finish, raise the timeout, warm the cache, or mark dims "
        "dynamic so the recompile does not happen"
    ),
    "rank_crashed": "read the traceback at the named frame on that rank's host",
    "baseline_divergence": "compare the two runs on the compare page; decide whether bitwise equality is expected",
}


# What to do about weights that differ while every gradient compared agreed, by when they parted
# (`models.weights_parted`): no grad_divergence to find, the optimizer's step differed (or the start).
_OPTIMIZER = (
    "the gradients agreed, the weights did not: compare the optimizer settings of {ranks} with another rank's "
    "(learning rate and its scheduler, weight decay, momentum, param groups)"
)
PARTED_REMEDIES = {
    "update": _OPTIMIZER + ", then restart from a checkpoint written by a majority rank",
    "first": _OPTIMIZER + ", and check that every rank started from the same weights (one seed, or rank 0's "
    "broadcast before training, as DDP does); then restart from a checkpoint written by a majority rank",
}


def incident_remedy(
    kind: str, details: dict[str, Any] | None, parted: str = "", ranks: Sequence[int] = ()
) -> dict[str, Any]:
    """What to do about an incident rooted in an alert of `kind` (of `ranks`), and where the alert
    reference says more: the alert's own advice where its rule gave one (a crash's hint, a cost's
    remedy); for weights that differ, by when they parted (`PARTED_REMEDIES`)."""
    own = (details or {}).get("hint") or (details or {}).get("remedy")
    if isinstance(own, str) and own:
        text = own
    elif kind == "param_divergence" and parted in PARTED_REMEDIES:
        text = PARTED_REMEDIES[parted].format(ranks=_ranks(ranks))
    else:
        text = INCIDENT_REMEDIES.get(kind, "see the alert reference")
    return {"text": text, "doc": f"{ALERTS_DOC}#{kind}"}


def _ranks(ranks: Sequence[int]) -> str:
    """ "rank 2", "ranks 1, 2" ("the named ranks" for none)."""
    ordered = sorted(ranks)
    if not ordered:
        return "the named ranks"
    return f"rank{'s' if len(ordered) > 1 else ''} {', '.join(map(str, ordered))}"
