"""The demo's alert stream (`manage.py up`) prints each alert's firing once and before its resolve,
from the alerts the real lifecycle writes."""

from __future__ import annotations

import pytest
from django.db import transaction

from dashboard.detection import lifecycle
from dashboard.detection.models import Alert
from dashboard.detection.rules import Finding
from dashboard.devstack.stream import AlertStream
from dashboard.tenancy.models import Run

pytestmark = pytest.mark.django_db


def fire(run: Run, kind: str, ranks: tuple[int, ...], step: int = 1) -> None:
    with transaction.atomic():
        lifecycle.apply(
            run, [Finding("critical", ranks, f"{kind} on {ranks}", step=step, kind=kind, subject="s")], [], step
        )


def resolve(run: Run, kind: str, at: int) -> None:
    with transaction.atomic():
        lifecycle.apply(run, [], [(kind, "s")], at)


def states(lines: list[str]) -> list[tuple[str, str]]:
    return [(text.split()[1], text.split()[2]) for text in lines]


def test_firing_once_then_its_resolve_even_when_both_fall_between_two_looks(project):
    run = Run.objects.create(project=project, key="demo-run", world_size=3)
    stream = AlertStream()
    alerts = Alert.objects.select_related("run").order_by("id")
    fire(run, "hang_forecast", (2,))
    assert states(stream.lines(alerts.all())) == [("firing", "hang_forecast")]
    fire(run, "hang_forecast", (1, 2))  # a new revision (a new rank): not a second firing
    lifecycle.enrich(Alert.objects.get(kind="hang_forecast"), {"flight_recorder": {}}, news=True)
    assert stream.lines(alerts.all()) == []

    fire(run, "grad_divergence", (1,), step=3)
    resolve(run, "grad_divergence", at=9)  # fired and resolved before the next look
    assert states(stream.lines(alerts.all())) == [("firing", "grad_divergence"), ("resolved", "grad_divergence")]
    fire(run, "grad_divergence", (1,), step=12)  # a new episode fires again
    assert states(stream.lines(alerts.all())) == [("firing", "grad_divergence")]

    with transaction.atomic():
        lifecycle.end_of_run(run)  # nothing delivered: nothing resolves
    for alert in Alert.objects.all():
        lifecycle.mark_notified(alert)
    with transaction.atomic():
        lifecycle.end_of_run(run)
    ended = stream.lines(alerts.all())
    assert states(ended) == [("ended_unresolved", "hang_forecast"), ("ended_unresolved", "grad_divergence")]
    assert all(text.endswith("(run ended)") for text in ended)
    assert stream.lines(alerts.all()) == []


def test_alerts_from_before_the_stream_are_not_printed(project):
    run = Run.objects.create(project=project, key="demo-old", world_size=2)
    fire(run, "rank_silent", (1,))
    stream = AlertStream()
    stream.known(Alert.objects.all())
    assert stream.lines(Alert.objects.select_related("run")) == []
    resolve(run, "rank_silent", at=5)
    assert states(stream.lines(Alert.objects.select_related("run"))) == [("resolved", "rank_silent")]


def test_the_demo_says_which_alert_kinds_it_did_not_raise():
    """`up` ends its demo with what it showed, from the alerts raised, never the promise of every kind."""
    from dashboard.detection.rules import REGISTRY
    from dashboard.devstack.management.commands.up import raised_summary

    kinds = {r.kind for r in REGISTRY}
    assert {"rank_specific_artifact", "graph_divergence", "rank_crashed"} <= kinds
    shown = kinds - {"rank_specific_artifact", "compile_cost"}
    assert raised_summary(shown) == (
        f"{len(kinds) - 2} of {len(kinds)} alert kinds raised; not raised here: compile_cost, "
        "rank_specific_artifact (docs/alerts.md)"
    )
    assert raised_summary(kinds | {"something_else"}) == f"{len(kinds)} of {len(kinds)} alert kinds raised"
