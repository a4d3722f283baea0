"""Compile capture through torch's structured trace log (docs/design.md, What the agent captures).

There is no public subscription API: `torch._logging._internal.trace_log` ("torch.__trace")
is the seam. `trace_structured` builds metadata and payloads only when that logger has
handlers, so attaching our handler turns the stream on; it writes no TORCH_TRACE files.
Artifacts are accumulated per compile id (frame_id, frame_compile_id) and folded into one
`protocol.Compile` event when `compilation_metrics` arrives.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import linecache
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agents import normalize, protocol
from agents.graph_texts import GraphTexts
from agents.normalize import normalized

Meta = dict[str, Any]  # one trace record's metadata: JSON as torch wrote it
CompileId = tuple[Any, ...]  # (compiled-autograd id, frame id, frame compile id), as the trace spells them
_TIME_KEYS = (
    "entire_frame_compile_time_s",
    "backend_compile_time_s",
    "inductor_compile_time_s",
    "code_gen_time_s",
    "dynamo_time_before_restart_s",
)
_COUNT_KEYS = (
    "graph_op_count",
    "graph_node_count",
    "graph_input_count",
    "guard_count",
    "shape_env_guard_count",
    "cache_size",
    "accumulated_cache_size",
    "num_triton_bundles",
)
# Autotuning and Triton build times, where torch reports them (microseconds; sent in seconds).
_MICROSECOND_KEYS = {
    "compile_time_autotune_time_us": "autotune_time_s",
    "runtime_triton_autotune_time_us": "runtime_autotune_time_s",
    "triton_compile_time_us": "triton_compile_time_s",
}
_CACHE_ARTIFACTS = {
    "fx_graph_cache_hit": ("inductor", "hit"),
    "fx_graph_cache_miss": ("inductor", "miss"),
    "fx_graph_cache_bypass": ("inductor", "bypass"),
    "aotautograd_cache_hit": ("aotautograd", "hit"),
    "aotautograd_cache_miss": ("aotautograd", "miss"),
    "aotautograd_cache_bypass": ("aotautograd", "bypass"),
}
_suppress = threading.local()


@contextlib.contextmanager
def suppressed() -> Iterator[None]:
    """Compiles started inside this block (the agent's own kernels) are never reported."""
    prev = getattr(_suppress, "on", False)
    _suppress.on = True
    try:
        yield
    finally:
        _suppress.on = prev


def frame_key(filename: str, firstlineno: int | None, name: str, root: str | None = None) -> str:
    """'path:firstlineno:co_name' with the path made the same on every rank, host and install
    (`agents.normalize.frame_key`)."""
    return normalize.frame_key(filename, firstlineno, name, root)


def _is_user(filename: str) -> bool:
    return normalize.library_path(filename) is None and not normalize.is_agent_file(filename)


@dataclass
class _Pending:
    """Artifacts seen so far for one compile id."""

    dynamo: list[str] = field(default_factory=list)
    inductor: list[str] = field(default_factory=list)
    collectives: list[str] = field(default_factory=list)
    cache: dict[str, list[str]] = field(default_factory=dict)
    cache_keys: dict[str, list[str]] = field(default_factory=dict)
    breaks: list[str] = field(default_factory=list)
    recompile_reason: str | None = None


@dataclass(frozen=True)
class Compiling:
    """A compile in progress (from `dynamo_start` to `compilation_metrics`), for the progress sampler."""

    frame: str
    compile_id: str
    reason: str
    started: float  # time.monotonic()
    thread: int  # threading.get_ident() of the compiling thread


def _join(values: list[str]) -> str:
    return ",".join(values)[:512]


class CompileCapture(logging.Handler):
    """logging.Handler that turns trace records into Compile / GraphBreak events."""

    def __init__(
        self,
        emit: Callable[[protocol.Event], None],
        step: Callable[[], int | None],
        literals: tuple[str, ...] = (),
        texts: GraphTexts | None = None,
    ) -> None:
        super().__init__(level=logging.DEBUG)
        self._emit = emit
        self.texts = texts if texts is not None else GraphTexts()  # the normalized texts, for want_blobs
        self._step = step
        self._literals = literals
        self._pending: dict[CompileId, _Pending] = {}
        self._index: dict[str, int] = {}
        self._frames: dict[str, str] = {}  # compile_id -> frame of the compiles reported
        self._frame_ids: dict[str, str] = {}  # Dynamo frame id ("3" of "3/0") -> frame
        self._compiling: dict[CompileId, Compiling] = {}
        self._strings: dict[int, str] = {}  # torch's interned file names (trace "str" records)
        self._root: str | None = None  # directory of the running script, as the first compile's stack names it
        self._lock = threading.Lock()
        self.now: Callable[[], float] = time.time  # event timestamps (replay uses the trace's own)

    # logging.Handler API -------------------------------------------------------------
    def emit(self, record: logging.LogRecord) -> None:
        try:
            if getattr(_suppress, "on", False):
                return
            meta = getattr(record, "metadata", None)
            if isinstance(meta, dict) and meta:
                with self._lock:
                    self._handle(meta, getattr(record, "payload", None))
        except Exception:  # never raise into torch's compile path
            pass

    def handle(self, record: logging.LogRecord) -> bool:  # skip formatting/locking of base class
        self.emit(record)
        return True

    def feed(self, meta: Meta, payload: str | None) -> None:
        """One trace record given as (metadata, payload): what `replay` reads from TORCH_TRACE files."""
        if isinstance(meta, dict) and meta:
            with self._lock:
                self._handle(meta, payload)

    # record routing ----------------------------------------------------------------
    def _handle(self, meta: Meta, payload: str | None) -> None:
        kind = next(iter(meta))
        cid = (meta.get("compiled_autograd_id"), meta.get("frame_id"), meta.get("frame_compile_id"))
        if kind == "compilation_metrics":
            self._finish(cid, meta[kind] or {})
            return
        if kind == "compilation_metrics_runtime":
            self._runtime(meta[kind] or {})
            return
        if kind == "str":
            self._intern(meta[kind])
            return
        if cid[1] is None:
            return
        pend = self._pending.setdefault(cid, _Pending())
        if kind == "dynamo_start":
            self._start(cid, meta[kind] or {}, pend)
        if kind == "dynamo_output_graph" and payload is not None:
            pend.dynamo.append(payload)
        elif kind == "inductor_output_code" and payload is not None:
            pend.inductor.append(payload)
        elif kind == "artifact":
            self._artifact(pend, (meta[kind] or {}).get("name", ""), payload)

    def compiling(self, thread: int) -> Compiling | None:
        """The outermost compile running on `thread` now, if any (read from the sampler's thread)."""
        running = [c for c in list(self._compiling.values()) if c.thread == thread]
        return min(running, key=lambda c: c.started, default=None)

    def _intern(self, entry: object) -> None:
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str):
            self._strings[int(entry[1])] = entry[0]

    def _filename(self, value: object) -> str:
        """Stack entries name files by torch's intern id; the table is torch's where we missed a record."""
        if not isinstance(value, int):
            return str(value or "")
        if value not in self._strings:
            try:
                from torch._logging import structured

                self._strings.update({i: s for s, i in structured.INTERN_TABLE.items()})
            except Exception:
                pass
        return self._strings.get(value, "")

    def _start(self, cid: CompileId, m: Meta, pend: _Pending) -> None:
        """`dynamo_start`: the frame being compiled is the last entry of the stack torch logs."""
        stack = [
            (self._filename(e.get("filename")), e.get("line"), str(e.get("name") or ""))
            for e in (m.get("stack") or [{}])
            if isinstance(e, dict)
        ] or [("", None, "")]
        if normalize.is_agent_file(stack[-1][0]):
            return
        compile_id = _compile_id(cid)
        frame = self._frame_ids.get(compile_id.rsplit("/", 1)[0]) or self._frame_name(stack)
        self._frame_ids[compile_id.rsplit("/", 1)[0]] = frame
        reason = _reason_text(pend.recompile_reason) if pend.recompile_reason else "first compile"
        self._compiling[cid] = Compiling(
            frame[:512], compile_id, reason[:16_384], time.monotonic(), threading.get_ident()
        )
        self._emit(
            protocol.CompileStart(
                ts=self.now(), frame=frame[:512], compile_id=compile_id, reason=reason[:16_384], step=self._step()
            )
        )

    def _frame_name(self, stack: list[tuple[str, int | None, str]]) -> str:
        """The frame's key from the stack (outermost first): the compiled function itself, or, for
        Dynamo's wrapper around a module (`torch.compile(model)`), the user's call site; user paths
        are taken relative to the running script's directory."""
        if self._root is None:
            scripts = [f for f, _, name in stack if name == "<module>" and _is_user(f)]
            self._root = scripts[-1].replace("\\", "/").rpartition("/")[0] if scripts else ""
        filename, line, name = stack[-1]
        path = normalize.frame_path(filename, self._root)
        if normalize.is_wrapper(path):
            caller = next((e for e in reversed(stack[:-1]) if _is_user(e[0])), None)
            if caller is not None:
                filename, line, name = caller
        elif normalize.is_library_wrapper(path):
            caller = self._entered_from(stack[:-1])
            if caller is not None:
                filename, line, name = caller[0], caller[1], f"{caller[2]} via {normalize.via(path, name)}"
        elif _is_user(filename) and isinstance(line, int):
            name = qualname(filename, line, name)
        return frame_key(filename, line, name, self._root)[:512]

    def _entered_from(self, stack: list[tuple[str, int | None, str]]) -> tuple[str, int | None, str] | None:
        """The innermost frame outside torch, contextlib and the agent: the user's line that entered a
        wrapper frame (e.g. `loss = model(x)` for DDP's context managers under torch.compile(DDP(model)))."""
        for filename, line, name in reversed(stack):
            path = normalize.frame_path(filename, self._root)
            if not (normalize.is_library_wrapper(path) or path.startswith("<") or normalize.is_agent_file(filename)):
                return filename, line, name
        return None

    def _artifact(self, pend: _Pending, name: str, payload: str | None) -> None:
        if name == "dynamo_graph_break_reason" and payload and payload not in pend.breaks:
            pend.breaks.append(payload)
        elif name == "recompile_reasons" and payload:
            pend.recompile_reason = payload.strip()
        elif name == "inductor_collective_schedule" and payload:
            pend.collectives.append(payload)
        elif name in _CACHE_ARTIFACTS:
            stage, outcome = _CACHE_ARTIFACTS[name]
            pend.cache.setdefault(stage, []).append(outcome)
            try:
                key = json.loads(payload or "{}").get("key")
            except (ValueError, AttributeError):
                key = None
            if key:
                pend.cache_keys.setdefault(stage, []).append(str(key))

    # event building ----------------------------------------------------------------
    def _finish(self, cid: CompileId, m: Meta) -> None:
        pend = self._pending.pop(cid, _Pending())
        self._compiling.pop(cid, None)
        filename = m.get("co_filename") or ""
        if normalize.is_agent_file(filename):
            return
        frame = self._frame(m, filename)
        index = self._index.get(frame, 0)
        self._index[frame] = index + 1
        step = self._step()
        now = self.now()
        for reason in pend.breaks:
            self._emit(protocol.GraphBreak(ts=now, frame=frame, reason=reason[:16_384], step=step))
        event = self._compile_event(m, pend, frame, index, step, now)
        if event.compile_id:
            self._frames[event.compile_id] = frame
        self._emit(event)

    def _frame(self, m: Meta, filename: str) -> str:
        """The key `dynamo_start` gave this Dynamo frame id ("3/8" -> "3"), so every compile of one
        code object, including one that hit the recompile limit and names no code, has one key."""
        frame_id = str(m.get("compile_id") or "").rsplit("/", 1)[0]
        if frame_id in self._frame_ids:
            return self._frame_ids[frame_id]
        if filename or m.get("co_name"):
            stack = [_stack_entry(e) for e in m.get("stack_trace") or [] if isinstance(e, str)]
            frame = self._frame_name(
                [e for e in stack if e] + [(filename, m.get("co_firstlineno"), m.get("co_name") or "")]
            )
            if frame_id:
                self._frame_ids[frame_id] = frame
            return frame
        return frame_key("", None, "")

    def _runtime(self, m: Meta) -> None:
        """Runtime autotuning of a compile already reported (the agent's own compiles never are)."""
        compile_id = str(m.get("compile_id") or "")
        times = _times(m)
        if compile_id in self._frames and times:
            self._emit(
                protocol.CompileRuntime(
                    ts=self.now(), frame=self._frames[compile_id], compile_id=compile_id[:512], times=times
                )
            )

    def _hashes(self, pend: _Pending) -> dict[str, protocol.GraphHash]:
        hashes = {}
        for name, texts in (
            ("dynamo", pend.dynamo[-1:]),
            ("inductor", pend.inductor),
            ("collectives", pend.collectives),
        ):
            if texts:
                hashes[name], text = normalized("\n".join(texts), self._literals)
                self.texts.keep(hashes[name].norm, text)
        return hashes

    def _compile_event(
        self, m: Meta, pend: _Pending, frame: str, index: int, step: int | None, now: float
    ) -> protocol.Compile:
        fail_type = m.get("fail_type")
        reason = m.get("recompile_reason") or pend.recompile_reason
        status = "ok"
        if fail_type:
            # Dynamo runs the frame eagerly when errors are suppressed or a recompile/cache limit
            # was hit; otherwise the failure reached the user.
            limit = "limit" in str(fail_type).lower() or "limit" in str(m.get("fail_reason") or "").lower()
            status = "eager" if limit or m.get("config_suppress_errors") else "failed"
        breaks = m.get("num_graph_breaks")
        return protocol.Compile(
            ts=now,
            frame=frame[:512],
            index=index,
            compile_id=str(m.get("compile_id") or "")[:512],
            step=step,
            status=status,
            fail_type=str(fail_type)[:512] if fail_type else None,
            fail_reason=str(m.get("fail_reason"))[:16_384] if m.get("fail_reason") else None,
            recompile_reason=str(reason)[:16_384] if reason else None,
            times=_times(m),
            counts={
                **{k: int(m[k]) for k in _COUNT_KEYS if isinstance(m.get(k), int) and m[k] >= 0},
                **({"kernel_count": _kernels(pend.inductor)} if pend.inductor else {}),
            },
            hashes=self._hashes(pend),
            cache={k: _join(v) for k, v in pend.cache.items()},
            cache_keys={k: _join(v) for k, v in pend.cache_keys.items()},
            graph_breaks=breaks if isinstance(breaks, int) and breaks >= 0 else len(pend.breaks),
        )


