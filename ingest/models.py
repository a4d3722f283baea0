"""Telemetry as the agents report it: projects and their tokens, runs, ranks, raw per-rank events.

The raw per-rank tables (`RawEvent` subclasses) are PostgreSQL tables partitioned by day of
`received` (migration 0002): rows arrive by binary COPY and leave when retention drops a whole
partition. In the database their primary key is (id, received) and they carry no foreign key
to `ingest_run` (a per-row RI check would cost as much as the insert); Django still cascades
deletes of a run through the ORM.
"""
from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone


class Project(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="projects", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class ProjectToken(models.Model):
    """A bearer token; only its SHA-256 is stored, so a database leak leaks no credential."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)

    @staticmethod
    def digest_of(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @classmethod
    def issue(cls, project: Project) -> str:
        token = "lst_" + secrets.token_urlsafe(32)
        cls.objects.create(project=project, digest=cls.digest_of(token), prefix=token[:12])
        return token


class Run(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    key = models.CharField(max_length=200, unique=True)
    name = models.CharField(max_length=512, blank=True)
    world_size = models.PositiveIntegerField()
    meta = models.JSONField(default=dict)
    torch_version = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(auto_now=True)
    last_step = models.BigIntegerField(null=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return self.key

    @property
    def status(self) -> str:
        """finished once every rank sent rank_end (querysets may annotate `ended` to save a query)."""
        ended = getattr(self, "ended", None)
        if ended is None:
            ended = self.ranks.exclude(status="running").count()
        return "finished" if ended >= self.world_size else "running"


class Rank(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ranks")
    rank = models.PositiveIntegerField()
    host = models.CharField(max_length=512, blank=True)
    pid = models.BigIntegerField(null=True)
    info = models.JSONField(default=dict)
    status = models.CharField(max_length=16, default="running")
    exit_code = models.IntegerField(null=True)
    last_step = models.BigIntegerField(null=True)
    last_seen = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "rank"], name="rank_per_run")]
        ordering = ["rank"]


class IngestBatch(models.Model):
    """(session, seq) seen: makes a resent batch a no-op, and a different body under it a 409."""

    session = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    digest = models.CharField(max_length=64)
    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    events = models.PositiveIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="batch_once")]
        indexes = [models.Index(fields=["received_at"], name="batch_received")]  # retention deletes by age


class RawEvent(models.Model):
    """Fields every raw per-rank table has; `received` (server time) is the partition key."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, db_constraint=False, db_index=False)  # composite indexes lead with run
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
        indexes = [models.Index(fields=["run", "frame", "index"])]


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
    `ranks`: ranks whose reports arrived alike in one request share one row (`ingest.writers.grad_copy`)."""

    ranks = ArrayField(models.IntegerField())
    step = models.BigIntegerField()
    group = models.CharField(max_length=64)
    fps = ArrayField(models.BigIntegerField())
    norm = models.FloatField(null=True)
    nonfinite = models.BigIntegerField(default=0)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "step", "group"])]


class StepReport(RawEvent):
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    loss = models.FloatField(null=True)
    step_time = models.FloatField(null=True)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "rank", "step"])]


class EventLog(RawEvent):
    """Events kept verbatim (detail answers, dropped counts): rare, read by key, no table of their own needed."""

    rank = models.PositiveIntegerField()
    t = models.CharField(max_length=32)
    body = models.JSONField()
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "t"], name="eventlog_run_t")]


class Blob(models.Model):
    """A normalized graph text, stored once per content hash however many ranks hold it.

    A row without text is a request in flight: `requested_at` is when one agent was asked to
    upload it (the others are not asked again until that lease expires).
    """

    hash = models.CharField(max_length=32, primary_key=True)
    text = models.TextField(null=True)
    size = models.PositiveIntegerField(default=0)
    requested_at = models.DateTimeField(null=True)
    stored_at = models.DateTimeField(null=True)


class GradWatermark(models.Model):
    """The highest step each rank reported for one comparison group: one row per rank, not per step.

    A grad slot is complete once every rank's watermark passed it, so ingest updates one row per
    batch instead of a counter per rank-step (1024 ranks would otherwise rewrite each slot row
    1024 times). See dashboard.detection.slots.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    group = models.CharField(max_length=64)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "group", "rank"], name="watermark_per_rank")]
        indexes = [models.Index(fields=["run", "group", "step"], name="watermark_min_max")]
