"""Health per project and per active run on /metrics, for Grafana (docs/grafana/lockstep.json).

Ingest serves /metrics but may not read alerts (the layer contract), so this collector lives here
and registers itself with `ingest.metrics` when the app is ready. Each scrape runs a handful of
grouped queries in PostgreSQL whose cost follows the active runs and their ranks, never their
ranks' raw events (compile totals come from `RunTally`, one row per run):

* per project (label `project`): firing alerts by kind and severity, active runs and their
  verdicts (`verdict.py`: a run that diverged stays diverged after it ended), silent ranks, settle
  lag. These cover every active run.
* per run (labels `project`, `run`), for at most LOCKSTEP_METRICS_RUNS active runs, newest first:
  firing and unresolved (firing, or ended unresolved: they still count) alerts by severity, the
  verdict (one series per verdict, 1 for the run's), ranks reporting, silent ranks, last step,
  settle lag, and counters of recompiles, graph breaks and seconds spent compiling (summed over the
  run's ranks, as the periodic check last counted them: `tally.py`, at most 2 s old; they fall back
  if a run outlives raw retention). How many active runs were left out is
  `lockstep_metrics_runs_omitted`.
* per project, over all its runs: slots whose settle raised (`lockstep_slots_quarantined`).
* the seconds since the sweep last completed (`lockstep_sweep_age_seconds`, `sweep_clock.py`).

No label names a rank: a 1024-rank run is one series per metric. Active: a run that reported in
the last `runs.ACTIVE_WINDOW`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dashboard.detection import bills, cost, sweep_clock, verdict
from dashboard.detection.models import Alert, RunTally
from dashboard.detection.runs import ACTIVE_WINDOW
from dashboard.ledger import slots
from dashboard.ledger.models import CompileSlot, GradSlot
from dashboard.tenancy.models import Project, Rank, Run, with_status

RUN_LABELS = ["project", "run"]


class HealthCollector:
    """A prometheus_client collector: `collect` runs the queries at every scrape."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        active = list(
            Run.objects.filter(last_seen__gte=now - ACTIVE_WINDOW)
            .order_by("-started_at")
            .values_list("id", "key", "project__name", "last_step")
        )
        projects = {run_id: project for run_id, _, project, _ in active}
        shown = active[: settings.LOCKSTEP_METRICS_RUNS]
        names = {run_id: (project, key) for run_id, key, project, _ in shown}
        ids = list(projects)
        reporting, silent = _rank_counts(ids, now)
        lag = _settle_lag(ids, now)
        yield from _project_families(projects, ids, silent, lag)
        yield from _run_families(shown, names, reporting, silent, lag)
        yield from _verdicts(projects, names)
        yield _compile_cost()
        yield _quarantined()
        yield _sweep_age()
        omitted = GaugeMetricFamily(
            "lockstep_metrics_runs_omitted", "Active runs without per-run series (past LOCKSTEP_METRICS_RUNS)"
        )
        omitted.add_metric([], len(active) - len(shown))
        yield omitted


def _project_families(
    projects: dict[int, str], ids: list[int], silent: dict[int, int], lag: dict[int, float]
) -> Iterator[Metric]:
    firing = GaugeMetricFamily(
        "lockstep_alerts_firing", "Firing alerts of the project's active runs", labels=["project", "kind", "severity"]
    )
    for row in (
        Alert.objects.filter(run_id__in=ids, state=Alert.State.FIRING)
        .values("run__project__name", "kind", "severity")
        .annotate(n=Count("id"))
        .order_by()
    ):
        firing.add_metric([row["run__project__name"], row["kind"], row["severity"]], row["n"])
    yield firing
    yield _per_project(
        "lockstep_runs_active",
        "Runs that reported in the last hour",
        _sum_by_project(projects, {run_id: 1 for run_id in projects}),
    )
    yield _per_project(
        "lockstep_ranks_silent",
        "Ranks of active runs that stopped reporting (LOCKSTEP_SILENT_AFTER)",
        _sum_by_project(projects, silent),
    )
    yield _per_project(
        "lockstep_settle_lag_seconds",
        "Age of the oldest slot of the project's active runs waiting to settle",
        _max_by_project(projects, lag),
    )


