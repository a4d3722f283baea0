"""What a compile cost line says and what to do about it, in one line each.

A guard failure reads differently every time it fires ("size mismatch at index 0. expected 16,
actual 17", then "... actual 23"), so `reason_line` turns it into what changed ("dimension 0 of x
changes"): a frame that recompiles a hundred times for one reason is one line of the bill. The
remedy names the one call or setting that removes the cost.
"""

from __future__ import annotations

import functools
import re

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
