"""Who owns what: projects with their members and tokens, the runs of a project, and the ranks of a run.

Every other app hangs its rows off a Run; only this app writes these tables, named `tenancy_*`
for it.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Case, Count, F, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

RUN_STATUSES = ("running", "finished", "failed", "stalled")
# A rank's status: "running" until its rank_end says ok | error | signal | abort, or "lost" when it went
# silent while every other rank ended (killed outright: it will never say goodbye; `mark_lost`), or
# "vanished" when a rank of its node saw its process go without one (`protocol.PeerGone`).
LOST = "lost"
VANISHED = "vanished"


class Project(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="projects", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # what one GPU-hour costs the project (any currency): the compile bill shows money where it is set
    gpu_hour_price = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    # compile_cost's budget for this project's runs (share of their GPU time, and from what run age in
    # seconds); unset: LOCKSTEP_COMPILE_BUDGET and LOCKSTEP_COMPILE_BUDGET_AFTER
    compile_budget = models.FloatField(null=True, blank=True)
    compile_budget_after = models.FloatField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def named(cls, name: str) -> tuple[Project, bool]:
        """The project of this name, made when new (`createtoken`, the demo); True when made now."""
        return cls.objects.get_or_create(name=name)


# What a project token may do. A job's agents hold their token, so the default can send and read but
# never clear `lockstep check`: resolving alerts and re-pointing a baseline (which resolves the old
# comparison's alerts) need a token created with that scope, or a user.
INGEST, READ, BASELINE, RESOLVE = "ingest", "read", "baseline", "resolve"
TOKEN_SCOPES = (INGEST, READ, BASELINE, RESOLVE)
DEFAULT_SCOPES = (INGEST, READ)


def default_scopes() -> list[str]:
    return list(DEFAULT_SCOPES)


class ProjectToken(models.Model):
    """A bearer token; only its SHA-256 is stored, so a database leak leaks no credential."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)
    scopes = ArrayField(models.CharField(max_length=16), default=default_scopes)  # of TOKEN_SCOPES

    @staticmethod
    def digest_of(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @classmethod
    def issue(cls, project: Project, scopes: tuple[str, ...] = DEFAULT_SCOPES) -> str:
        unknown = set(scopes) - set(TOKEN_SCOPES)
        if unknown or not scopes:
            raise ValueError(f"token scopes must be some of {', '.join(TOKEN_SCOPES)}, got {sorted(scopes)}")
        token = "lst_" + secrets.token_urlsafe(32)
        chosen = [s for s in TOKEN_SCOPES if s in scopes]
        cls.objects.create(project=project, digest=cls.digest_of(token), prefix=token[:12], scopes=chosen)
        return token


class Run(models.Model):
    """A job's run. Its key is unique within its project only: a key another project chose first
    neither blocks nor reveals anything (issue 17, item 1)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    key = models.CharField(max_length=200)
    name = models.CharField(max_length=512, blank=True)
    world_size = models.PositiveIntegerField()
    meta = models.JSONField(default=dict)
    torch_version = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(auto_now=True)
    last_step = models.BigIntegerField(null=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [models.UniqueConstraint(fields=["project", "key"], name="run_key_per_project")]

    def __str__(self) -> str:
        return self.key

    @classmethod
    def reported(cls, project: Project, key: str, name: str, world_size: int, meta: dict[str, Any]) -> Run:
        """The project's run of this key, made by its first batch (as that batch describes it)."""
        run, _ = cls.objects.get_or_create(
            project=project, key=key, defaults={"name": name, "world_size": world_size, "meta": meta}
        )
        return run

    @property
    def status(self) -> str:
        """One of RUN_STATUSES (see `with_status`); querysets built by `with_status` save the query."""
        derived = getattr(self, "run_status", None)
        if derived is None:
            derived = with_status(Run.objects.filter(pk=self.pk)).values_list("run_status", flat=True).get()
        return derived


LAYOUT = ("params", "buckets")  # the keys of a rank's start facts that `Rank.facts` leaves out
# The start facts that are a rank's own (its node, its GPU, its process, its clock, its process's W&B and
# MLflow runs): `Rank.facts_key` leaves them out, so every rank of a job that runs alike shares one key.
OWN_FACTS = ("host", "device", "pid", "local_rank", "ts", "links")


class Rank(models.Model):
    """One rank of a run, updated by each of its batches (`sql.ranks_seen_cte`): its table keeps
    free space in every page (the initial migration) so that those updates stay HOT, touching no index."""

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="ranks", db_index=False
    )  # rank_per_run leads with run
    rank = models.PositiveIntegerField()
    host = models.CharField(max_length=512, blank=True)
    pid = models.BigIntegerField(null=True)
    info = models.JSONField(default=dict)
    # `info` without the model's parameter layout (`LAYOUT`), kept by the same statement: what the sweep
    # and every compile slot read of each rank, small enough to stay in the row where a real model's
    # layout makes `info` tens of kilobytes, out of line, decompressed on each read (`sql.ranks_seen_cte`)
    facts = models.JSONField(default=dict)
    # `facts` without `OWN_FACTS`, hashed (md5; "" before a rank_start), and the two facts read of every
    # rank: a compile settle groups the ranks by key and reads one `facts` per group (`facts.groups`),
    # the sweep reads the shortest timeout each second. Every rank's `facts`, out of line past 512 bytes
    # as a real rank's are, cost 3 s of a settle and 0.4 s of a sweep at 100,000 ranks.
    facts_key = models.CharField(max_length=32, default="")
    device = models.CharField(max_length=512, default="")
    collective_timeout_s = models.FloatField(null=True)
    status = models.CharField(max_length=16, default="running")  # running, a rank_end's status, or LOST
    exit_code = models.IntegerField(null=True)
    last_step = models.BigIntegerField(null=True)
    last_seen = models.DateTimeField(auto_now=True)
    # the rank's latest progress sample (`protocol.Progress`) and when ingest received it, kept by the
    # same statement: the sweep reads where every rank is from here each second, where the log's samples
    # of the silent window are a dozen rows a rank (`sql.ranks_seen_cte`)
    progress = models.JSONField(null=True)
    progress_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "rank"], name="rank_per_run")]
        ordering = ["rank"]


