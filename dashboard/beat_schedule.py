"""Celery beat's schedule file, in a folder that may not exist yet (the data folder on a first start,
or LOCKSTEP_BEAT_SCHEDULE's): beat makes it as it opens the file, so importing the settings makes nothing."""

from pathlib import Path

from celery.beat import PersistentScheduler


class Scheduler(PersistentScheduler):
    """Celery's file-backed scheduler that makes its file's folder first."""

    schedule_filename: str  # set by PersistentScheduler.__init__; celery's stubs leave it out

    def setup_schedule(self) -> None:
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()
