"""The compare page's promise on real recordings of one job: torch 2.11 on 2 x H200 (NCCL) against
torch 2.13 on this CPU (gloo), both uploaded from the agent's offline spools in tests/fixtures."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from tests.agents.test_fixtures_ingest import _unpack, _upload

pytestmark = pytest.mark.django_db
H200, CPU = "h200-ddp-nccl", "cpu213-ddp-gloo"


@pytest.fixture
def both_runs(post, tmp_path):
    for name in ("ddp_h200_spool.tgz", "ddp_cpu213_spool.tgz"):
        _upload(post, _unpack(name, tmp_path / name))


def test_compare_api_shows_the_version_diff_and_aligned_frames(client, token, both_runs):
    body = client.get(f"/api/v1/compare?runs={H200},{CPU}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    env = {row["field"]: row for row in body["environment"]}
    torch_row = env["versions.torch"]
    assert not torch_row["same"]
    assert torch_row["values"][0].startswith("2.11") and torch_row["values"][1].startswith("2.13")
    assert [r["key"] for r in body["runs"]] == [H200, CPU]
    assert body["frames"] and body["compile_summary"]
    assert set(body["step_times"]) == {H200, CPU}


def test_compare_page_renders_both_versions(client, project, both_runs):
    user = User.objects.create_user("cmp")
    project.members.add(user)
    client.force_login(user)
    page = client.get(f"/compare/?runs={H200}&runs={CPU}")
    assert page.status_code == 200
    html = page.content.decode()
    assert "2.11" in html and "2.13" in html


# --- one job (demo/compare_job.py) recorded under torch 2.11 and 2.13 ------------------------
# tests/fixtures/make_compare_fixtures.sh made compare_211_* on the GPU machine's image (python 3.12,
# torch 2.11, CPU gloo) and compare_213_* here (python 3.11, torch 2.13): two installs, two prefixes.
V211, V213 = "compare-211", "compare-213"


@pytest.fixture
def versions(post, tmp_path):
    for name in ("compare_211_spool.tgz", "compare_213_spool.tgz"):
        _upload(post, _unpack(name, tmp_path / name))


def _compare(client, token, query: str) -> dict:
    response = client.get(f"/api/v1/compare?{query}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    return response.json()


def test_every_frame_of_the_job_aligns_across_torch_versions_by_the_users_names(client, token, versions):
    body = _compare(client, token, f"runs={V211},{V213}")
    assert [r["torch_version"] for r in body["runs"]] == ["2.11.0+cu130", "2.13.0+cpu"]
    frames = {row["key"]: row for row in body["frames"]}
    assert set(frames) == {"compare_job.py:forward", "compare_job.py:loss_fn"}
    assert all(row["aligned"] for row in frames.values())
    assert frames["compare_job.py:forward"]["label"] == "compare_job.py:46 Net.forward"
    assert [c["recompiles"] for c in frames["compare_job.py:loss_fn"]["cells"]] == [1.0, 1.0]
    env = {row["field"]: row["values"] for row in body["environment"]}
    assert env["versions.python"] == ["3.12.3", "3.11.7"] and env["versions.cudnn"] == ["91900", "unknown"]


def test_settings_are_named_and_equal_settings_are_not_a_difference(client, token, versions):
    body = _compare(client, token, f"runs={V211},{V213}")
    env = {row["field"]: row for row in body["environment"]}
    assert env["settings.inductor.fallback_random"]["values"] == ["True", "True"]
    assert env["settings.dynamo.automatic_dynamic_shapes"]["same"]
    assert not [s for s in body["settings"] if s["key"].startswith("settings.")]


def test_drift_is_within_the_default_tolerance_but_not_bitwise(client, token, versions):
    body = _compare(client, token, f"runs={V211},{V213}")
    loss = body["drift"]["vs"][0]["loss"]
    assert loss["steps_compared"] == 12 and loss["first_bitwise_step"] is not None
    assert loss["first_over_tolerance"] is None and loss["within_tolerance_through"] == 11
    assert 0 < loss["max_relative"] < 1e-3
    assert body["drift"]["tolerance"] == 1e-3 and len(body["drift"]["series"][V211]["loss"]) == 12
    assert body["drift"]["vs"][0]["grad_norm"]["steps_compared"] == 12
    assert any("loss within tolerance 0.001 through step 11" in line for line in body["verdict"]["lines"])
    strict = _compare(client, token, f"runs={V211},{V213}&tol=0")["drift"]["vs"][0]["loss"]
    assert strict["first_over_tolerance"] == loss["first_bitwise_step"]


def test_a_bad_tolerance_is_a_400_naming_it(client, token, versions):
    for bad in ("abc", "-1", "nan", "inf"):
        response = client.get(f"/api/v1/compare?runs={V211},{V213}&tol={bad}", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 400 and response.json()["path"] == "tol", bad


def test_the_verdict_lists_every_aligned_frame_with_its_measures(client, token, versions):
    verdict = _compare(client, token, f"runs={V211},{V213}")["verdict"]
    assert verdict["lines"][0].startswith(
        f"{V213} (torch 2.13.0+cpu) vs {V211} (torch 2.11.0+cu130): 2 of 2 frames aligned"
    )
    rows = {row["key"]: row for row in verdict["frames"]}
    cell = rows["compare_job.py:forward"]["cells"][0]
    assert cell["guards"] == 142 and cell["kernels"] == 2.0  # per rank, both compiles and cell["cache_hit_rate"] == 0.0
    assert rows["compare_job.py:forward"]["against"][0]["status"] == "compared"


def test_the_same_job_replayed_from_its_trace_aligns_with_its_live_spool(client, token, post, tmp_path):
    """The agent and `agents replay` name frames alike; the trace gives versions, --meta the rest."""
    from agents.protocol import encode
    from agents.replay import batches

    _upload(post, _unpack("compare_213_spool.tgz", tmp_path / "spool"))
    trace = _unpack("compare_211_trace.tgz", tmp_path / "trace")
    for batch in batches(
        trace, "replayed-211", extra={"driver": "580.159.04", "settings.inductor.fallback_random": "True"}
    ):
        assert post(encode(batch)).status_code == 200
    body = _compare(client, token, f"runs=replayed-211,{V213}")
    assert all(row["aligned"] for row in body["frames"]) and len(body["frames"]) == 2
    env = {row["field"]: row["values"] for row in body["environment"]}
    assert env["versions.torch"] == ["2.11.0+cu130", "2.13.0+cpu"] and env["versions.driver"] == [
        "580.159.04",
        "unknown",
    ]
    assert env["settings.inductor.fallback_random"] == ["True", "True"]
    assert env["settings.dynamo.automatic_dynamic_shapes"] == ["unknown", "False"]  # a trace names no settings


def test_frames_stored_in_the_old_form_still_align(client, token, post):
    """Runs stored before today's frame keys: absolute install paths, cwd-relative user paths."""
    from tests.conftest import make_batch

    def compile_(frame: str) -> dict:
        return {"t": "compile", "frame": frame, "index": 0, "compile_id": "0/0", "status": "ok", "ts": 1.0}

    old = [
        "/usr/lib/python3.12/contextlib.py:105:__init__",
        "/opt/torch/.venv/lib/python3.12/site-packages/torch/x.py:3:f",
        "demo/ddp_job.py:77:head",
    ]
    new = ["contextlib.py:104:__init__", "torch/x.py:5:f", "ddp_job.py:80:Head.head"]
    for key, frames in (("old-form", old), ("new-form", new)):
        body = make_batch(run=key, rank=0, world_size=1, events=[compile_(f) for f in frames])
        assert post(body).status_code == 200
    rows = _compare(client, token, "runs=old-form,new-form")["frames"]
    assert sorted(r["key"] for r in rows) == ["contextlib.py:__init__", "ddp_job.py:head", "x.py:f"]
    assert all(r["aligned"] for r in rows)
    assert {r["label"] for r in rows} >= {"contextlib.py:105 __init__", "torch/x.py:3 f"}
