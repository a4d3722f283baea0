"""Every sink through the running stack: batches posted to uvicorn, slots settled, alerts raised and
grouped into an incident by the Celery worker (with its beat sweep), the incident's pages sent by its
tasks to local receivers that speak Alertmanager's, PagerDuty's and a JSON webhook's API; a refused
first attempt is sent again by the sweep after its backoff, with the same dedup key; the run's end
closes it everywhere (ended unresolved: PagerDuty resolves its page, Lockstep keeps the outcome)."""

from __future__ import annotations

import itertools
import time

import pytest
import requests

from dashboard.delivery.models import Webhook
from tests.conftest import make_batch
from tests.delivery.receivers import AlertmanagerReceiver, JsonReceiver, PagerDutyReceiver
from tests.e2e.jobs import project_with_token
from tests.stack import unique

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]

KEY = "0123456789abcdef0123456789ABCDEF"


def wait(condition, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.2)


def test_the_worker_delivers_to_every_sink_retries_with_one_dedup_key_and_resolves(stack):
    project, token = project_with_token("sinks")
    am, pd, js = AlertmanagerReceiver(), PagerDutyReceiver(KEY), JsonReceiver()
    try:
        Webhook.objects.create(project=project, kind="alertmanager", url=am.url)
        Webhook.objects.create(project=project, kind="pagerduty", url=pd.url + "/v2/enqueue", secret=KEY)
        Webhook.objects.create(project=project, kind="json", url=js.url + "/in")
        pd.fail_next = 1
        run = unique("sinks-run")

        def report(step: int, bad: set[int], end: bool = False) -> None:
            for rank in range(3):
                events = [{"t": "grad", "step": step, "fps": [step, 9 if rank in bad else 0]}]
                events += [{"t": "rank_end", "status": "ok", "exit_code": 0}] if end else []
                batch = make_batch(run=run, rank=rank, session=f"{run}-{rank}-{step}", events=events)
                response = requests.post(
                    f"{stack.url}/api/v1/ingest", json=batch, timeout=10, headers={"Authorization": f"Bearer {token}"}
                )
                assert response.status_code == 200, response.text

        beats = itertools.count()
        last_beat = [0.0]

        def alive() -> bool:
            """The job goes on (heartbeats every 2 s), as while PagerDuty's retry waits out its backoff: a
            run whose every rank fell silent is over, and its end would close the incident."""
            if time.monotonic() - last_beat[0] >= 2:
                last_beat[0] = time.monotonic()
                seq = next(beats)
                for rank in range(3):
                    batch = make_batch(
                        run=run, rank=rank, session=f"{run}-{rank}-hb", seq=seq, events=[{"t": "heartbeat"}]
                    )
                    requests.post(
                        f"{stack.url}/api/v1/ingest",
                        json=batch,
                        timeout=10,
                        headers={"Authorization": f"Bearer {token}"},
                    ).raise_for_status()
            return True

        report(0, {1})
        wait(
            lambda: alive() and am.active() and list(pd.incidents.values()) == ["triggered"] and js.requests,
            "alert delivered",
        )
        [firing] = am.active()
        incident = js.bodies()[0]["incident"]
        assert (firing["labels"]["run"], firing["labels"]["ranks"], firing["labels"]["severity"]) == (
            run,
            "1",
            "critical",
        )
        assert firing["labels"]["project"] == project.name and firing["labels"]["alertname"] == "grad_divergence"
        assert firing["labels"]["incident"] == str(incident["id"]) and incident["root"]["ranks"] == [1]
        assert len(pd.requests) == 2  # the refused attempt, then the sweep's retry after the backoff

        report(1, set(), end=True)  # the run ends: its incident ends unresolved, closed everywhere
        wait(
            lambda: not am.active() and list(pd.incidents.values()) == ["resolved"] and len(js.requests) == 2,
            "resolve delivered",
        )
        events = pd.bodies()
        assert [e["event_action"] for e in events] == ["trigger", "trigger", "resolve"]
        assert {e["dedup_key"] for e in events} == {f"lockstep-incident-{incident['id']}"}
        assert js.bodies()[1]["incident"]["state"] == "ended_unresolved" and len(am.alerts) == 1
        assert {c.get("state") for c in js.bodies()[1]["incident"]["consequences"]} <= {"ended_unresolved"}
    finally:
        for receiver in (am, pd, js):
            receiver.close()
