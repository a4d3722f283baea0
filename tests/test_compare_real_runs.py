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
