"""cache_divergence on a real multi-rank TORCH_TRACE (tests/fixtures/cache_split_trace.tgz, made by
tests/fixtures/make_cache_trace.sh: 3 CPU ranks under torchrun, torch 2.13; ranks 0 and 1 start with
a warm TORCHINDUCTOR_CACHE_DIR each, rank 2 with an empty one, and rank 1 alone recompiles on an odd
batch at step 2), replayed as `python -m agents replay` sends it, through the real ingest endpoint,
settled as the Celery task does."""

from __future__ import annotations

import os
import tarfile

import pytest

from agents import protocol
from agents.replay import batches
from dashboard.detection import settle, subjects
from dashboard.detection.models import Alert
from dashboard.ledger.models import CompileSlot

pytestmark = pytest.mark.django_db

TRACE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "cache_split_trace.tgz")
FRAME = "ddp_job.py:96:main"


def replay(post, tmp_path, key: str) -> None:
    with tarfile.open(TRACE) as tar:
        tar.extractall(tmp_path, filter="data")
    for batch in batches(str(tmp_path), key):
        response = post(protocol.encode(batch))
        assert response.status_code == 200, response.content
    for slot in CompileSlot.objects.filter(run__key=key).order_by("index"):
        settle.settle_compile(slot.id)


def test_a_cold_rank_and_a_lone_recompile_get_cache_findings_with_their_own_ranks(post, tmp_path):
    replay(post, tmp_path, "cache-split")
    alerts = {(a.kind, a.subject): a for a in Alert.objects.filter(run__key="cache-split")}
    cold = alerts[("cache_divergence", subjects.frame(FRAME))]
    assert (cold.ranks, cold.frame, cold.severity) == ([2], FRAME, "info")
    assert cold.details["stages"] == {
        "inductor": {"hit": [0, 1], "miss": [2]},
        "aotautograd": {"hit": [0, 1], "miss": [2]},
    }
    assert "cause" not in cold.details
    assert cold.message.startswith("Rank 2 missed the FX graph and AOTAutograd caches for ddp_job.py:96:main")

    lone = alerts[("cache_divergence", subjects.recompile_lookups(FRAME))]
    recompile = alerts[("recompile_divergence", subjects.frame(FRAME))]
    assert (lone.ranks, lone.frame, lone.step) == ([1], FRAME, recompile.step)
    assert (lone.details["compile_index"], lone.details["cause"]) == (1, "recompile_divergence")
    assert lone.details["stages"] == {"inductor": {"miss": [1]}, "aotautograd": {"miss": [1]}}
    assert recompile.ranks == [1] and recompile.details["index"] == 1
    assert lone.incident_id == recompile.incident_id and recompile.incident.root_id == recompile.id
    # rank 2's misses alone are information; here they explain its slow compile (time skew), so they
    # join that incident below its root
    straggler = alerts[("compile_straggler", subjects.frame(FRAME))]
    assert (cold.severity, straggler.ranks) == ("info", [2])
    assert cold.incident_id == straggler.incident_id and straggler.incident.root_id == straggler.id
    assert {key for key in alerts if key[0] == "cache_divergence"} == {
        ("cache_divergence", subjects.frame(FRAME)),
        ("cache_divergence", subjects.recompile_lookups(FRAME)),
    }