def _run_families(
    shown: list[tuple[int, str, str, int | None]],  # (run id, key, project, last step)
    names: dict[int, tuple[str, str]],
    reporting: dict[int, int],
    silent: dict[int, int],
    lag: dict[int, float],
) -> Iterator[Metric]:
    ids = list(names)
    firing = GaugeMetricFamily(
        "lockstep_run_alerts_firing", "Firing alerts of the run", labels=[*RUN_LABELS, "severity"]
    )
    for row in (
        Alert.objects.filter(run_id__in=ids, state=Alert.State.FIRING)
        .values("run_id", "severity")
        .annotate(n=Count("id"))
        .order_by()
    ):
        firing.add_metric([*names[row["run_id"]], row["severity"]], row["n"])
    yield firing
    yield _per_run("lockstep_run_ranks", "Ranks of the run that reported", names, reporting)
    yield _per_run("lockstep_run_ranks_silent", "Ranks of the run that stopped reporting", names, silent)
    yield _per_run(
        "lockstep_run_last_step",
        "Highest optimizer step any rank reported",
        names,
        {run_id: step for run_id, _, _, step in shown if step is not None},
    )
    yield _per_run("lockstep_run_settle_lag_seconds", "Age of the run's oldest slot waiting to settle", names, lag)
    tallies = {t.run_id: t for t in RunTally.objects.filter(run_id__in=ids)}
    yield _run_counter(
        "lockstep_run_recompiles",
        "Compiles past a frame's first, summed over the run's ranks",
        names,
        {r: t.recompiles for r, t in tallies.items()},
    )
    yield _run_counter(
        "lockstep_run_graph_breaks",
        "Graph breaks, summed over the run's ranks",
        names,
        {r: t.graph_breaks for r, t in tallies.items()},
    )
    yield _run_counter(
        "lockstep_run_compile_seconds",
        "Seconds spent compiling frames, summed over the run's ranks",
        names,
        {r: t.compile_seconds for r, t in tallies.items()},
    )


def _verdicts(projects: dict[int, str], names: dict[int, tuple[str, str]]) -> Iterator[Metric]:
    """Active runs by verdict per project, and each shown run's verdict (every verdict a series, 1
    for the run's, so series do not come and go); its unresolved alerts by severity."""
    judged = verdict.of_runs(with_status(Run.objects.filter(id__in=list(projects))))
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for run_id, project in projects.items():
        counts[(project, judged[run_id].kind)] += 1
    by_project = GaugeMetricFamily("lockstep_runs_by_verdict", "Active runs by verdict", labels=["project", "verdict"])
    for project in sorted(set(projects.values())):
        for kind in verdict.VERDICTS:
            by_project.add_metric([project, kind], counts.get((project, kind), 0))
    yield by_project
    per_run = GaugeMetricFamily(
        "lockstep_run_verdict", "1 for the run's verdict, 0 for the others", labels=[*RUN_LABELS, "verdict"]
    )
    for run_id, labels in names.items():
        for kind in verdict.VERDICTS:
            per_run.add_metric([*labels, kind], 1 if judged[run_id].kind == kind else 0)
    yield per_run
    unresolved = GaugeMetricFamily(
        "lockstep_run_alerts_unresolved",
        "Alerts of the run still unresolved: firing, or ended unresolved (the run ended first)",
        labels=[*RUN_LABELS, "severity"],
    )
    for row in (
        Alert.objects.filter(run_id__in=list(names), state__in=(Alert.State.FIRING, Alert.State.ENDED_UNRESOLVED))
        .values("run_id", "severity")
        .annotate(n=Count("id"))
        .order_by()
    ):
        unresolved.add_metric([*names[row["run_id"]], row["severity"]], row["n"])
    yield unresolved


def _compile_cost() -> CounterMetricFamily:
    """GPU-seconds lost to compilation by project and cause over every run's kept bill (`bills.py`):
    one row per run, whatever its ranks; a cause's seconds per run never go down."""
    family = CounterMetricFamily(
        "lockstep_compile_gpu_seconds",
        "GPU-seconds lost to compilation (world size x "
        "the slowest rank per step, measured waits where sampled), by cause",
        labels=["project", "cause"],
    )
    counted = bills.counted_by_project()
    for project in Project.objects.order_by("name").values_list("name", flat=True):
        for cause in cost.CAUSES:  # every project and cause, 0 until it costs: series do not come and go
            family.add_metric([project, cause], counted.get((project, cause), 0.0))
    return family


