"""Raw evidence, as the agents reported it: the batches accepted per agent session, raw per-rank events, graph
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
from django.db import models
from django.utils import timezone

from dashboard.tenancy.models import Project, Run


class Int8MultiRangeField(models.Field):  # type: ignore[type-arg]
    """PostgreSQL's int8multirange: a set of integers as its runs (one range while they are contiguous)."""

    def db_type(self, connection: object) -> str:
        return "int8multirange"


RECENT_SEQS = 16  # seqs of a session whose digests are kept: a resend of one with other content is a 409


class IngestSession(models.Model):
    """The batches a run accepted from one agent session: their seqs, and the digests of the latest
    RECENT_SEQS. A resent batch is a no-op (its seq is in `seqs`), and another body under one of the
    latest seqs a 409; under an older seq it is taken for a resend (an agent sends a session's batches
    in seq order and resends only the oldest unanswered one, so only a second writer under the same
    session id meets this, and that one is caught while it overlaps the latest seqs). Scoped by run,
    so per project (run keys are per project): another project's agent that learns a session id can
    neither take its seqs nor have its batches dropped as duplicates.

    One row per session, updated in place, not one per batch: every batch of a 100,000-rank job
    inserted a row and an entry in a unique index keyed by a random session id (about 280 bytes per
    rank-step, 95% of what ingest stored, and index pages touched at random). No column the update
    changes is indexed and pages keep half their room free (fillfactor 50), so the update is HOT."""

    # no database constraint: PostgreSQL would check it at every claim (a deferred trigger and a
    # key-share lock of the run row); deleting a run still deletes its sessions (Django's cascade)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_index=False, db_constraint=False)
    session = models.CharField(max_length=64)
    rank = models.PositiveIntegerField()
    seqs = Int8MultiRangeField()
    high = models.BigIntegerField()  # the highest seq accepted
    # slot seq % RECENT_SEQS: the first 64 bits of the digest of seq, for seqs above high - RECENT_SEQS
    recent = ArrayField(models.BigIntegerField(null=True), size=RECENT_SEQS)
    batches = models.PositiveIntegerField()
    events = models.BigIntegerField()
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()  # retention deletes sessions idle past it (a scan: no index, to keep updates HOT)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "session"], name="session_once_per_run")]


class RawEvent(models.Model):
    """Fields every raw per-rank table has; `received` (server time) is the partition key."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, db_constraint=False, db_index=False
    )  # composite indexes lead with run
    received = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True


class Compiled(models.Model):
    """What a compile report holds that ranks can share: the slot it fills and what came of it."""

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
    cache = models.JSONField(default=dict)
    detail = models.JSONField(default=dict)

    class Meta:
        abstract = True


class CompileAgreement(RawEvent, Compiled):
    """A compile that several ranks reported alike, stored once: the ranks that sent it in one group
    of requests (`ranks`), with what each reported of its own in the same order (`times`: its
    compile's seconds, `ends`: its clock when the compile ended); the rest is theirs alike, `detail`
    too, whose `times` are the first rank's. A 100,000-rank job's compile of a frame is a few hundred
    rows (one per relay request) instead of 100,000. Compile slots are settled on these rows
    (`reads.compile_reports`); the readers that ask about ranks read `CompileEvent`."""

    ranks = ArrayField(models.IntegerField())
    times = ArrayField(models.FloatField(null=True))
    ends = ArrayField(models.DateTimeField())

    class Meta:
        indexes = [models.Index(fields=["run", "frame", "index"], name="compileevent_run_frame")]


class CompileEvent(Compiled):
    """One rank's compile: `CompileAgreement`'s rows a rank at a time (a view, read only), for the
    readers that ask about ranks (the pages, the compile bill, a rank's last compile). `id` is its
    agreement row's, shared by the ranks of that row."""

    id = models.BigIntegerField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False)
    received = models.DateTimeField()
    rank = models.PositiveIntegerField()
    compile_time = models.FloatField(null=True)
    ts = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "evidence_compileevent"


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