def rank_failed(via: str = "") -> Q:
    """A rank failed when its rank_end said error/signal/abort, its process exited non-zero, or it was lost;
    `via`: the path from the queried model to `Rank` (e.g. "ranks__" from Run)."""
    return (
        ~Q(**{f"{via}status__in": ("ok", "running")})
        | Q(**{f"{via}exit_code__lt": 0})
        | Q(**{f"{via}exit_code__gt": 0})
    )


RUNNING_STATES = ("running", LOST)  # a rank in neither said goodbye


def rank_ended() -> Q:
    """`has_ended` as a filter: the rank said goodbye."""
    return ~Q(status__in=RUNNING_STATES)


def has_ended(status: str) -> bool:
    """The rank said goodbye (sent rank_end). A lost rank did not: its absence from a slot is no data."""
    return status not in RUNNING_STATES


def mark_lost(run_id: int, ranks: set[int] | list[int]) -> int:
    """Ranks still `running` that went silent while every other rank ended become `lost` (the
    periodic sweep decides it); a report from one of them makes it `running` again (`sql.ranks_seen_cte`)."""
    return Rank.objects.filter(run_id=run_id, rank__in=sorted(ranks), status="running").update(status=LOST)


class StatusAnnotations(TypedDict):
    """The columns `with_status` adds to each run."""

    ended: int
    run_status: str


def with_status(runs: QuerySet[Run]) -> QuerySet[WithAnnotations[Run, StatusAnnotations]]:
    """`runs` annotated with `ended` (ranks that sent rank_end) and `run_status`, the one place a run's
    status is decided, in SQL so that a list of runs (and a filter on status) stays one query.

    failed: a rank failed (or was lost). finished: world_size ranks ended, none failed. stalled: a rank that has not
    ended is silent longer than LOCKSTEP_SILENT_AFTER, or ranks are missing and the run itself is
    that silent (killed or frozen ranks never send rank_end). running: otherwise.
    """
    quiet_since = timezone.now() - timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER)
    runs = runs.annotate(ended=_ranks_where(~Q(status="running"))).alias(
        reporting=_ranks_where(Q()),
        failed=_ranks_where(rank_failed()),
        silent=_ranks_where(Q(status="running", last_seen__lt=quiet_since)),
    )
    return runs.annotate(
        run_status=Case(
            When(failed__gt=0, then=Value("failed")),
            When(ended__gte=F("world_size"), then=Value("finished")),
            When(Q(silent__gt=0) | Q(reporting__lt=F("world_size"), last_seen__lt=quiet_since), then=Value("stalled")),
            default=Value("running"),
        )
    )


def _ranks_where(condition: Q) -> Coalesce:
    """How many of the outer run's ranks meet `condition`: a correlated subquery, so it multiplies no
    other join the caller adds and needs no GROUP BY over the runs."""
    counted = (
        Rank.objects.filter(condition, run=OuterRef("pk")).order_by().values("run").annotate(n=Count("pk")).values("n")
    )
    return Coalesce(Subquery(counted), 0)
