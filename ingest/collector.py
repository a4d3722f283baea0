"""The garbage collector's young generation, sized by this process's ingest load.

Under load the collector took about 13% of an ingest process's CPU (perf: gc_collect_main,
visit_decref, visit_reachable): a queued batch holds a few dozen objects, so the ingest queue's
swings set off a young collection every 700 allocations, and their survivors older ones. A young
generation of 20,000 objects makes them rare (bench/ingest_cadence.py through relays: about -11%
server CPU per request, +12% requests/s).

Only while loaded: Django's connection wrappers hold reference cycles, and a wrapper left behind by a
finished request context closes its PostgreSQL connection only when the collector frees it. A
process that allocates little (pages, websockets) with a young generation of 20,000 collected so
rarely that those wrappers piled up until PostgreSQL refused clients. A loaded ingest process
allocates 20,000 objects many times a second, so its collections stay frequent; an idle one has
Python's thresholds back.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

IDLE_YOUNG = gc.get_threshold()[0]  # Python's (700)
LOADED_YOUNG = 20_000
IDLE_AFTER_S = 2.0  # no large group for this long: the process is idle again


def _young(objects: int) -> None:
    threshold = gc.get_threshold()
    if threshold[0] != objects:
        gc.set_threshold(objects, *threshold[1:])


@dataclass
class YoungGeneration:
    """The young generation of one process, large from its first large group until IDLE_AFTER_S
    without one (a timer on the loop restores it, so a process that falls idle does not keep it).
    `on_idle` runs on the loop when the process falls idle (the writer gives its connection back)."""

    on_idle: Callable[[], None] | None = None
    loaded: bool = False
    until: float = 0.0

    def busy(self) -> None:
        """A large group was formed: load, for IDLE_AFTER_S at least (on the event loop)."""
        self.until = time.monotonic() + IDLE_AFTER_S
        if not self.loaded:
            self.loaded = True
            _young(LOADED_YOUNG)
            asyncio.get_running_loop().call_later(IDLE_AFTER_S, self._check)

    def _check(self) -> None:
        left = self.until - time.monotonic()
        if left > 0:
            asyncio.get_running_loop().call_later(left, self._check)
        else:
            self.idle()
            if self.on_idle is not None:
                self.on_idle()

    def idle(self) -> None:
        """Python's young generation again. The timer calls it; so does a caller whose loop runs only
        while it is called (a test client's), where the timer would never fire and the large young
        generation would stay for the rest of the process."""
        self.loaded = False
        _young(IDLE_YOUNG)
