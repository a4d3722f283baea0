"""The node relay (`python -m agents relay`) between real agents and the real server.

A 2-rank compiled DDP job sends through the relay: everything lands once, in bulk requests. Then
hand-made batches: a bad one beside good ones is refused alone, a resend through the relay or
straight to the server is a duplicate, and with the server gone the agent is told to retry.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections import Counter

import pytest
import requests

from agents import protocol
from agents import relay as relay_module
from agents.transport import encode_body, post
from dashboard.evidence.models import Blob, CompileEvent, GradReport, StepReport
from tests import claims
from tests.conftest import per_rank
from tests.e2e.jobs import finish, project_with_token, running, torchrun
from tests.stack import Proc, free_port, spawn

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]


def relay(stack, upstream: str, logdir, window: float = 0.3) -> tuple[Proc, str]:
    port = free_port()
    proc = spawn(
        f"relay-{port}",
        [
            sys.executable,
            "-m",
            "agents",
            "relay",
            "--listen",
            f"127.0.0.1:{port}",
            "--url",
            upstream,
            "--window",
            str(window),
        ],
        stack.env,
        logdir,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            requests.get(url + "/healthz", timeout=2)
            return proc, url
        except requests.RequestException:
            assert proc.popen.poll() is None, proc.tail()
            time.sleep(0.1)
    raise AssertionError(f"relay did not come up:\n{proc.tail()}")


def batch(key: str, rank: int, seq: int = 0, world_size: int = 3) -> protocol.Batch:
    return protocol.Batch(
        v=1,
        run=protocol.RunInfo(key=key, world_size=world_size),
        rank=rank,
        session=f"relay-test-{key}-{rank}",
        seq=seq,
        events=[protocol.Grads.pack(0, [[rank + 1, 7]] * 4)],
    )


def post_together(url: str, token: str | list[str], batches: list[protocol.Batch]) -> list:
    """POST each batch from its own thread at once, as the ranks of a node do (one token, or one each)."""
    outcomes = [None] * len(batches)
    tokens = token if isinstance(token, list) else [token] * len(batches)

    def one(i: int) -> None:
        outcomes[i] = post(url, tokens[i], encode_body(batches[i]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_a_real_job_through_the_relay(stack, tmp_path):
    _, token = project_with_token("relay")
    proc, url = relay(stack, stack.url, tmp_path, window=relay_module.WINDOW_S)  # the default: the ranks flush together
    key = f"relay-{uuid.uuid4().hex[:6]}"
    try:
        via = type(stack)(url, stack.env, stack.server, stack.worker)
        with running(
            torchrun(
                via, token, key, "demo/ddp_job.py", ["--steps", "6", "--sleep", "0.3"], tmp_path / "spool", ranks=2
            )
        ) as job:
            finish(job)
        reports = per_rank(GradReport.objects.filter(run__key=key, group="ddp"))
        assert Counter(rank for rank, _, _ in reports) == {0: 6, 1: 6}
        # real DDP replicas agree bitwise (fingerprints and norms): a step both ranks sent through one
        # window is stored once, listing both (a step whose reports straddle two windows is not)
        shared = GradReport.objects.filter(run__key=key, group="ddp", ranks__len=2)
        assert shared.exists(), list(GradReport.objects.filter(run__key=key).values_list("step", "ranks"))
        assert StepReport.objects.filter(run__key=key).count() == 12
        # the graph texts the server asked for went up through the relay, verified against their hashes
        compiled = CompileEvent.objects.filter(run__key=key).values_list("graph_norm", "code_norm")
        hashes = {h for pair in compiled for h in pair if h}
        assert (
            hashes
            and set(Blob.objects.filter(hash__in=hashes, text__isnull=False).values_list("hash", flat=True)) == hashes
        )
        sent = requests.get(url + "/healthz", timeout=5).json()
        assert sent["bulk"] >= 1, sent  # the two ranks' batches went up together
        assert sent["batches"] == claims.count(run__key=key)
    finally:
        proc.stop()


def test_one_bad_batch_duplicates_and_a_server_gone(stack, tmp_path):
    _, token = project_with_token("relay")
    proc, url = relay(stack, stack.url, tmp_path)
    key = f"relay-{uuid.uuid4().hex[:6]}"
    try:
        bad = batch(key, 5)  # rank 5 of world size 3: proven malformed, so the agent quarantines it
        outcomes = post_together(url, token, [batch(key, 0), bad, batch(key, 1)])
        assert [o.kind for o in outcomes] == ["ok", "quarantine", "ok"], [o.detail for o in outcomes]
        assert "HTTP 400" in outcomes[1].detail and "rank" in outcomes[1].detail
        assert sorted({rank for rank, _, _ in per_rank(GradReport.objects.filter(run__key=key))}) == [0, 1]

        again = post_together(url, token, [batch(key, 0), batch(key, 1), batch(key, 2)])
        assert [(o.kind, o.reply.duplicate, o.reply.accepted) for o in again] == [
            ("ok", True, 0),
            ("ok", True, 0),
            ("ok", False, 1),
        ]
        direct = post(stack.url, token, encode_body(batch(key, 2)))
        assert direct.kind == "ok" and direct.reply.duplicate
        assert len(per_rank(GradReport.objects.filter(run__key=key))) == 12
        assert json.loads(requests.get(url + "/healthz", timeout=5).text)["bulk"] >= 2
        # two projects' jobs on one node: each batch goes up under its own token
        _, other_token = project_with_token("relay-other")
        other = f"relay-{uuid.uuid4().hex[:6]}"
        mixed = post_together(url, [token, other_token], [batch(key, 0, seq=1), batch(other, 0)])
        assert [(o.kind, o.reply.accepted) for o in mixed] == [("ok", 1), ("ok", 1)]
        assert (
            len(per_rank(GradReport.objects.filter(run__key=other, run__project__name__startswith="relay-other"))) == 4
        )
    finally:
        proc.stop()

    proc, url = relay(stack, f"http://127.0.0.1:{free_port()}", tmp_path)  # nothing listens upstream
    try:
        [gone] = post_together(url, token, [batch(key, 0, seq=2)])
        assert gone.kind == "retry" and gone.delay == 1.0, gone
    finally:
        proc.stop()
