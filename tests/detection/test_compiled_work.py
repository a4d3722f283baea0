"""The compiled-work judgement of ineffective_compile on real H200 recordings (torch 2.11, Triton),
ingested in-process: torch.compile(DDP(model)) of a model with its own blocks is compiled (DDP's
wrapper frames compile empty, the model a real graph); the same wrapping of a model made only of
torch.nn containers compiles nothing but the wrappers, and the run's last look says so."""

from __future__ import annotations

import tarfile

import pytest

from agents.spool import list_batches
from tests.stack import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
WRAPPER = "realism_job.py:129:train_step via contextlib.__init__"


def _ingest(post, tmp_path, archive: str, key: str):
    from dashboard.tenancy.models import Run

    with tarfile.open(FIXTURES / archive) as tar:
        tar.extractall(tmp_path, filter="data")
    for path in list_batches(str(tmp_path / key)):
        with open(path, "rb") as f:
            body = f.read()
        headers = {"HTTP_CONTENT_ENCODING": "gzip"} if body[:2] == b"\x1f\x8b" else {}
        assert post(body, headers=headers).status_code == 200, path
    return Run.objects.get(key=key)


@pytest.mark.django_db
def test_compiled_ddp_of_a_model_with_its_own_blocks_is_compiled(post, tmp_path):
    from dashboard.detection import runs
    from dashboard.detection.models import Alert
    from dashboard.evidence.models import CompileEvent

    run = _ingest(post, tmp_path, "realism_clean.tgz", "realism-compile-ddp-cold-shared")
    assert CompileEvent.objects.filter(run=run, frame=WRAPPER).count() == 3  # the wrappers are there, empty
    assert runs.compiled_work(run, runs.read_compiled(run)).work == {}
    assert run.id in {r.id for r in runs.just_ended()}
    runs.check_ended(run)
    assert not Alert.objects.filter(run=run).exists()


@pytest.mark.django_db
def test_a_model_of_torch_nn_containers_under_compiled_ddp_runs_eager(post, tmp_path):
    from dashboard.detection import runs
    from dashboard.detection.models import Alert

    run = _ingest(post, tmp_path, "realism_controls.tgz", "realism-containers-cold-private")
    work = runs.compiled_work(run, runs.read_compiled(run))
    assert sorted(work.work) == [0, 1] and work.ended == {0, 1}
    assert all(w.graphs == 0 and w.empty == 3 and w.first_step == 0 for w in work.work.values())
    assert WRAPPER in work.work[0].empty_frames
    runs.check_ended(run)
    alert = Alert.objects.get(run=run, kind="ineffective_compile")
    assert alert.ranks == [0, 1] and alert.subject == "run" and "runs mostly eager" in alert.message
    assert "realism_job.py:129 train_step via contextlib.__init__" in alert.message
