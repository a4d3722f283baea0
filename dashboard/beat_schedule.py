"""Celery beat as the workers run it (`worker -B` on every worker, docs/operating.md), so no one beat
process is a single point of failure for the sweeps:

* `Scheduler` keeps its schedule file in a folder that may not exist yet (the data folder on a first
  start, or LOCKSTEP_BEAT_SCHEDULE's; importing the settings makes nothing), and sends a due entry
  only if no other worker's beat sent it in the same period (a claim in Redis, on Redis's clock).
* `BeatKeeper` starts a new beat in a worker whose beat process died (killed, OOM): Celery's prefork
  pool replaces its dead children, never its beat, and every sweep would stop without a word."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import redis
from celery import bootsteps
from celery.beat import PersistentScheduler, ScheduleEntry
from celery.schedules import schedule
from celery.worker.components import Beat

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0  # how soon a worker notices its beat died


class Scheduler(PersistentScheduler):
    """Celery's file-backed scheduler that makes its file's folder first and claims each period of an
    entry before sending it."""

    schedule_filename: str  # set by PersistentScheduler.__init__; celery's stubs leave it out
    _claims: redis.Redis | None = None

    def setup_schedule(self) -> None:
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Send a due entry once per period over all the workers' beats: the first claim wins, the others
        skip it (the sweeps are idempotent, so a lost claim costs nothing but a duplicate is work twice)."""
        if self.claim(entry):
            super().apply_entry(entry, producer=producer)

    def claim(self, entry: ScheduleEntry) -> bool:
        """Whether this beat is the first to send `entry` in the current period of Redis's clock (one
        clock for every host). With Redis unreachable it sends anyway: the send fails just as loudly."""
        if not isinstance(entry.schedule, schedule):  # a crontab: no fixed period to claim, every beat sends it
            return True
        period = entry.schedule.seconds
        try:
            client = self._client()
            seconds, micros = client.time()
            slot = int((seconds + micros / 1e6) // period)
            key = f"lockstep:beat:{entry.name}:{slot}"
            return bool(client.set(key, 1, nx=True, ex=math.ceil(2 * period)))
        except redis.RedisError:
            log.warning("beat could not claim %s; sending it unclaimed", entry.name, exc_info=True)
            return True

    def _client(self) -> redis.Redis:
        """Made in the beat's own process (it starts by closing the file descriptors it inherited)."""
        if self._claims is None:
            url = str(self.app.conf.broker_url)
            self._claims = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        return self._claims


class BeatKeeper(bootsteps.StartStopStep):
    """In a worker started with `-B`: every CHECK_EVERY_S its main process looks at its beat and starts
    another if it died (logged, with both pids)."""

    requires = (Beat, "celery.worker.components:Timer")

    def __init__(self, parent: Any, beat: bool = False, **kwargs: Any) -> None:
        self.enabled = bool(beat)
        self.check: Any = None
        super().__init__(parent, beat=beat, **kwargs)

    def start(self, parent: Any) -> None:
        log.info("beat runs as pid %s", parent.beat.pid)
        self.check = parent.timer.call_repeatedly(CHECK_EVERY_S, self.revive, (parent,))

    def revive(self, worker: Any) -> None:
        """Start a new beat in place of a dead one; the Beat step stops the new one at shutdown."""
        dead = worker.beat
        if dead.is_alive():
            return
        step = worker.blueprint.steps[Beat.name]
        step.obj = step.create(worker)  # also sets worker.beat
        step.obj.start()
        log.error(
            "beat (pid %s) died with exit code %s; a new beat runs as pid %s", dead.pid, dead.exitcode, step.obj.pid
        )

    def stop(self, parent: Any) -> None:
        if self.check is not None:
            self.check.cancel()
            self.check = None

    terminate = stop