def _quarantined() -> GaugeMetricFamily:
    """Slots whose settle raised, by project (`slots.quarantine`): settled without a verdict, each
    one logged by the worker that quarantined it. Every project, 0 until one happens."""
    family = GaugeMetricFamily(
        "lockstep_slots_quarantined", "Slots whose settle failed: settled without a verdict", labels=["project"]
    )
    counts = slots.quarantined_by_project()
    for project_id, name in Project.objects.order_by("name").values_list("id", "name"):
        family.add_metric([name], counts.get(project_id, 0))
    return family


def _sweep_age() -> GaugeMetricFamily:
    """Seconds since the detection sweep last completed (+Inf: never); no sample while Redis is away."""
    family = GaugeMetricFamily(
        "lockstep_sweep_age_seconds",
        "Seconds since the sweep last completed (+Inf: never); past a few of its 2 s periods nothing settles"
        " overdue slots, checks for silent ranks or re-sends due webhooks",
    )
    seconds = sweep_clock.age()
    if seconds is not None:
        family.add_metric([], seconds)
    return family


def _rank_counts(ids: list[int], now: datetime) -> tuple[dict[int, int], dict[int, int]]:
    """Per run: ranks that reported, and those that have not ended and are quiet past
    LOCKSTEP_SILENT_AFTER (one grouped count over the runs' rank rows)."""
    quiet_since = now - timedelta(seconds=settings.LOCKSTEP_SILENT_AFTER)
    rows = (
        Rank.objects.filter(run_id__in=ids)
        .values("run_id")
        .order_by()
        .annotate(n=Count("id"), silent=Count("id", filter=Q(status="running", last_seen__lt=quiet_since)))
    )
    return {r["run_id"]: r["n"] for r in rows}, {r["run_id"]: r["silent"] for r in rows}


def _settle_lag(ids: list[int], now: datetime) -> dict[int, float]:
    """Per run: seconds since the first report of its oldest unsettled slot (compile or grad). Read
    through the sweep's index on unsettled slots (few), not through the runs' settled ones (many)."""
    wanted = set(ids)
    oldest: dict[int, datetime] = {}
    for model in (CompileSlot, GradSlot):
        for run_id, first in (
            model.objects.filter(settled_at__isnull=True)
            .values("run_id")
            .annotate(first=Min("first_seen"))
            .order_by()
            .values_list("run_id", "first")
        ):
            if run_id in wanted:
                oldest[run_id] = min(first, oldest.get(run_id, first))
    return {run_id: max(0.0, (now - first).total_seconds()) for run_id, first in oldest.items()}


def _sum_by_project(projects: dict[int, str], per_run: Mapping[int, float]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for run_id, project in projects.items():
        out[project] += per_run.get(run_id, 0)
    return out


def _max_by_project(projects: dict[int, str], per_run: dict[int, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for run_id, value in per_run.items():
        out[projects[run_id]] = max(value, out.get(projects[run_id], 0.0))
    return {project: out.get(project, 0.0) for project in set(projects.values())}


def _per_project(name: str, doc: str, values: dict[str, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["project"])
    for project, value in sorted(values.items()):
        family.add_metric([project], value)
    return family


def _per_run(name: str, doc: str, names: dict[int, tuple[str, str]], values: Mapping[int, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=RUN_LABELS)
    _fill(family, names, values)
    return family


def _run_counter(
    name: str, doc: str, names: dict[int, tuple[str, str]], values: dict[int, float]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=RUN_LABELS)
    _fill(family, names, values)
    return family


def _fill(
    family: GaugeMetricFamily | CounterMetricFamily, names: dict[int, tuple[str, str]], values: Mapping[int, float]
) -> None:
    """One sample per shown run (0 where the query found nothing), so series do not come and go."""
    for run_id, labels in names.items():
        family.add_metric(list(labels), values.get(run_id, 0))
