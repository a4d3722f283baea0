"""The trainers teams use, under the zero-code agent (`torchrun -m agents run script.py`): the Hugging
Face Trainer (`TrainingArguments(torch_compile=True)`), Lightning (`strategy="ddp"`, a compiled
LightningModule) and Accelerate (`Accelerator(dynamo_backend=...)`), 3 ranks on the CPU over gloo
(demo/hf_trainer_job.py, demo/lightning_job.py, demo/accelerate_job.py).

A clean run of each raises nothing: recorded offline (tests/fixtures/trainers_clean.tgz,
tests/fixtures/make_trainer_fixtures.sh) and uploaded with `python -m agents upload`, so the suite
pays for no clean job. One rank's fault in each is one live job: exactly one incident, rooted at
that rank, and no alert naming any other rank (the trainer's own machinery, its wrappers, graph
breaks and collectives, raises nothing of its own)."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.jobs import api, finish, project_with_token, running, torchrun
from tests.e2e.test_realism_fixtures import alerts, upload_all, wait_settled

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]
CLEAN = ["trainer-accelerate-clean", "trainer-hf-clean", "trainer-lightning-clean"]


def test_clean_trainer_runs_raise_no_alert(stack, tmp_path):
    project, token = project_with_token("trainers")
    keys = upload_all(stack, token, "trainers_clean.tgz", tmp_path / "clean")
    assert keys == CLEAN
    wait_settled(project, keys)
    raised = {
        key: [f"{a.kind} ranks={a.ranks} {a.frame}: {a.message[:200]}" for a in alerts(project, key)] for key in keys
    }
    assert raised == {key: [] for key in keys}
    assert {key: api(stack, token, f"/runs/{key}/incidents").json()["incidents"] for key in keys} == {
        key: [] for key in keys
    }


@pytest.mark.parametrize(
    ("script", "fault", "steps", "root"),
    [
        ("demo/hf_trainer_job.py", "lr", 2, "param_divergence"),  # seen in the weights after step 0
        ("demo/lightning_job.py", "shape", 3, "recompile_divergence"),
        ("demo/accelerate_job.py", "shape", 3, "recompile_divergence"),
    ],
    ids=["hf-trainer-lr", "lightning-shape", "accelerate-shape"],
)
def test_one_rank_fault_is_one_incident_at_that_rank(stack, tmp_path, script, fault, steps, root):
    """Rank 2 of 3 at fault. The trainers are given the aot_eager backend, through their own option: the
    same frames, graphs, breaks and recompiles as Inductor at half the CPU (no C++ kernels to build);
    the clean recordings compiled with Inductor."""
    project, token = project_with_token("trainer-fault")
    key = f"trainer-{fault}-{uuid.uuid4().hex[:6]}"
    args = ["--steps", str(steps), "--fault", fault, "--fault-rank", "2", "--fault-step", "1", "--backend", "aot_eager"]
    with running(torchrun(stack, token, key, script, args, tmp_path / "spool")) as job:
        finish(job)
    wait_settled(project, [key], sweeps=3.0)
    found = api(stack, token, f"/runs/{key}/incidents").json()["incidents"]
    stored = [(a.kind, a.ranks, a.step, a.message[:200]) for a in alerts(project, key)]
    assert [(i["root"]["kind"], i["root"]["ranks"]) for i in found] == [(root, [2])], stored
    assert all(ranks == [2] for _, ranks, _, _ in stored), stored
