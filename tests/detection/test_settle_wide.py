"""A wide run cannot stop detection: 1024 ranks that all recompile, through the real bulk ingest, settle
every slot into alerts and an incident whose texts name the ranks as ranges and fit their columns; and
a slot whose settle raises (a real PostgreSQL error) is quarantined, logged and counted in /metrics
while the other slots of its run and of its message settle; a run whose periodic check raises leaves
the sweep going on to the other runs."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agents import protocol
from dashboard.detection import tasks, text
from dashboard.detection.models import Alert, Incident
from dashboard.ledger import slots
from dashboard.ledger.models import CompileSlot
from tests.conftest import make_batch, post_bulk
from tests.detection.test_rank_crashed_sweep import job

pytestmark = pytest.mark.django_db
WORLD, COMPILES = 1024, 9  # the 8th compile of a frame is a recompile storm on every rank
FRAME = "train.py:12:forward"


def bulk(client, token, batches: list[dict]) -> None:
    """One relay's request: every batch in one gzipped bulk body."""
    body = protocol.bulk_body([json.dumps(b, separators=(",", ":")).encode() for b in batches])
    response = post_bulk(client, token, body)
    assert response.status_code == 200, response.content


def compiles(rank: int, frame: str = FRAME, n: int = COMPILES) -> list[dict]:
    """A frame compiled n times at steps 0..n-1, each recompile for a reason of this rank's own."""
    return [
        {
            "t": "compile",
            "frame": frame,
            "index": i,
            "step": i,
            **({"recompile_reason": f"size mismatch at index 0. expected {rank}, actual {rank + i}"} if i else {}),
        }
        for i in range(n)
    ]


def test_1024_ranks_that_all_recompile_settle_every_slot_with_bounded_texts(client, token):
    node = 256  # ranks per bulk request (the protocol's most)
    for first in range(0, WORLD, node):
        ranks = range(first, first + node)
        bulk(client, token, [make_batch(run="wide", rank=r, world_size=WORLD, events=compiles(r)) for r in ranks])
    ids = list(CompileSlot.objects.filter(run__key="wide").order_by("index").values_list("id", flat=True))
    assert len(ids) == COMPILES and all(s.reported == WORLD for s in CompileSlot.objects.filter(id__in=ids))
    tasks.settle_slots(slots.COMPILE, ids)
    assert not CompileSlot.objects.filter(id__in=ids, settled_at__isnull=True).exists()
    assert not CompileSlot.objects.filter(id__in=ids, quarantined_at__isnull=False).exists()
    storm = Alert.objects.get(run__key="wide", kind="recompile_storm")
    assert storm.ranks == list(range(WORLD)) and f"on ranks 0-{WORLD - 1}" in storm.message
    odd = Alert.objects.get(run__key="wide", kind="recompile_divergence")  # every rank's own reason
    assert len(odd.ranks) >= WORLD - 1 and f"-{WORLD - 1}" in odd.message
    causes = set(Incident.objects.filter(run__key="wide").values_list("cause", flat=True))
    assert f"ranks:0-{WORLD - 1}" in causes or f"ranks:1-{WORLD - 1}" in causes
    for model, field in ((Alert, "subject"), (Alert, "frame"), (Incident, "cause")):
        longest = max(len(v or "") for v in model.objects.values_list(field, flat=True))
        assert longest <= text.max_length(model, field)
    assert max(len(m) for m in Alert.objects.values_list("message", flat=True)) < 400


def test_scattered_ranks_are_cut_with_a_digest_and_stay_apart():
    evens, odds = range(0, 2 * WORLD, 2), range(1, 2 * WORLD, 2)
    assert text.ranks_text(evens) == "ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, … (+1012 more)"
    assert text.ranks_text([0, 1, 2, 3, 7, 9, 10, 11, 12]) == "ranks 0-3, 7, 9-12" and text.ranks_text([4]) == "rank 4"
    keys = [text.fit_key(Incident, "cause", "ranks:" + text.rank_ranges(r, sep=",")) for r in (evens, odds)]
    assert keys[0] != keys[1] and all(len(k) == text.max_length(Incident, "cause") for k in keys)
    assert text.parse_ranges("0-3,7,9-12") == {0, 1, 2, 3, 7, 9, 10, 11, 12}
    assert text.fit(Alert, "frame", "x" * 600) == "x" * 511 + "…"


def metric(client, name: str, labels: dict) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").content.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"no {name} {labels}")


@pytest.fixture
def alerts_refused_where(db):
    """A real PostgreSQL error on writing some alerts (a trigger on a condition of the new row), as any
    settle or check might meet one; gone with the test's transaction."""

    def refuse(condition: str) -> None:
        with connection.cursor() as cur:
            cur.execute(
                "CREATE FUNCTION lockstep_test_refuse() RETURNS trigger AS $$ BEGIN "
                f"IF {condition} THEN RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; "
                "END $$ LANGUAGE plpgsql"
            )
            cur.execute(
                f"CREATE TRIGGER refuse BEFORE INSERT ON {Alert._meta.db_table} "
                "FOR EACH ROW EXECUTE FUNCTION lockstep_test_refuse()"
            )

    return refuse


def test_a_slot_whose_settle_raises_is_quarantined_while_the_others_settle(
    client, token, project, settings, caplog, alerts_refused_where
):
    settings.LOCKSTEP_METRICS_PUBLIC = True
    bad, good = "bad.py:1:step", "good.py:1:step"
    for rank in range(3):
        events = compiles(rank, bad, 2) + compiles(rank, good, 2)
        bulk(client, token, [make_batch(run="mixed", rank=rank, world_size=3, events=events)])
    alerts_refused_where(f"NEW.frame = '{bad}'")
    ids = list(CompileSlot.objects.filter(run__key="mixed", index=1).order_by("frame").values_list("id", flat=True))
    assert metric(client, "lockstep_slots_quarantined", {"project": project.name}) == 0
    with caplog.at_level(logging.ERROR, logger="dashboard.detection.tasks"):
        tasks.settle_slots(slots.COMPILE, ids)  # the bad frame's slot first, in one message
    quarantined = CompileSlot.objects.get(frame=bad, index=1)
    assert quarantined.quarantined_at is not None and not quarantined.pending
    assert CompileSlot.objects.get(frame=good, index=1).quarantined_at is None
    assert Alert.objects.get(kind="recompile_divergence").frame == good  # the other slot settled into its alert
    assert f"slot {quarantined.id} of run {quarantined.run_id} raised: quarantined" in caplog.text
    later = timezone.now() + timedelta(seconds=settings.LOCKSTEP_SETTLE_TIMEOUT + 1)
    assert quarantined.id not in slots.overdue(CompileSlot, now=later)  # the sweep stops retrying it
    assert metric(client, "lockstep_slots_quarantined", {"project": project.name}) == 1


def test_a_run_whose_check_raises_leaves_the_other_runs_checked(post, caplog, alerts_refused_where):
    first, second = job(post, "check-a", crash_rank=1), job(post, "check-b", crash_rank=1)
    alerts_refused_where(f"NEW.run_id = {first.id}")
    with caplog.at_level(logging.ERROR, logger="dashboard.detection.tasks"):
        tasks.sweep()
    assert f"checking run {first.id} raised" in caplog.text and not Alert.objects.filter(run=first).exists()
    assert Alert.objects.filter(run=second, kind="rank_crashed").exists()  # the sweep went on to it
