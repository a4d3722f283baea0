"""The progress sampler and compile_start, on real compiles and a real DataLoader in this process."""

import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

from agents import protocol
from agents.capture import CompileCapture, install, suppressed, uninstall
from agents.progress import Sampler, classify


def scale(x):
    return (x * 2).relu() + 1


def _until(predicate, timeout: float = 60.0, every: float = 0.005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not reached")


def test_compile_start_names_frame_and_reason_before_the_compile_ends():
    events: list = []
    handler = CompileCapture(events.append, lambda: 3)
    torch._dynamo.reset()
    install(handler)
    try:
        compiled = torch.compile(scale, dynamic=False)
        compiled(torch.randn(4, 3))
        compiled(torch.randn(5, 3))
        with suppressed():
            torch.compile(lambda x: x - 1)(torch.randn(2))
    finally:
        uninstall(handler)
    kinds = [
        (type(e).__name__, getattr(e, "compile_id", ""))
        for e in events
        if isinstance(e, (protocol.CompileStart, protocol.Compile)) and e.frame.endswith(":scale")
    ]
    assert kinds == [("CompileStart", "0/0"), ("Compile", "0/0"), ("CompileStart", "0/1"), ("Compile", "0/1")]
    starts = [e for e in events if isinstance(e, protocol.CompileStart)]
    assert len(starts) == 2 and all(
        e.frame.endswith(f"test_progress.py:{scale.__code__.co_firstlineno}:scale") and e.step == 3 for e in starts
    )
    assert starts[0].reason == "first compile"
    assert "size" in starts[1].reason and "4" in starts[1].reason  # the failed guard on dim 0
    assert handler.compiling(threading.get_ident()) is None  # finished compiles are forgotten


def test_sampler_sees_a_compile_in_progress_from_another_thread():
    handler = CompileCapture(lambda e: None, lambda: 0)
    torch._dynamo.reset()
    install(handler)
    done = threading.Event()

    def train():
        torch.compile(scale, dynamic=False)(torch.randn(64, 8))
        done.set()

    worker = threading.Thread(target=train)
    try:
        worker.start()
        sampler = Sampler(handler, lambda: 0, 0.5, thread=worker.ident)
        seen = _until(lambda: (e := sampler.event()) is not None and e.phase == "compiling" and e)
        worker.join(120)
    finally:
        uninstall(handler)
    assert done.is_set()
    assert seen.op.endswith(":scale") and seen.compile_id == "0/0" and seen.reason == "first compile"
    assert seen.where.endswith(":train")  # the user frame that called the compiled function


class Blocking(Dataset):
    """Item 2 waits for `release`: a data loader that stalls for real (a stuck read)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.waiting = threading.Event()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 2:
            self.waiting.set()
            self.release.wait(60)
        return torch.ones(2)


def test_sampler_names_a_stuck_data_loader_and_times_it():
    data = Blocking()
    step = {"n": 0}
    go = threading.Event()

    def train():
        go.wait(30)
        for _ in DataLoader(data, batch_size=1):
            step["n"] += 1

    worker = threading.Thread(target=train)
    worker.start()
    try:
        sampler = Sampler(None, lambda: step["n"], 0.5, thread=worker.ident)
        assert sampler.event().since_step_s is None  # no step ended yet
        go.set()
        _until(lambda: step["n"] == 2 and sampler.event())  # the sampler sees the steps move
        data.waiting.wait(30)
        first = _until(lambda: (e := sampler.event()) is not None and e.phase == "data" and e)
        time.sleep(0.6)
        later = sampler.event()
    finally:
        data.release.set()
        worker.join(30)
    assert first.step == 2 and later.step == 2
    assert later.phase == "data" and later.op == "__next__"
    assert later.where.endswith(":__getitem__") and "test_progress.py" in later.where
    assert later.phase_s >= first.phase_s + 0.5
    assert later.since_step_s is not None and later.since_step_s >= 0.5
    gone = Sampler(None, lambda: 0, 0.5, thread=worker.ident)
    assert gone.event() is None


def test_sampler_thread_runs_and_stops():
    sampler = Sampler(None, lambda: 1, 0.01).start()
    try:
        event = sampler.event()
    finally:
        sampler.stop()
    assert event.phase == "step" and event.step == 1
    assert "test_progress.py" in event.where


def test_a_stuck_thread_is_news_at_every_flush_and_once_after_it_moves_on():
    """Between heartbeats the sender sends a sample only while the thread is stuck, then one more
    when it is released: the server never carries a wait forward past its end."""
    step = {"n": 0}
    first, second = threading.Event(), threading.Event()

    def train():
        first.wait(30)
        step["n"] = 1
        second.wait(30)

    worker = threading.Thread(target=train)
    worker.start()
    try:
        sampler = Sampler(None, lambda: step["n"], 0.05, thread=worker.ident, stuck_after=0.3)
        assert sampler.to_send(heartbeat=False) is None  # a fresh phase waits for the heartbeat
        assert sampler.to_send(heartbeat=True).step == 0
        time.sleep(0.35)
        stuck = [sampler.to_send(heartbeat=False) for _ in range(2)]
        first.set()
        _until(lambda: step["n"] == 1)
        released = sampler.to_send(heartbeat=False)
        after = sampler.to_send(heartbeat=False)
    finally:
        first.set()
        second.set()
        worker.join(30)
    assert all(s is not None and s.phase_s >= 0.3 and s.step == 0 for s in stuck)
    assert released is not None and released.step == 1 and released.phase_s < 0.3
    assert after is None


LIBRARY = "/venv/lib/python3.11/site-packages/somelib/hooks.py"


def _installed(source: str, name: str):
    """A function whose code says it lives in an installed package (LIBRARY)."""
    scope: dict = {}
    exec(compile(source, LIBRARY, "exec"), scope)
    return scope[name]


def test_where_is_the_jobs_own_line_not_an_installed_packages_inside_it():
    """A gc callback of an installed package ran on the training thread mid-compile once and was named
    as the job's line: a package's frame names it only when the job has no frame of its own."""
    callback = _installed("def callback(classify):\n    return classify(__import__('sys')._getframe())\n", "callback")

    def train():
        return callback(classify)

    assert train().user.endswith(":train")

    seen: list = []
    alone = _installed(
        "def alone(classify, seen):\n    seen.append(classify(__import__('sys')._getframe()))\n", "alone"
    )
    thread = threading.Thread(target=alone, args=(classify, seen))  # only the package's and the stdlib's frames
    thread.start()
    thread.join(10)
    assert seen[0].user.endswith("hooks.py:2:alone"), seen
