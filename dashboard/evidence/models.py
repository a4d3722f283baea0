"""Raw evidence, as the agents reported it: idempotency of batches, raw per-rank events, graph
texts, Flight Recorder dumps. Ingest admits it, detection and the pages read it; only this app
writes it (`writes.py`, `blobs.py`, `flight.py`, `retention.py`).

The raw per-rank tables (`RawEvent` subclasses) are PostgreSQL tables partitioned by day of
`received` (`partitions.py`): rows arrive by binary COPY and leave when retention drops a whole
partition. In the database their primary key is (id, received) and they carry no foreign key
to the run table (a per-row RI check would cost as much as the insert); Django still cascades
deletes of a run through the ORM.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.utils import timezone

from dashboard.tenancy.models import Project, Run


class IngestBatch(models.Model):
    """(session, seq) seen in a run: makes a resent batch a no-op, and a different body under it a 409.
    Scoped by run, so per project (run keys are per project): another project's agent that learns a
    session id can neither take its seqs nor have its batches dropped as duplicates."""

    session = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    digest = models.CharField(max_length=64)
    # no database constraint: PostgreSQL checked it for every inserted batch at commit (a deferred
    # trigger and a key-share lock of the run row each, 13 us of 70 per batch); deleting a run still
    # deletes its batches (Django's cascade), and ingest takes the run from the database first
    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False, db_constraint=False)  # batch_run
    rank = models.PositiveIntegerField()
    events = models.PositiveIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "seq", "run"], name="batch_once_per_run")]
        # Every batch inserts a row, so every index costs each batch; the table only grows at its end,
        # in arrival order, so BRIN (a summary per range of pages, not an entry per row) finds what
        # retention deletes by age and what a deleted run cascades to.
        indexes = [
            BrinIndex(fields=["received_at"], name="batch_received", autosummarize=True),
            BrinIndex(fields=["run"], name="batch_run", autosummarize=True),
        ]


class RawEvent(models.Model):
    """Fields every raw per-rank table has; `received` (server time) is the partition key."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, db_constraint=False, db_index=False
    )  # composite indexes lead with run
    received = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class CompileEvent(RawEvent):
    rank = models.PositiveIntegerField()
    frame = models.CharField(max_length=512)
    index = models.PositiveIntegerField()
    compile_id = models.CharField(max_length=64, blank=True)
    step = models.BigIntegerField(null=True)
    status = models.CharField(max_length=16)
    fail_type = models.TextField(null=True)
    fail_reason = models.TextField(null=True)
    recompile_reason = models.TextField(null=True)
    graph_raw = models.CharField(max_length=64, blank=True)
    graph_norm = models.CharField(max_length=64, blank=True)
    code_raw = models.CharField(max_length=64, blank=True)
    code_norm = models.CharField(max_length=64, blank=True)
    compile_time = models.FloatField(null=True)
    cache = models.JSONField(default=dict)
    detail = models.JSONField(default=dict)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "frame", "index"], name="compileevent_run_frame")]


class GraphBreakEvent(RawEvent):
    rank = models.PositiveIntegerField()
    frame = models.CharField(max_length=512)
    reason = models.TextField()
    step = models.BigIntegerField(null=True)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "frame"], name="graphbreak_run_frame")]


class GradReport(RawEvent):
    """Bucket fingerprints for one step of one comparison group (signed int64 storage), as reported by
    `ranks`: ranks whose reports arrived alike in one request share one row (`dashboard.evidence.binary_copy.grad_copy`)."""

    ranks = ArrayField(models.IntegerField())
    step = models.BigIntegerField()
    group = models.CharField(max_length=64)
    fps = ArrayField(models.BigIntegerField())
    norm = models.FloatField(null=True)
    nonfinite = models.BigIntegerField(default=0)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "step", "group"], name="gradreport_run_step")]


class StepReport(RawEvent):
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    loss = models.FloatField(null=True)
    step_time = models.FloatField(null=True)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "rank", "step"], name="stepreport_run_rank")]


class EventLog(RawEvent):
    """Events kept verbatim (detail answers, dropped counts): rare, read by key, no table of their own needed."""

    rank = models.PositiveIntegerField()
    t = models.CharField(max_length=32)
    body = models.JSONField()
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "t"], name="eventlog_run_t")]


class CollectiveWait(models.Model):
    """The longest wait in a collective a rank reported in a step, once it lasted `protocol.STUCK_S`.

    What the compile bill measures (ranks held up by a compiling peer) kept as ingest writes the
    progress samples: one small row per (rank, step) that waited that long, where the samples
    themselves are a sample per flush per waiting rank in the log, JSON bodies the bill would parse
    by the hundred thousand (a tenth of the rows and of the time at 1,024 ranks, bench/cost.py).
    Healthy steps wait far less and write nothing here. Expires with the raw rows (`retention`)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_constraint=False, db_index=False)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    seconds = models.FloatField()
    received = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "rank"], name="collectivewait_once")]
        indexes = [models.Index(fields=["received"], name="collectivewait_received")]


class Blob(models.Model):
    """A normalized graph text of one project, stored once per content hash however many of its ranks
    hold it. Per project, never shared: a project that could skip a text another project stored would
    learn that the other holds it.

    A row without text is a request in flight: `requested_at` is when one agent was asked to
    upload it (the others are not asked again until that lease expires). `run`: which run was asked
    last; the project's stored bytes count against its quotas and a run's asks against its bound
    (`blobs.py`, ingest/blobs.py).
    """

    hash = models.CharField(max_length=32)
    text = models.TextField(null=True)
    size = models.PositiveIntegerField(default=0)
    requested_at = models.DateTimeField(null=True)
    stored_at = models.DateTimeField(null=True)
    named_at = models.DateTimeField(
        null=True
    )  # last named by a compile event (refreshed hourly): pruned after retention
    project = models.ForeignKey(
        Project, null=True, on_delete=models.SET_NULL, db_constraint=False, db_index=False, related_name="+"
    )
    run = models.ForeignKey(
        Run, null=True, on_delete=models.SET_NULL, db_constraint=False, db_index=False, related_name="+"
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "hash"], name="blob_per_project")]
        indexes = [
            models.Index(fields=["project", "stored_at"], name="blob_project"),
            models.Index(fields=["run"], name="blob_run"),
        ]


class FlightRecord(models.Model):
    """One rank's Flight Recorder dump (`protocol.FRDump`, bounded by the agent and checked on arrival),
    sent when the server asked (a hang_forecast). The newest KEEP per run and rank are kept; `size`
    (the upload's bytes, inflated) counts against its project's byte quota (ingest/quotas.py)."""

    KEEP = 4

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    session = models.CharField(max_length=64)
    ts = models.FloatField()  # the agent's clock when it took the dump
    received = models.DateTimeField(default=timezone.now)
    entries = models.PositiveIntegerField(default=0)
    size = models.PositiveIntegerField(default=0)
    dump = models.JSONField()

    class Meta:
        indexes = [models.Index(fields=["run", "rank", "-received"], name="flightrecord_latest")]
