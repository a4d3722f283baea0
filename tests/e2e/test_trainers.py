"""The trainers teams use, under the zero-code agent (`torchrun -m agents run script.py`): the Hugging
Face Trainer (`TrainingArguments(torch_compile=True)`), Lightning (`strategy="ddp"`, a compiled
LightningModule) and Accelerate (`Accelerator(dynamo_backend=...)`), 3 ranks on the CPU over gloo
(demo/hf_trainer_job.py, demo/lightning_job.py, demo/accelerate_job.py).

Recorded offline by tests/fixtures/make_trainer_fixtures.sh and uploaded with `python -m agents
upload` (the suite pays for no job): a clean run of each raises nothing (trainers_clean.tgz), and
rank 2's fault in the Hugging Face Trainer (ten times the learning rate) and in the Accelerate loop
(a row more in a batch) is one incident at rank 2 (trainers_faults.tgz). One rank's fault under
Lightning runs live, so the agent's own handling of a trainer (Lightning passes the step a closure
that runs the forward and backward after the optimizer's pre-hook) is proven by every run of the
suite. In each fault: exactly one incident, rooted at that rank, and no alert naming any other rank
(the trainer's own machinery, its wrappers, graph breaks and collectives, raises nothing of its own).
`python -m bench fault_matrix --faults hf_lr,hf_shape,lightning_lr,lightning_shape,accelerate_lr,accelerate_shape`
runs every fault live."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.jobs import api, finish, project_with_token, running, torchrun
from tests.e2e.test_realism_fixtures import alerts, upload_all, wait_settled

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]
CLEAN = ["trainer-accelerate-clean", "trainer-hf-clean", "trainer-lightning-clean"]
FAULTS = {"trainer-accelerate-shape": "recompile_divergence", "trainer-hf-lr": "param_divergence"}


def test_recorded_trainer_runs_clean_and_at_fault(stack, tmp_path):
    project, token = project_with_token("trainers")
    clean = upload_all(stack, token, "trainers_clean.tgz", tmp_path / "clean")
    faults = upload_all(stack, token, "trainers_faults.tgz", tmp_path / "faults")
    assert (clean, faults) == (CLEAN, sorted(FAULTS))
    wait_settled(project, clean + faults)
    raised = {
        key: [f"{a.kind} ranks={a.ranks} {a.frame}: {a.message[:200]}" for a in alerts(project, key)] for key in clean
    }
    assert raised == {key: [] for key in clean}
    incidents = {key: api(stack, token, f"/runs/{key}/incidents").json()["incidents"] for key in clean + faults}
    assert {key: incidents[key] for key in clean} == {key: [] for key in clean}
    for key, root in FAULTS.items():
        stored = [(a.kind, a.ranks, a.step, a.message[:200]) for a in alerts(project, key)]
        assert [(i["root"]["kind"], i["root"]["ranks"]) for i in incidents[key]] == [(root, [2])], (key, stored)
        assert all(ranks == [2] for _, ranks, _, _ in stored), (key, stored)


def test_one_rank_fault_under_lightning_is_one_incident_at_that_rank(stack, tmp_path):
    """Rank 2 of 3 feeds a row more at step 1: it alone recompiles. Lightning is given the aot_eager
    backend through its own option: the same frames, graphs, breaks and recompiles as Inductor at half
    the CPU (no C++ kernels to build); the recordings compiled with Inductor."""
    project, token = project_with_token("trainer-fault")
    key = f"trainer-shape-{uuid.uuid4().hex[:6]}"
    args = ["--steps", "3", "--fault", "shape", "--fault-rank", "2", "--fault-step", "1", "--backend", "aot_eager"]
    with running(torchrun(stack, token, key, "demo/lightning_job.py", args, tmp_path / "spool")) as job:
        finish(job)
    wait_settled(project, [key], sweeps=3.0)
    found = api(stack, token, f"/runs/{key}/incidents").json()["incidents"]
    stored = [(a.kind, a.ranks, a.step, a.message[:200]) for a in alerts(project, key)]
    assert [(i["root"]["kind"], i["root"]["ranks"]) for i in found] == [("recompile_divergence", [2])], stored
    assert all(ranks == [2] for _, ranks, _, _ in stored), stored
