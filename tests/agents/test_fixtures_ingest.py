"""Real spools and traces through the real server path: the H200 NCCL job, the CPU job, replay.

`tests/fixtures/ddp_h200_spool.tgz` is the offline spool of `torchrun --nproc-per-node 2 -m agents
run demo/ddp_job.py --steps 12 --shape-rank 1 --shape-step 3` on 2 x H200 (torch 2.11, NCCL);
`ddp_cpu213_spool.tgz` the same job here (torch 2.13, gloo). Each spooled body is POSTed to
/api/v1/ingest as `python -m agents upload` would send it.
"""

from __future__ import annotations

import os
import tarfile

import pytest

from agents.spool import list_batches

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
TRACE = os.path.join(FIXTURES, "trace_211_cuda.tgz")


def _unpack(name: str, into) -> str:
    with tarfile.open(os.path.join(FIXTURES, name)) as tar:
        tar.extractall(into, filter="data")
    return str(into)


def _upload(post, directory: str) -> list:
    replies = []
    for path in list_batches(directory):
        with open(path, "rb") as f:
            body = f.read()
        headers = {"HTTP_CONTENT_ENCODING": "gzip"} if body[:2] == b"\x1f\x8b" else {}
        response = post(body, headers=headers)
        assert response.status_code == 200, (path, response.content)
        replies.append(response.json())
    return replies


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fixture,key,torch_major,steps",
    [
        ("ddp_h200_spool.tgz", "h200-ddp-nccl", "2.11", 12),
        ("ddp_cpu213_spool.tgz", "cpu213-ddp-gloo", "2.13", 12),
    ],
)
def test_real_spool_uploads_with_both_ranks_compiles_and_agreeing_grads(
    post, tmp_path, fixture, key, torch_major, steps
):
    from dashboard.evidence.models import CompileEvent, GradReport
    from dashboard.tenancy.models import Rank, Run

    directory = _unpack(fixture, tmp_path)
    replies = _upload(post, directory)
    assert replies and not any(r["duplicate"] for r in replies)
    run = Run.objects.get(key=key)
    assert run.world_size == 2 and run.torch_version.startswith(torch_major)
    assert sorted(Rank.objects.filter(run=run).values_list("rank", flat=True)) == [0, 1]
    compiles = {r: list(CompileEvent.objects.filter(run=run, rank=r).order_by("index")) for r in (0, 1)}
    assert compiles[0] and compiles[1]
    recompiles = {r: [c for c in cs if c.index > 0] for r, cs in compiles.items()}
    assert recompiles[0] == []
    assert len(recompiles[1]) == 1 and recompiles[1][0].step == 3
    assert "size mismatch" in recompiles[1][0].recompile_reason
    grads = {}
    for g in GradReport.objects.filter(run=run, group="ddp"):
        for rank in g.ranks:
            grads.setdefault(g.step, {})[rank] = list(g.fps)
    assert sorted(grads) == list(range(steps))
    for step, by_rank in grads.items():
        assert sorted(by_rank) == [0, 1] and by_rank[0] == by_rank[1], step  # replicas agree bitwise
    # Uploading the same spool again stores nothing twice.
    before = (CompileEvent.objects.filter(run=run).count(), GradReport.objects.filter(run=run).count())
    assert all(r["duplicate"] for r in _upload(post, directory))
    assert (CompileEvent.objects.filter(run=run).count(), GradReport.objects.filter(run=run).count()) == before


