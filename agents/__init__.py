"""Lockstep per-rank agent: `agent = agents.attach()` ... `agent.close()` (docs/design.md, The agent).

Attaching installs a trace-log handler (compile events), a global optimizer step pre-hook
(gradient fingerprints) and a background sender; all of it is best-effort and never raises
into the training code.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Unpack

if TYPE_CHECKING:  # torch is imported lazily: the server imports agents.protocol without torch
    import torch

    from agents import crash, protocol
    from agents.config import Config, Overrides

__all__ = ["attach", "fingerprint", "Agent", "NoopAgent"]

log = logging.getLogger("lockstep.agent")
_lock = threading.RLock()
_agent: Agent | NoopAgent | None = None


def fingerprint(tensor: torch.Tensor) -> int:
    """Public 64-bit fingerprint of the exact bits of `tensor` (the algorithm: agents.fingerprinting).

    Defined here rather than imported, so that `import agents` does not import torch."""
    from agents import fingerprinting

    return fingerprinting.fingerprint(tensor)


class NoopAgent:
    """Same interface as Agent, does nothing (LOCKSTEP_DISABLE=1)."""

    enabled = False

    def step(self, n: int) -> None:
        pass

    def log(self, loss: float | torch.Tensor | None = None, step: int | None = None) -> None:
        pass

    def mark_crash(self, exc: BaseException, exit_code: int = 1) -> None:
        pass

    def close(
        self, timeout: float = 10, status: str = "ok", exit_code: int | None = None, reason: str | None = None
    ) -> None:
        pass


class Agent:
    """One per process: owns capture, gradient tracking and transport."""

    enabled = True

    def __init__(self, cfg: Config) -> None:
        from agents.capture import CompileCapture, install
        from agents.grads import GradTracker
        from agents.graph_texts import GraphTexts
        from agents.links import Links, lockstep_run_url
        from agents.peers import Peers
        from agents.progress import Sampler
        from agents.transport import Transport

        self.cfg = cfg
        self._closed = False
        self._ended = False
        self._end: tuple[str, int | None, str | None] = ("ok", None, None)
        self._crash: crash.Crash | None = None
        self.grads = GradTracker(self._emit, cfg.grad_every, cfg.param_every, on_layout=self._layout_known)
        self.links = Links(lockstep_run_url(cfg.page_url, cfg.run))
        start = self._rank_start()  # before the sender starts, so rank_start is the first event
        texts = GraphTexts()  # filled by the capture, asked for by the server through the transport
        self.capture = CompileCapture(self._emit, lambda: self.grads.step, texts=texts)
        self.progress = (
            Sampler(self.capture, lambda: self.grads.step, cfg.progress_every) if cfg.progress_every else None
        )
        self._peers = Peers.of_launch(cfg.rank)
        self.transport = Transport(
            cfg,
            on_detail=self._details,
            step=lambda: self.grads.step,
            on_blobs=texts.bodies,
            progress=self.progress.to_send if self.progress else None,
            on_flight_recorder=self._flight_record if cfg.flight_recorder else None,
            on_weights=self.grads.weights_at,
            peers_gone=self._at_flush,
        )
        try:
            self._emit(start)
            install(self.capture)
            self.grads.install()
            if self.progress:
                self.progress.start()
        except BaseException:
            self.transport.close(0)
            raise

    @property
    def session(self) -> str:
        return self.transport.session

    def _emit(self, event: protocol.Event) -> None:
        if not self._ended:
            self.transport.put(event)

    def _at_flush(self) -> list[protocol.Event]:
        """What the sender looks for at every flush and as it closes: the fingerprints whose copies
        landed (read here, off the training step: turning words into events is the agent's largest
        Python cost per step), ranks of this node that vanished, and what the agent could not
        capture (a compiled optimizer step)."""
        try:
            self.grads.drain(block=False)
        except Exception as e:  # a fingerprint that cannot be read must not stop the watch of the peers
            log.debug("lockstep: fingerprints not read at this flush: %s", e)
        gone = self._peers.gone() if self._peers else []
        return [*gone, *self.grads.notices()]

    def _flight_record(self, session: str) -> bytes:
        from agents import flight_recorder

        return flight_recorder.body(self.cfg.run, self.cfg.rank, session)

    def _details(self, steps: list[int]) -> list[protocol.Event]:
        return [d for s in steps for d in self.grads.detail(s)]

    def _rank_start(
        self, params: list[str] | None = None, buckets: list[list[int]] | None = None
    ) -> protocol.RankStart:
        import msgspec

        from agents import environment as env
        from agents import protocol
        from agents.fingerprinting import ALGO

        return protocol.RankStart(
            ts=time.time(),
            host=socket.gethostname()[:512],
            pid=os.getpid(),
            local_rank=self.cfg.local_rank,
            device=env.device(self.grads.device),
            versions=env.versions(),
            config_hash=env.config_hash(),
            settings=env.settings(),
            env=env.filtered_env(),
            cache_dirs=(dirs := env.cache_dirs()),
            cache_fs=msgspec.convert(env.cache_locations(dirs), dict[str, protocol.CacheLocation]),
            codegen=env.codegen(),
            collective_timeout_s=env.collective_timeout_s(),
            params=params or [],
            buckets=buckets or [],
            fp_algo=ALGO,
            links=self.links.exchange(),  # the same job's W&B / MLflow runs, told this run's URL (agents/links.py)
        )

    def _layout_known(self, params: list[str], buckets: list[list[int]]) -> None:
        """rank_start again, complete: at attach (often before the model, the optimizer and the
        process group exist) the parameter layout and the collective timeout are unknown; at the
        first optimizer step both are. The server keeps the latest rank_start of a rank."""
        self._emit(self._rank_start(params, buckets))

    def step(self, n: int) -> None:
        """Declare the optimizer step in progress: the next optimizer.step() is step n."""
        self.grads.set_step(n)

    def log(self, loss: float | torch.Tensor | None = None, step: int | None = None) -> None:
        """Hand over the training loss (a number or a tensor; a device tensor is read a step later,
        never synchronizing the step): the compare page plots it across runs and measures the drift.
        `step` defaults to the step in progress (see `GradTracker.log_loss`). Never raises."""
        try:
            if loss is not None:
                self.grads.log_loss(loss, step)
        except Exception:
            pass

    def mark_end(self, status: str, exit_code: int | None = None, reason: str | None = None) -> None:
        """Remember how the process is ending; `close` reports it in rank_end."""
        self._end = (status, exit_code, reason)

    def mark_crash(self, exc: BaseException, exit_code: int = 1) -> None:
        """The process is ending with this exception: rank_end names its type, message and frame."""
        from agents.crash import describe

        self._crash = describe(exc)
        self._end = ("error", exit_code, self._crash.reason)

    def close(
        self, timeout: float = 10, status: str | None = None, exit_code: int | None = None, reason: str | None = None
    ) -> None:
        """Flush fingerprints, send rank_end last, deliver or spool everything within `timeout`.

        Re-entered from the SIGTERM handler while an exit or an exception is closing (torchrun stops
        the others right after a rank fails), it sends the rank_end the interrupted close had not
        sent yet and waits for delivery, so the process never dies with its goodbye unsent."""
        with _lock:
            if not self._closed:
                self._closed = True
                if status is not None:
                    self._end = (status, exit_code, reason)
                self._stop_capture()
            if not self._ended:
                self._ended = True
                self.transport.put(self._rank_end())
        self.transport.close(timeout)

    def _stop_capture(self) -> None:
        try:
            from agents.capture import uninstall

            uninstall(self.capture)
            if self.progress:
                self.progress.stop()
            self.grads.uninstall()
            if self._end[0] == "ok":  # a signal or an exception may have stopped a step halfway through its update
                self.grads.final_weights()
            self.grads.drain(block=True)
            for notice in self.grads.notices():
                self._emit(notice)
        except Exception:
            pass

    def _rank_end(self) -> protocol.RankEnd:
        from agents import protocol

        st, code, why = self._end
        crash = self._crash if st == "error" else None
        return protocol.RankEnd(
            ts=time.time(),
            status=st,
            exit_code=code,
            reason=why[:16_384] if why else None,
            exc_type=crash.exc_type[:512] if crash else None,
            where=crash.where[:512] if crash and crash.where else None,
        )


SIGTERM_CLOSE_S = 10.0  # torchrun, like Kubernetes, waits 30 s after its SIGTERM before SIGKILL


def _install_process_hooks(agent: Agent) -> None:
    """rank_end on exit, on uncaught exceptions and on SIGTERM; previous handlers are chained."""
    atexit.register(agent.close)
    previous_hook = sys.excepthook

    def excepthook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        agent.mark_crash(value.with_traceback(tb) if tb is not None else value)
        agent.close()
        previous_hook(tp, value, tb)

    sys.excepthook = excepthook
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        agent.close(timeout=SIGTERM_CLOSE_S, status="signal", exit_code=128 + signum, reason="SIGTERM")
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def _say_where(cfg: Config) -> None:
    """Rank 0 names its run and the run's page once, in one line on stderr (the other ranks say
    nothing): a generated key (no LOCKSTEP_RUN) is found nowhere else, and `lockstep check` needs it."""
    if cfg.rank != 0:
        return
    from agents.links import lockstep_run_url

    where = lockstep_run_url(cfg.page_url, cfg.run) or f"(offline: spooled in {cfg.spool_dir})"
    print(f"lockstep: run {cfg.run} {where}", file=sys.stderr, flush=True)


def attach(**given: Unpack[Overrides]) -> Agent | NoopAgent:
    """Start the agent for this process (idempotent: later calls return the same agent). `given`:
    url, token, run, rank, world_size, offline, spool_dir, grad_every (`agents.config.Overrides`);
    each left out comes from its environment variable."""
    global _agent
    with _lock:
        if _agent is not None:
            return _agent
        try:
            from agents.config import resolve

            cfg = resolve(**given)
            if cfg.disabled:
                _agent = NoopAgent()
                return _agent
            if cfg.flight_recorder:
                from agents.flight_recorder import enable_default

                enable_default(cfg.fr_buffer_default)  # before the job's init_process_group, or not at all
            _agent = Agent(cfg)
            _say_where(cfg)
        except Exception as e:  # a broken agent must not break training
            print(f"lockstep: agent disabled: {e!r}", file=sys.stderr)
            _agent = NoopAgent()
            return _agent
    _install_process_hooks(_agent)
    return _agent