@functools.lru_cache(maxsize=256)
def _definitions(filename: str) -> dict[tuple[int, str], str]:
    """(first line, name) -> qualified name of every function in a source file ({} if unreadable)."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return {}
    found: dict[tuple[int, str], str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = prefix + child.name
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                if not isinstance(child, ast.ClassDef):
                    found[(first, child.name)] = found[(child.lineno, child.name)] = qual
                visit(child, qual + (".<locals>." if not isinstance(child, ast.ClassDef) else "."))

    visit(tree, "")
    return found


def qualname(filename: str, firstlineno: int, name: str) -> str:
    """`Block.forward` for a method (the code object's name is just `forward`), read from the source
    file the way a traceback reads it; the bare name when the file cannot be read."""
    return _definitions(filename).get((firstlineno, name), name)


_KERNEL = re.compile(r"\basync_compile\.(?!wait\b)[a-z_]+\(")


def _kernels(codes: list[str]) -> int:
    """Kernels in Inductor's output code (each is compiled by one `async_compile.<backend>(` call)."""
    return sum(len(_KERNEL.findall(code)) for code in codes)


_STACK_LINE = re.compile(r"^Line: (\d+), Name: (.*), Filename: (.*)$")


def _stack_entry(text: str) -> tuple[str, int, str] | None:
    """One `compilation_metrics.stack_trace` entry: 'Line: 33, Name: main, Filename: /x/train.py'."""
    m = _STACK_LINE.match(text)
    return (m.group(3), int(m.group(1)), m.group(2)) if m else None


def _compile_id(cid: CompileId) -> str:
    """'frame_id/frame_compile_id' as `compilation_metrics` spells it ('!autograd_id/...' under compiled autograd)."""
    autograd, frame_id, attempt = cid
    text = f"{frame_id}/{attempt}"
    return (f"!{autograd}/" + text if autograd is not None else text)[:64]


def _reason_text(payload: str) -> str:
    """The `recompile_reasons` artifact is JSON: one reason, or a list of them."""
    try:
        value = json.loads(payload)
    except ValueError:
        return payload
    return "; ".join(map(str, value)) if isinstance(value, list) else str(value)


def _times(m: Meta) -> dict[str, float]:
    """Phase times in seconds; keys a torch version lacks are simply absent."""
    times = {k: float(m[k]) for k in _TIME_KEYS if isinstance(m.get(k), (int, float)) and m[k] >= 0}
    for key, name in _MICROSECOND_KEYS.items():
        if isinstance(m.get(key), (int, float)) and m[key] >= 0:
            times[name] = m[key] / 1e6
    return times


def install(handler: CompileCapture) -> None:
    """Attach to the trace logger (DEBUG); torch's own handlers and files are left as they are."""
    from torch._logging._internal import trace_log

    trace_log.setLevel(logging.DEBUG)
    if handler not in trace_log.handlers:
        trace_log.addHandler(handler)


def uninstall(handler: CompileCapture) -> None:
    if "torch._logging._internal" in sys.modules:
        sys.modules["torch._logging._internal"].trace_log.removeHandler(handler)
