"""Links both ways (issue 18, item 5): a real agent in a real training loop that uses W&B (offline)
and MLflow (a file: store) sends both runs in `rank_start.links` to the running server, the run
page links to them, and each of those runs holds the Lockstep run's URL. The agent never imports
either library itself; from the environment alone it still names them."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import mlflow
import pytest
from django.contrib.auth.models import User
from django.test import Client

from agents import links
from dashboard.tenancy.models import Rank
from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.stack import ROOT, unique


def test_the_environment_names_the_runs_without_the_libraries():
    env = {
        "WANDB_RUN_ID": "abc123",
        "WANDB_PROJECT": "llm",
        "WANDB_ENTITY": "team a",
        "MLFLOW_RUN_ID": "f00d",
        "MLFLOW_TRACKING_URI": "https://mlflow.example/",
        "MLFLOW_EXPERIMENT_ID": "7",
    }
    assert links.wandb_from_env(env) == "https://wandb.ai/team%20a/llm/runs/abc123"
    assert (
        links.wandb_from_env({**env, "WANDB_BASE_URL": "https://api.wandb.example"})
        == "https://wandb.example/team%20a/llm/runs/abc123"
    )
    assert links.wandb_from_env({k: v for k, v in env.items() if k != "WANDB_ENTITY"}) is None
    assert links.mlflow_from_env(env) == "https://mlflow.example/#/experiments/7/runs/f00d"
    assert links.mlflow_from_env({**env, "MLFLOW_TRACKING_URI": "sqlite:///m.db"}) is None
    assert links.lockstep_run_url("http://lockstep:8000/", "job-1") == "http://lockstep:8000/runs/job-1/"


def test_an_attached_agent_imports_neither_library_and_sends_the_links_from_the_environment(tmp_path):
    code = (
        "import json, sys, agents; a = agents.attach(); "
        "start = a._rank_start(); a.close(timeout=1); "
        "print(json.dumps({'links': start.links, 'imported': [m for m in ('wandb', 'mlflow') if m in sys.modules]}))"
    )
    env = dict(
        os.environ,
        LOCKSTEP_OFFLINE="1",
        LOCKSTEP_SPOOL_DIR=str(tmp_path),
        LOCKSTEP_PROGRESS_EVERY="0",
        WANDB_RUN_ID="r1",
        WANDB_PROJECT="p",
        WANDB_ENTITY="e",
        MLFLOW_RUN_ID="m1",
        MLFLOW_TRACKING_URI="http://mlflow:5000",
        MLFLOW_EXPERIMENT_ID="0",
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {
        "imported": [],
        "links": {"wandb": "https://wandb.ai/e/p/runs/r1", "mlflow": "http://mlflow:5000/#/experiments/0/runs/m1"},
    }


@pytest.mark.e2e
@pytest.mark.usefixtures("live_db")
def test_a_training_loop_with_wandb_and_mlflow_links_both_ways(stack, tmp_path, monkeypatch):
    project, token = project_with_token("links")
    key = unique("links-run")
    store = f"file://{tmp_path / 'mlruns'}"
    out = tmp_path / "facts.json"
    env = {k: v for k, v in stack.env.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env.update(
        LOCKSTEP_URL=stack.url,
        LOCKSTEP_TOKEN=token,
        LOCKSTEP_RUN=key,
        LOCKSTEP_SPOOL_DIR=str(tmp_path / "spool"),
        WANDB_MODE="offline",
        WANDB_DIR=str(tmp_path),
        WANDB_SILENT="true",
        MLFLOW_TRACKING_URI=store,
        MLFLOW_ALLOW_FILE_STORE="true",
        OMP_NUM_THREADS="1",
    )
    job = subprocess.run(
        [sys.executable, "-m", "agents", "run", "tests/agents/links_job.py", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
    facts = json.loads(out.read_text())
    page = f"{stack.url}/runs/{key}/"

    assert facts["wandb_config"]["lockstep_url"] == page  # what the W&B run holds
    [record] = glob.glob(os.path.join(facts["wandb_dir"], "..", "*.wandb"))
    data = open(record, "rb").read()
    assert b"lockstep_url" in data and json.dumps(page).encode() in data  # and what its offline file will sync
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 wants the file store opted into
    tags = mlflow.MlflowClient(store).get_run(facts["mlflow_id"]).data.tags
    assert tags["lockstep.url"] == page

    [info] = Rank.objects.filter(run__project=project, run__key=key).values_list("info", flat=True)
    mlflow_run = f"{store}/{facts['mlflow_experiment']}/{facts['mlflow_id']}"
    assert info["links"] == {"wandb": facts["wandb_url"], "mlflow": mlflow_run}
    assert facts["wandb_url"].endswith(f"/lockstep-tests/lockstep-links/runs/{facts['wandb_id']}")

    html = _run_page(project, key)
    assert f'data-tool="wandb" href="{facts["wandb_url"]}"' in html
    assert (
        f'<span class="run-link" data-tool="mlflow">MLflow run <code>{mlflow_run}</code>' in html
    )  # a path, not a link


@pytest.mark.django_db
def test_the_run_page_links_http_urls_only_and_names_other_ranks(post, project):
    links_of = {
        0: {"wandb": "https://wandb.ai/e/p/runs/r0", "mlflow": "javascript:alert(1)"},
        1: {"wandb": "https://wandb.ai/e/p/runs/r1"},
        9: {"wandb": "https://wandb.ai/e/p/runs/r9"},
    }
    for rank, sent in links_of.items():
        batch = make_batch(run="linked", rank=rank, world_size=10, events=[{"t": "rank_start", "links": sent}])
        assert post(batch).status_code == 200
    html = _run_page(project, "linked")
    assert 'data-tool="wandb" href="https://wandb.ai/e/p/runs/r0"' in html
    assert 'href="https://wandb.ai/e/p/runs/r1"' in html and "(rank 1)" in html
    assert "runs/r9" not in html  # past the first ranks: never read
    assert 'href="javascript:' not in html and "<code>javascript:alert(1)</code>" in html


def _run_page(project, key: str) -> str:
    member = User.objects.create_user(unique("viewer"))
    project.members.add(member)
    client = Client()
    client.force_login(member)
    response = client.get(f"/runs/{key}/")
    assert response.status_code == 200
    return response.content.decode()


WHY_NOT_JOB = """
import torch, wandb
wandb.init(mode="offline", project="no-entity")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()
wandb.finish()
"""


def test_an_offline_wandb_run_without_an_entity_says_why_it_has_no_link(tmp_path):
    from agents import protocol

    from .conftest import events_of, read_spool

    script = tmp_path / "job.py"
    script.write_text(WHY_NOT_JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "LOCKSTEP_"))}
    env.update(
        LOCKSTEP_OFFLINE="1",
        LOCKSTEP_SPOOL_DIR=str(tmp_path / "spool"),
        WANDB_DIR=str(tmp_path),
        WANDB_SILENT="true",
        HOME=str(tmp_path),
        OMP_NUM_THREADS="1",
    )
    job = subprocess.run(
        [sys.executable, "-m", "agents", "run", str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stderr[-4000:]
    starts = [e for e in events_of(read_spool(str(tmp_path / "spool"))[0]) if isinstance(e, protocol.RankStart)]
    why = starts[-1].links["wandb"]
    assert why.startswith("offline run ") and "(project no-entity) has no URL until `wandb sync " in why
    assert "offline-run-" in why and "WANDB_ENTITY" in why
    assert "not linked" not in job.stderr  # said at debug only: the job's output stays the job's
