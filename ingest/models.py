"""Telemetry as the agents report it: projects and their tokens, runs, ranks, raw per-rank events."""
from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models


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


class CompileEvent(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE)
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


class GraphBreakEvent(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    frame = models.CharField(max_length=512)
    reason = models.TextField()
    step = models.BigIntegerField(null=True)
    ts = models.DateTimeField()


class GradReport(models.Model):
    """One rank's bucket fingerprints for one step of one comparison group (signed int64 storage)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    group = models.CharField(max_length=64)
    fps = ArrayField(models.BigIntegerField())
    norm = models.FloatField(null=True)
    nonfinite = models.BigIntegerField(default=0)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "step", "group"])]


class StepReport(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    step = models.BigIntegerField()
    loss = models.FloatField(null=True)
    step_time = models.FloatField(null=True)
    ts = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["run", "rank", "step"])]


class EventLog(models.Model):
    """Events kept verbatim until a later feature gives them a table of their own (param, detail, dropped)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE)
    rank = models.PositiveIntegerField()
    t = models.CharField(max_length=32)
    body = models.JSONField()
    ts = models.DateTimeField()
