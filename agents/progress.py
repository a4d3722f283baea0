"""Where the training thread is, sampled from outside it (issue 15: see the hang coming).

A rank stuck in a compile, a collective or a data loader still heartbeats (the sender is another
thread), so liveness alone cannot tell the server that the others are waiting for it. This
sampler looks at the main thread's Python stack with `sys._current_frames()` (no signal, no
stopping the thread: it reads the frame objects under the GIL for a few microseconds) and keeps
how long the thread has been in its current phase; the sender sends one `progress` event per
heartbeat, and one per flush while the thread has been stuck in one phase for protocol.STUCK_S (and once
more after it moves on). So the server's view of a waiting rank is never older than a flush
interval: a wait that ended is not carried forward into a false forecast. Compiles are known exactly from the capture (`dynamo_start`), everything else from
which torch module the stack is in.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from agents import normalize, protocol
from agents.capture import CompileCapture, frame_key

_TORCH = os.sep + os.path.join("torch", "")
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
_FUNCTIONAL = os.path.join("torch", "distributed", "_functional_collectives")
_DATA = os.path.join("torch", "utils", "data", "")
_AUTOGRAD = os.path.join("torch", "autograd", "")
_STDLIB = sysconfig.get_paths().get("stdlib", "") + os.sep
_WRAPPERS = {"wrapper", "_exception_logger", "_time_logger", "inner"}  # c10d decorators around the collective
MAX_DEPTH = 256


@dataclass
class _Where:
    """One look at the stack: the phase, what it is about, and the frame that decides it."""

    phase: str
    op: str = ""
    user: str = ""  # innermost frame of user code
    anchor: int = 0  # id() of the deciding frame: the same call across samples keeps its start


def classify(frame: FrameType | None) -> _Where:
    """Phase of a stack from its innermost frame outwards: a collective or data loader anywhere in
    it wins over backward (a collective inside a backward hook is a wait), backward over the step."""
    found: dict[str, tuple[str, int]] = {}
    user = library = ""  # innermost frame of the job's own code; of an installed package, if none
    depth = 0
    while frame is not None and depth < MAX_DEPTH:
        code = frame.f_code
        path = code.co_filename
        if _C10D in path or _FUNCTIONAL in path:
            if code.co_name not in _WRAPPERS and not code.co_name.startswith("_"):
                found["collective"] = (code.co_name, id(frame))
            else:
                found.setdefault("collective", (code.co_name, id(frame)))
        elif _DATA in path:
            found["data"] = (code.co_name, id(frame))
        elif _AUTOGRAD in path:
            found.setdefault("backward", (code.co_name, id(frame)))
        elif (
            not user
            and _TORCH not in path
            and not normalize.is_agent_file(path)
            and not path.startswith((_STDLIB, "<"))
        ):
            # An installed package's frame (a trainer library, or a gc callback that ran on this thread
            # in the middle of a compile) names the job's line only when the job has none of its own.
            if normalize.library_path(path) is None:
                user = frame_key(path, frame.f_lineno, code.co_name)
            elif not library:
                library = frame_key(path, frame.f_lineno, code.co_name)
        frame = frame.f_back
        depth += 1
    user = user or library
    for phase in ("collective", "data", "backward"):
        if phase in found:
            op, anchor = found[phase]
            return _Where(phase, op, user, anchor)
    return _Where("step", "", user, 0)


class Sampler:
    """Samples the main thread every `interval` seconds in a daemon thread; `event()` is one more
    sample, taken by the sender at each heartbeat. Never raises."""

    def __init__(
        self,
        capture: CompileCapture | None,
        step: Callable[[], int | None],
        interval: float,
        thread: int | None = None,
        stuck_after: float = protocol.STUCK_S,
    ) -> None:
        self._capture = capture
        self._stuck_after = stuck_after
        self._step = step
        self._interval = interval
        self._thread = thread if thread is not None else threading.main_thread().ident or 0  # 0: no thread has it
        self._lock = threading.Lock()
        self._key: tuple[str, str, int, int | None] | None = None
        self._since = time.monotonic()
        self._step_seen: int | None = None
        self._step_at: float | None = None
        self._stop = threading.Event()
        self._sent_stuck = False
        self._worker = threading.Thread(target=self._run, name="lockstep-progress", daemon=True)

    def start(self) -> Sampler:
        self._worker.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.event()
            except Exception:
                pass

    def to_send(self, heartbeat: bool) -> protocol.Progress | None:
        """The sample the sender should send at this flush: at a heartbeat, while the thread is
        stuck, and once after it was (so the server learns the wait is over within a flush)."""
        sample = self.event()
        if sample is None:
            return None
        stuck = sample.phase_s >= self._stuck_after
        if not (heartbeat or stuck or self._sent_stuck):
            return None
        self._sent_stuck = stuck
        return sample

    def event(self) -> protocol.Progress | None:
        """Sample now; None when the main thread is gone (interpreter shutting down)."""
        with self._lock:
            now = time.monotonic()
            step = self._step()
            if step != self._step_seen:
                self._step_at = now if self._step_seen is not None else None
                self._step_seen = step
            compiling = self._capture.compiling(self._thread) if self._capture is not None else None
            frame = sys._current_frames().get(self._thread)
            if frame is None and compiling is None:
                return None
            where = classify(frame)
            del frame
            since_step = round(now - self._step_at, 3) if self._step_at is not None else None
            if compiling is not None:
                self._key = None  # after the compile, whatever the thread does starts anew
                return protocol.Progress(
                    ts=time.time(),
                    phase="compiling",
                    phase_s=round(now - compiling.started, 3),
                    step=step,
                    since_step_s=since_step,
                    where=where.user[:512],
                    op=compiling.frame[:512],
                    compile_id=compiling.compile_id[:64],
                    reason=compiling.reason[:16_384],
                )
            key = (where.phase, where.op, where.anchor, step)
            if key != self._key:
                self._key, self._since = key, now
            return protocol.Progress(
                ts=time.time(),
                phase=where.phase,
                phase_s=round(now - self._since, 3),
                step=step,
                since_step_s=since_step,
                where=where.user[:512],
                op=where.op[:512],
            )
