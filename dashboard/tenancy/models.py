"""Who owns what: projects with their members and tokens, the runs of a project, and the ranks of a run.

Every other app hangs its rows off a Run; only this app writes these tables. The tables keep the
names they had when ingest owned them (`db_table`), so existing databases carry forward.
"""
from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


class Project(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="projects", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "ingest_project"

    def __str__(self) -> str:
        return self.name


class ProjectToken(models.Model):
    """A bearer token; only its SHA-256 is stored, so a database leak leaks no credential."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "ingest_projecttoken"

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
        db_table = "ingest_run"
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
        db_table = "ingest_rank"
        constraints = [models.UniqueConstraint(fields=["run", "rank"], name="rank_per_run")]
        ordering = ["rank"]
