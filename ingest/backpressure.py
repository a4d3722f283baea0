"""Backpressure: how long this process takes to answer a batch, and what its agents are told.

Every stored request's server time (from its body's arrival on the event loop, `ingest.door`, to
its answer: the wait for its group's commit, and the work) feeds a moving
average over about TAU_S. While it stays under TARGET_S, a reply carries the protocol's usual fields. Past
it, every reply carries `flush_interval_s`: the agent's flush interval doubled once for every
doubling of the average past the target (0.5 s x 2^k, at most MAX_INTERVAL_S), so the job sends
fewer, larger batches (the server's cost is per request) and ranks of a node, flushing at
multiples of the interval on their shared clock, still reach their relay together. When the
average falls back, the field goes away and agents return to their own interval.

The target is the agents' own flush interval: an agent sends one request at a time, so a server
that answers within the interval holds no agent back, and asking for a longer one only holds each
step's report back by that much. (At a quarter of it, a 100,000-rank job's bursts, answered in a
few tenths of a second, asked the agents for 2-8 s intervals; the steps' lateness with either
target stayed within the spread of the runs, docs/scale-out.md.)

A request that already waited SHED_AFTER_S in the server (queued for its group commit) is answered 503 without being stored, with Retry-After: its agent
keeps the batch in its spool and resends it, where waiting longer would have run into the
agent's 10 s timeout (`agents.transport.HTTP_TIMEOUT`) with the batch perhaps stored anyway.
While the oldest waiting request is past that point, a new one is refused the same way on the
event loop at once, its body unread (`ingest.door`). 429s and these 503s
carry Retry-After of the current interval.
"""

from __future__ import annotations

import math
import threading
import time

import msgspec

BASE_INTERVAL_S = 0.5  # the agent's default LOCKSTEP_FLUSH_INTERVAL
TARGET_S = BASE_INTERVAL_S
TAU_S = 2.0
MAX_INTERVAL_S = 16.0
SHED_AFTER_S = 4.0


class _Load:
    """The moving average of server time per request, decayed by the time between observations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.average = 0.0
        self.at = time.monotonic()

    def observe(self, seconds: float) -> None:
        with self.lock:
            now = time.monotonic()
            weight = 1.0 - math.exp(-max(now - self.at, 1e-4) / TAU_S)
            self.average += (seconds - self.average) * weight
            self.at = now

    def current(self) -> float:
        """The average, decayed towards zero for the time nothing was observed (an idle process is not loaded)."""
        with self.lock:
            return self.average * math.exp(-(time.monotonic() - self.at) / TAU_S)


_load = _Load()


def observe(seconds: float) -> None:
    _load.observe(seconds)


def flush_interval() -> float | msgspec.UnsetType:
    """What the replies say now: UNSET while the process keeps up."""
    load = _load.current()
    if load <= TARGET_S:
        return msgspec.UNSET
    return min(MAX_INTERVAL_S, BASE_INTERVAL_S * 2.0 ** math.ceil(math.log2(load / TARGET_S)))


def retry_after() -> int:
    """Seconds for Retry-After on a 429 or a shed 503: the current interval, at least 1."""
    interval = flush_interval()
    return max(1, math.ceil(interval)) if interval is not msgspec.UNSET else 1
