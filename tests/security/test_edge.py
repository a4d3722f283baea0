"""Issue 29 against one running server (uvicorn + a Celery worker with beat, started here with small
bounds): what an attacker or an unlucky operator tried, and what each now gets.

Items: 1 (/metrics closed without a token), 2 (graph-text quotas, a real agent), 3 (every
route's body limit and deadline at the edge), 4 (a held table lock: quick 503s, a worker that
fails fast, nothing lost), 6 ((session, seq) per project), 7 (the CLI's output), 9 (login
throttling per address). The in-process rules are in test_access_rules.py.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from datetime import timedelta

import psycopg
import pytest
import requests
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from agents import protocol
from agents.config import resolve
from agents.graph_texts import GraphTexts
from agents.spool import list_batches
from agents.transport import Transport
from dashboard.detection import lifecycle
from dashboard.detection.rules import Finding
from dashboard.evidence.models import Blob, CompileEvent, IngestSession, StepReport
from dashboard.ledger.models import CompileSlot
from dashboard.tenancy.models import Run
from ingest import metrics
from tests.conftest import make_batch
from tests.e2e.jobs import project_with_token
from tests.security import raw_http
from tests.stack import ROOT, database_url, started_stack, unique

pytestmark = [pytest.mark.e2e]
BODY_TIMEOUT_S = 2
LOCK_TIMEOUT_S = 1
QUOTA_DAY = 150_000
QUOTA = 250_000
ASKS_PER_RUN = 8
FAILURES = 3


@pytest.fixture(scope="module")
def edge(stack_env, tmp_path_factory):
    logs = tmp_path_factory.mktemp("edge")
    env = {
        **stack_env,
        "LOCKSTEP_BODY_TIMEOUT": str(BODY_TIMEOUT_S),
        "LOCKSTEP_DB_LOCK_TIMEOUT": str(LOCK_TIMEOUT_S),
        "LOCKSTEP_RETRY_AFTER": "1",
        "LOCKSTEP_BLOB_QUOTA": str(QUOTA),
        "LOCKSTEP_BLOB_QUOTA_DAY": str(QUOTA_DAY),
        "LOCKSTEP_BLOB_ASKS_PER_RUN": str(ASKS_PER_RUN),
        "LOCKSTEP_METRICS_TOKEN": "",
        "LOCKSTEP_METRICS_PUBLIC": "0",
        "LOCKSTEP_LOGIN_FAILURES": str(FAILURES),
    }
    with started_stack(env, logs, "edge") as running:
        yield running


@pytest.fixture(autouse=True)
def quick_agent(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_FLUSH_INTERVAL", "0.05")
    monkeypatch.setenv("LOCKSTEP_HEARTBEAT", "1000")


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _post(edge, token: str, batch: dict) -> requests.Response:
    return requests.post(
        f"{edge.url}/api/v1/ingest", json=batch, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _raw(edge, head: str, body: bytes = b"") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", int(edge.url.rsplit(":", 1)[1])), timeout=15)
    conn.sendall(head.encode() + body)
    return conn


# item 1 ------------------------------------------------------------------------------------------


def test_metrics_are_refused_until_a_token_is_set(edge, live_db):
    project, token = project_with_token("metrics-secret-name")
    assert _post(edge, token, make_batch(run=unique("metrics"))).status_code == 200
    answer = requests.get(f"{edge.url}/metrics", timeout=10)
    assert answer.status_code == 403 and "LOCKSTEP_METRICS_TOKEN" in answer.json()["error"]
    assert project.name not in answer.text


# item 2 ------------------------------------------------------------------------------------------


def _compile(hashes: list[str], index: int) -> dict:
    return {
        "t": "compile",
        "frame": f"m.py:{index}:forward",
        "index": 0,
        "hashes": {f"a{i}": {"raw": "ab" * 16, "norm": h} for i, h in enumerate(hashes)},
    }


def _texts(n: int, size: int, tag: str) -> dict[str, str]:
    texts = [f"# {tag} {i}\n" + "x" * size for i in range(n)]
    return {protocol.blob_hash(t): t for t in texts}


def _upload(edge, token: str, texts: dict[str, str]) -> requests.Response:
    body = {"v": 1, "blobs": [{"hash": h, "text": t} for h, t in texts.items()]}
    return requests.post(
        f"{edge.url}/api/v1/blobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def test_graph_texts_are_bounded_per_project_per_day_in_all_and_per_run(edge, live_db):
    project, token = project_with_token("blob-flood")
    key = unique("flood")
    many = _texts(12, 100, "asks")
    asked = _post(edge, token, make_batch(run=key, world_size=1, events=[_compile(list(many), 0)])).json()["want_blobs"]
    assert len(asked) == ASKS_PER_RUN  # a run is asked for so many texts, however many it names
    more = _texts(3, 100, "more")
    assert (
        _post(edge, token, make_batch(run=key, world_size=1, seq=1, events=[_compile(list(more), 1)])).json()[
            "want_blobs"
        ]
        == []
    )

    big = _texts(3, 60_000, "big")  # 180 kB in one upload: past the day's 150 kB
    other = unique("flood-b")
    assert sorted(
        _post(edge, token, make_batch(run=other, world_size=1, events=[_compile(list(big), 0)])).json()["want_blobs"]
    ) == sorted(big)
    refused = _upload(edge, token, big)
    assert refused.status_code == 429 and "LOCKSTEP_BLOB_QUOTA_DAY" in refused.json()["error"]
    assert not Blob.objects.filter(hash__in=list(big), text__isnull=False).exists()  # nothing of it stored

    first = dict(list(big.items())[:2])  # 120 kB: within the day
    assert _upload(edge, token, first).json()["stored"] == sorted(first)
    Blob.objects.filter(hash__in=list(first)).update(
        stored_at=timezone.now() - timedelta(days=2)
    )  # before today's window
    rest = _texts(3, 50_000, "rest")  # 150 kB more: 270 kB in all, past the total of 250 kB
    assert (
        len(
            _post(edge, token, make_batch(run=other, world_size=1, seq=1, events=[_compile(list(rest), 1)])).json()[
                "want_blobs"
            ]
        )
        == 3
    )
    full = _upload(edge, token, rest)
    assert full.status_code == 507 and "LOCKSTEP_BLOB_QUOTA" in full.json()["error"]
    stored = sum(Blob.objects.filter(project=project, text__isnull=False).values_list("size", flat=True))
    assert stored <= QUOTA
    assert f'lockstep_blob_bytes{{project="{project.name}"}} {float(stored)}' in metrics.render().decode()


def test_a_real_agent_past_the_quota_drops_texts_and_loses_no_event(edge, live_db, tmp_path):
    project, token = project_with_token("blob-agent")
    key = unique("agent-texts")
    texts = GraphTexts()
    hashes = []
    for i in range(12):
        text = f"# graph {i}\n" + "y" * 30_000  # 360 kB in all, named a few at a time
        texts.keep(protocol.blob_hash(text), text)
        hashes.append(protocol.blob_hash(text))
    agent = Transport(
        resolve(url=edge.url, token=token, run=key, rank=0, world_size=1, spool_dir=str(tmp_path / "spool")),
        on_blobs=texts.bodies,
    )
    for i in range(0, 12, 3):
        agent.put(
            protocol.Compile(
                frame=f"m.py:{i}:forward",
                index=0,
                hashes={f"a{j}": protocol.GraphHash(raw="ab" * 16, norm=h) for j, h in enumerate(hashes[i : i + 3])},
            )
        )
        time.sleep(0.3)
    started = time.monotonic()
    agent.close(timeout=10)
    assert time.monotonic() - started < 5  # nothing to retry
    stored = sum(Blob.objects.filter(project=project, text__isnull=False).values_list("size", flat=True))
    print(
        f"\nblob quota: {stored} bytes stored of {len(hashes) * 30_000} offered, "
        f"{agent.stats['blobs_not_needed']} upload(s) refused as not needed"
    )
    assert 0 < stored <= QUOTA_DAY
    assert CompileEvent.objects.filter(run__key=key).count() == 4  # every event kept: only texts are dropped
    assert agent.stats["dropped_events"] == 0 and not list_batches(str(tmp_path / "spool"))


# item 3 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/flight-recorder", "/login/", "/admin/login/", "/api/v1/silences"])
def test_every_route_refuses_a_huge_declared_body_from_the_headers(edge, path):
    started = time.monotonic()
    status, answer = raw_http.answer(
        _raw(
            edge,
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer lst_forged\r\nContent-Length: {600 * 1024 * 1024}\r\n\r\n",
        )
    )
    assert status == 413 and b"body exceeds" in answer
    assert time.monotonic() - started < 2  # not one byte of the body was waited for


def test_a_stalled_body_on_the_login_page_is_cut_at_the_body_deadline(edge):
    started = time.monotonic()
    status, _ = raw_http.answer(
        _raw(
            edge,
            "POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            "Content-Length: 3000\r\n\r\n",
            b"username=a",
        )
    )
    assert status == 408
    assert BODY_TIMEOUT_S - 0.5 <= time.monotonic() - started < BODY_TIMEOUT_S + 3


def test_a_64_mib_ingest_body_gets_a_413_the_client_can_read(edge, live_db):
    _, token = project_with_token("huge")
    size = 64 * 1024 * 1024
    conn = _raw(
        edge,
        f"POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {size}\r\n\r\n",
    )
    chunk = b"x" * 1024 * 1024
    for _ in range(64):
        conn.sendall(chunk)  # the whole body, as an HTTP/1.1 client sends it before reading
    status, answer = raw_http.answer(conn)
    assert status == 413 and b"body exceeds" in answer


# item 4 ------------------------------------------------------------------------------------------


def test_a_held_table_lock_costs_quick_503s_and_a_failed_sweep_and_loses_nothing(edge, live_db, tmp_path):
    _, token = project_with_token("locked")
    key = unique("locked")
    agent = Transport(
        resolve(url=edge.url, token=token, run=key, rank=0, world_size=1, spool_dir=str(tmp_path / "spool"))
    )
    for step in range(10):
        agent.put(protocol.Step(step=step))
    _wait(lambda: StepReport.objects.filter(run__key=key).count() == 10)
    from django.conf import settings

    holder = psycopg.connect(database_url(settings.DATABASES["default"]))
    holder.execute(f"LOCK TABLE {IngestSession._meta.db_table}, {CompileSlot._meta.db_table} IN ACCESS EXCLUSIVE MODE")
    worker_log = edge.worker.log.read_text(errors="replace")
    try:
        for step in range(10, 20):
            agent.put(protocol.Step(step=step))
        started = time.monotonic()
        answer = _post(
            edge, token, make_batch(run=key, world_size=1, session="probe-session", events=[{"t": "step", "step": 99}])
        )
        waited = time.monotonic() - started
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1", answer.text
        assert "lock" in answer.json()["error"]
        assert waited < LOCK_TIMEOUT_S + 2  # not as long as the lock is held
        _wait(lambda: "lock timeout" in edge.worker.log.read_text(errors="replace")[len(worker_log) :], timeout=10)
    finally:
        holder.rollback()
        holder.close()
    agent.close(timeout=30)
    steps = sorted(StepReport.objects.filter(run__key=key).values_list("step", flat=True))
    print(
        f"\nlock drill: probe answered 503 in {waited:.2f} s while the lock was held; {len(steps)} of 20 steps stored"
    )
    assert steps == list(range(20))  # none lost, none twice
    assert agent.stats["dropped_events"] == 0


# item 6 ------------------------------------------------------------------------------------------


def test_a_session_id_learned_by_another_project_takes_nothing_of_its_batches(edge, live_db):
    _, victim = project_with_token("session-victim")
    _, attacker = project_with_token("session-attacker")
    session, key = unique("sess-known"), unique("job")
    for seq in range(3):  # the attacker claims the victim's (session, seq) first, with other content
        assert (
            _post(
                edge,
                attacker,
                make_batch(
                    run=unique("decoy"),
                    world_size=1,
                    session=session,
                    seq=seq,
                    events=[{"t": "step", "step": 1000 + seq}],
                ),
            ).status_code
            == 200
        )
    answers = [
        _post(
            edge,
            victim,
            make_batch(run=key, world_size=1, session=session, seq=seq, events=[{"t": "step", "step": seq}]),
        )
        for seq in range(3)
    ]
    assert [(a.status_code, a.json()["duplicate"]) for a in answers] == [(200, False)] * 3
    assert sorted(StepReport.objects.filter(run__key=key).values_list("step", flat=True)) == [0, 1, 2]
    resent = _post(
        edge, victim, make_batch(run=key, world_size=1, session=session, seq=0, events=[{"t": "step", "step": 0}])
    )
    assert resent.json()["duplicate"] is True  # idempotency itself still holds


# item 7 ------------------------------------------------------------------------------------------

HOSTILE = "\x1b[2J\x1b]8;;https://evil.example\x07Open run\x1b]8;;\x07 \x9b31m\u202etxt.exe"


def test_the_cli_prints_no_control_character_of_server_text(edge, live_db):
    project, token = project_with_token("cli-escapes")
    key = unique("esc")
    assert _post(edge, token, make_batch(run=key, world_size=2)).status_code == 200
    run = Run.objects.get(project=project, key=key)
    with transaction.atomic():
        lifecycle.record(run, Finding("critical", (1,), HOSTILE, step=0, kind="grad_divergence", subject="grad:ddp"))
    env = {**edge.env, "LOCKSTEP_URL": edge.url, "LOCKSTEP_TOKEN": token, "XDG_CONFIG_HOME": "/nonexistent"}
    for args in (["alerts", key], ["runs"]):
        out = subprocess.run(
            [sys.executable, "-m", "lockstep_cli", *args], cwd=ROOT, env=env, capture_output=True, timeout=60
        )
        text = out.stdout.decode() + out.stderr.decode()
        assert not any(c in text for c in "\x1b\x07\x9b\u202e"), repr(text)
        assert out.returncode == 0 and (key if args[0] == "runs" else "Open run") in text  # there, defused


# item 9 ------------------------------------------------------------------------------------------


def _login(edge, user: str, password: str) -> int:
    http = requests.Session()
    http.get(f"{edge.url}/login/", timeout=10)
    return http.post(
        f"{edge.url}/login/",
        data={"username": user, "password": password, "csrfmiddlewaretoken": http.cookies["csrftoken"]},
        headers={"Referer": f"{edge.url}/login/"},
        timeout=10,
        allow_redirects=False,
    ).status_code


def test_wrong_passwords_lock_the_address_out_even_for_the_right_one(edge, live_db):
    from axes.utils import reset

    victim, bystander = unique("victim"), unique("bystander")
    User.objects.create_user(victim, password="right-password")
    User.objects.create_user(bystander, password="their-password")
    try:
        tries = [_login(edge, victim, f"guess-{i}") for i in range(FAILURES)]
        assert tries[: FAILURES - 1] == [200] * (FAILURES - 1)  # the form again, with its error
        assert _login(edge, victim, "right-password") == 429
        assert _login(edge, bystander, "their-password") == 429  # per address: the same client, another user
    finally:
        reset()
    assert _login(edge, victim, "right-password") == 302


# item 12 -----------------------------------------------------------------------------------------


def test_a_superuser_sees_only_the_projects_they_are_a_member_of_on_every_door(edge, live_db):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    project, token = project_with_token("not-root-s")
    key = unique("private")
    assert _post(edge, token, make_batch(run=key, world_size=1)).status_code == 200
    root = User.objects.create_superuser(unique("root"), password="pw")
    client = Client()
    client.force_login(root)
    http = requests.Session()
    http.cookies.set("sessionid", client.cookies["sessionid"].value)
    assert key not in {r["key"] for r in http.get(f"{edge.url}/api/v1/runs", timeout=10).json()["runs"]}
    assert http.get(f"{edge.url}/api/v1/runs/{key}", timeout=10).status_code == 404
    assert http.get(f"{edge.url}/runs/{key}/", timeout=10).status_code == 404
    assert key not in http.get(f"{edge.url}/", timeout=10).text
    with pytest.raises(InvalidStatus):
        connect(
            edge.url.replace("http", "ws") + f"/ws/runs/{key}/",
            open_timeout=10,
            additional_headers={"Origin": edge.url, "Cookie": f"sessionid={client.cookies['sessionid'].value}"},
        )
    project.members.add(root)  # a member now: the same doors open
    assert http.get(f"{edge.url}/api/v1/runs/{key}", timeout=10).status_code == 200
    connect(
        edge.url.replace("http", "ws") + f"/ws/runs/{key}/",
        open_timeout=10,
        additional_headers={"Origin": edge.url, "Cookie": f"sessionid={client.cookies['sessionid'].value}"},
    ).close()
