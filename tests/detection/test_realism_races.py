"""Ranks of one node sharing one cold Inductor cache dir, recorded on an H200
(tests/fixtures/realism_races.tgz, made by tests/fixtures/make_realism_fixtures.sh races: 3 ranks on
cuda:0 over gloo, torch 2.11). In the race runs one rank starts late and loads the entries the others
compiled, a different rank each time, or every rank compiles alike; the GPT-2 runs train a
transformers model under torch.compile(DDP(model)), and in one of them rank 1 runs its forward under
bf16 autocast. Each spooled body goes through the real ingest endpoint, every slot is settled as the
Celery worker settles it, and every pending incident is delivered to a Slack destination as the
delivery sweep does: a hit/miss race opens no incident and pages nobody; another graph is one page
naming its rank."""

from __future__ import annotations

import os
import tarfile

import pytest

from agents.spool import list_batches
from dashboard.delivery import notify
from dashboard.delivery.models import Notification, Webhook
from dashboard.detection import runs, settle
from dashboard.detection.models import Alert, Incident
from dashboard.ledger.models import CompileSlot, GradSlot
from dashboard.tenancy.models import Rank, Run

pytestmark = pytest.mark.django_db

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "realism_races.tgz")
RACES = ("race1", "race2", "race3", "gpt2")


@pytest.fixture(scope="module")
def spools(tmp_path_factory) -> str:
    into = tmp_path_factory.mktemp("races")
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(into, filter="data")
    return str(into)


def replay(post, project, spools: str, key: str) -> Run:
    """Upload one recorded run, settle it, deliver what pages (a Slack destination receives it)."""
    Webhook.objects.get_or_create(project=project, kind="slack", url="http://127.0.0.1:9/hook")
    for path in list_batches(os.path.join(spools, key)):
        with open(path, "rb") as f:
            body = f.read()
        headers = {"HTTP_CONTENT_ENCODING": "gzip"} if body[:2] == b"\x1f\x8b" else {}
        assert post(body, headers=headers).status_code == 200, path
    run = Run.objects.get(key=key)
    for slot_id in CompileSlot.objects.filter(run=run).order_by("id").values_list("id", flat=True):
        settle.settle_compile(slot_id)
    for slot_id in GradSlot.objects.filter(run=run).order_by("step", "id").values_list("id", flat=True):
        settle.settle_grad(slot_id)
    runs.check(run)
    for incident_id in notify.pending_incidents():
        notify.deliver_incident(incident_id)
    return run


def test_a_cache_race_on_a_shared_cold_dir_opens_no_incident_and_pages_nobody(post, project, spools):
    """The runs where the race happened (the late rank hit what the others wrote; every-miss runs are
    quiet anyway, `bench false_alarms` replays them too): shown as information, never an incident or
    a page; and which rank hit differs from run to run, ranks 0, 1 and 2 each once."""
    hits = {}
    for name in RACES:
        run = replay(post, project, spools, f"realism-{name}-cold-shared")
        assert set(Rank.objects.filter(run=run).values_list("info__device", flat=True)) == {"cuda:0"}
        assert not Incident.objects.filter(run=run).exists()
        assert not Notification.objects.filter(incident__run=run).exists()
        loud = Alert.objects.filter(run=run).exclude(severity="info")
        assert not loud.exists(), [a.message for a in loud]
        [race] = Alert.objects.filter(run=run, kind="cache_divergence")
        assert race.severity == "info" and race.incident_id is None
        hits[name] = race.details["stages"]["inductor"]["hit"]
    assert hits == {"race1": [0], "race2": [1], "race3": [2], "gpt2": [2]}


def test_one_rank_under_autocast_is_one_graph_divergence_page_and_no_rank_specific_artifact(post, project, spools):
    run = replay(post, project, spools, "realism-autocast-cold-shared")
    [incident] = Incident.objects.filter(run=run).select_related("root")
    assert (incident.root.kind, incident.root.ranks, incident.severity) == ("graph_divergence", [1], "critical")
    assert not Alert.objects.filter(run=run, kind="rank_specific_artifact").exists()
    assert Notification.objects.filter(incident=incident).count() == 1


def test_the_same_error_on_every_rank_uploaded_rank_by_rank_is_one_incident_of_them_all(post, project, spools):
    """The recorded run where every rank raised the same exception in the same step, sent as
    `agents upload` sends a spool (rank by rank), the sweep looking after each rank: one incident,
    rooted at every rank, one page; never one per rank as each report came in."""
    Webhook.objects.get_or_create(project=project, kind="slack", url="http://127.0.0.1:9/hook")
    key = "realism-raise-cold-private"
    paths = list_batches(os.path.join(spools, key))
    for rank in sorted({int(os.path.basename(p)[1:8]) for p in paths}):
        for path in (p for p in paths if int(os.path.basename(p)[1:8]) == rank):
            with open(path, "rb") as f:
                body = f.read()
            headers = {"HTTP_CONTENT_ENCODING": "gzip"} if body[:2] == b"\x1f\x8b" else {}
            assert post(body, headers=headers).status_code == 200, path
        runs.check(Run.objects.get(key=key))
    run = Run.objects.get(key=key)
    for slot_id in CompileSlot.objects.filter(run=run).values_list("id", flat=True):
        settle.settle_compile(slot_id)
    runs.check(run)
    for incident_id in notify.pending_incidents():
        notify.deliver_incident(incident_id)
    [incident] = Incident.objects.filter(run=run).select_related("root")
    assert (incident.root.kind, incident.root.ranks) == ("rank_crashed", [0, 1, 2])
    assert incident.root.message.startswith("Ranks 0-2 raised the same error: ")
    assert Notification.objects.filter(incident=incident).exists()


def test_a_loss_turning_inf_on_one_rank_is_one_incident_rooted_at_that_rank(post, project, spools):
    """Rank 1's loss turned inf at step 3 (the job hands its loss to the agent): the all-reduce spread
    NaN to every rank's gradients, and the one critical incident names rank 1, whose loss went first."""
    run = replay(post, project, spools, "realism-inf-cold-private")
    [incident] = Incident.objects.filter(run=run).select_related("root")
    assert (incident.root.kind, incident.root.ranks, incident.severity) == ("nonfinite_grad", [1], "critical")
    assert Notification.objects.filter(incident=incident).count() == 1
