"""The frame page puts the Inductor code behind a rank_specific_artifact alert one click away: ranks that
traced one graph but generated other code get their own code diff, or a note when only rank-specific
text differs. Through the real ingest endpoint, settle and the page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from agents.protocol import blob_hash
from dashboard.detection import settle
from dashboard.detection.models import Alert
from dashboard.ledger.models import CompileSlot
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

FRAME = "model/net.py:40:forward"
GRAPH = "def forward(self, L_x_):\n    return (L_x_.relu(),)"
AVX512 = "cpp_fused_relu_0 = async_compile.cpp_pybinding(...)\n    // vec512 kernel\n    at::vec::Vectorized<float>::loadu(in_ptr0 + x0, 16)"
AVX2 = "cpp_fused_relu_0 = async_compile.cpp_pybinding(...)\n    // vec256 kernel\n    at::vec::Vectorized<float>::loadu(in_ptr0 + x0, 8)"


def rank_start(host: str, isa: str) -> dict:
    nfs = {"path": "/mnt/shared/inductor", "fs": "nfs4", "fsid": "0", "shared": True}
    return {
        "t": "rank_start",
        "host": host,
        "device": "cpu",
        "cache_dirs": {"inductor": "/mnt/shared/inductor"},
        "cache_fs": {"inductor": nfs},
        "codegen": {"cpu_capability": isa},
    }


def compile_event(code_raw: str, code_norm: str) -> dict:
    return {
        "t": "compile",
        "frame": FRAME,
        "index": 0,
        "step": 0,
        "cache": {"inductor": "miss"},
        "cache_keys": {"inductor": "fxsamekeyforbothranks0000000000000000000000000000"},
        "hashes": {
            "dynamo": {"raw": blob_hash(GRAPH), "norm": blob_hash(GRAPH)},
            "inductor": {"raw": code_raw, "norm": code_norm},
        },
    }


@pytest.fixture
def page(client, project):
    user = User.objects.create_user("frames")
    project.members.add(user)
    client.force_login(user)
    return lambda: client.get("/runs/art/frame/", {"f": FRAME}).content.decode()


def ingest(post, codes: dict[int, tuple[str, str]]) -> None:
    for rank, (raw, norm) in codes.items():
        events = [rank_start(f"node{rank}", "AVX2" if rank else "AVX512"), compile_event(raw, norm)]
        assert post(make_batch(run="art", rank=rank, world_size=2, events=events)).status_code == 200
    settle.settle_compile(CompileSlot.objects.get(run__key="art").id)


def test_generated_code_that_differs_is_diffed_majority_against_minority(post, client, token, page):
    ingest(post, {0: ("a" * 32, blob_hash(AVX512)), 1: ("b" * 32, blob_hash(AVX2))})
    assert Alert.objects.get(kind="rank_specific_artifact").frame == FRAME
    html = page()
    assert "rank 1 (dissenter)" in html  # the graphs agree: the rank the alert names is the dissenter
    assert f'<span class="add">+inductor graph (raw): {"b" * 32}</span>' in html
    assert "Rank 1 generated other Inductor code than rank 0 (majority)" in html
    assert "not uploaded yet" in html  # hashes until the agents upload the texts
    blobs = {"v": 1, "blobs": [{"hash": blob_hash(t), "text": t} for t in (AVX512, AVX2)]}
    assert (
        client.post(
            "/api/v1/blobs", blobs, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        ).status_code
        == 200
    )
    html = page()
    assert (
        '<span class="del">-    // vec512 kernel</span>' in html
        and '<span class="add">+    // vec256 kernel</span>' in html
    )


def test_code_that_differs_only_in_rank_specific_text_is_said_in_words(post, page):
    ingest(post, {0: ("a" * 32, "c" * 32), 1: ("b" * 32, "c" * 32)})
    html = page()
    assert (
        "The Inductor code of rank 1 differs only in rank-specific text (device index / rank) that "
        "normalization removes"
    ) in html