def test_replay_fixture_trace_rank1_recompiles_rank0_does_not(tmp_path):
    from agents import protocol
    from agents.replay import batches

    with tarfile.open(TRACE) as tar:
        tar.extractall(tmp_path, filter="data")
    found = batches(str(tmp_path), "replayed-211")
    ranks = {b.rank for b in found}
    assert ranks == {0, 1} and all(b.run.world_size == 2 for b in found)
    events = {r: [e for b in found if b.rank == r for e in b.events] for r in ranks}
    for r in ranks:
        assert isinstance(events[r][0], protocol.RankStart) and isinstance(events[r][-1], protocol.RankEnd)
    compiles = {r: [e for e in evs if isinstance(e, protocol.Compile)] for r, evs in events.items()}
    recompiles = {r: [c for c in cs if c.index > 0] for r, cs in compiles.items()}
    assert recompiles[0] == []
    assert len(recompiles[1]) == 1 and "size mismatch" in recompiles[1][0].recompile_reason
    gather = {r: next(c for c in cs if c.frame.endswith(":gather")) for r, cs in compiles.items()}
    assert {"dynamo", "inductor", "collectives"} <= set(gather[0].hashes)
    assert gather[0].hashes["dynamo"].norm == gather[1].hashes["dynamo"].norm
    assert gather[0].hashes["dynamo"].raw != gather[1].hashes["dynamo"].raw  # cuda:0 vs cuda:1
    assert gather[0].cache == {"aotautograd": "miss", "inductor": "miss"}
    assert any(isinstance(e, protocol.GraphBreak) for e in events[0])
    # Same files, same sessions: a second replay is deduplicated by the server.
    again = batches(str(tmp_path), "replayed-211")
    assert [(b.session, b.seq) for b in again] == [(b.session, b.seq) for b in found]


@pytest.mark.django_db
def test_replay_cli_into_spool_then_ingest(post, tmp_path):
    import subprocess
    import sys

    from dashboard.evidence.models import CompileEvent
    from dashboard.tenancy.models import Run

    from .conftest import REPO

    with tarfile.open(TRACE) as tar:
        tar.extractall(tmp_path / "trace", filter="data")
    cmd = [
        sys.executable,
        "-m",
        "agents",
        "replay",
        str(tmp_path / "trace"),
        "--run",
        "replay-cli",
        "--spool-dir",
        str(tmp_path / "spool"),
    ]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("replayed: 2 batches") and "0 failed" in out.stdout  # one summary line
    _upload(post, str(tmp_path / "spool"))
    run = Run.objects.get(key="replay-cli")
    assert CompileEvent.objects.filter(run=run, rank=1, index=1).exists()
    assert not CompileEvent.objects.filter(run=run, rank=0, index__gt=0).exists()


def _settle_everything(run) -> None:
    """What the Celery worker does once every rank has reported or ended: settle each slot, then the
    run-level checks of the sweep."""
    from dashboard.detection import runs, settle
    from dashboard.ledger.models import CompileSlot, GradSlot

    for slot_id in CompileSlot.objects.filter(run=run).order_by("id").values_list("id", flat=True):
        settle.settle_compile(slot_id)
    for slot_id in GradSlot.objects.filter(run=run).order_by("step", "id").values_list("id", flat=True):
        settle.settle_grad(slot_id)
    runs.check(run)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "fixture,key", [("ddp_h200_spool.tgz", "h200-ddp-nccl"), ("ddp_cpu213_spool.tgz", "cpu213-ddp-gloo")]
)
def test_real_spool_raises_no_rank_specific_artifact(post, tmp_path, fixture, key):
    """Both recorded jobs ran their 2 ranks on one host with the default Inductor cache dir
    (/tmp/torchinductor_root), so the ranks truly shared it. On the H200 the FX-graph cache keys
    differ per rank (cuda:0 / cuda:1 is in the key): each rank compiled its own entry, which is
    harmless. On the CPU both ranks loaded the same entry under the same key, with the same ISA
    (no codegen fact differs). Neither is a rank-specific artifact. The one alert due is rank 1's
    recompile for its 17-row batch at step 3, with the cache lookups it alone made (in its incident)."""
    from dashboard.detection.models import Alert
    from dashboard.tenancy.models import Run

    _upload(post, _unpack(fixture, tmp_path))
    run = Run.objects.get(key=key)
    _settle_everything(run)
    alerts = {a.kind: a for a in Alert.objects.filter(run=run)}
    assert "rank_specific_artifact" not in alerts, alerts["rank_specific_artifact"].message
    assert set(alerts) == {"recompile_divergence", "cache_divergence"}, {k: a.message for k, a in alerts.items()}
    recompile, lookups = alerts["recompile_divergence"], alerts["cache_divergence"]
    assert (recompile.ranks, recompile.step, recompile.severity) == ([1], 3, "critical")
    assert (lookups.ranks, lookups.frame, lookups.details["cause"]) == ([1], recompile.frame, "recompile_divergence")
    assert lookups.incident_id == recompile.incident_id
