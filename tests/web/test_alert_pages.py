"""A run's alerts a page at a time (issue 51, item 8): the alerts API (`?page=`, `alerts_page` naming
the next), the alerts page (a page of rows and a link to the next, its filters kept) and the CLI,
which follows the pages where it lists every alert. Was: 2,500 alerts in one answer (1.3 MiB),
500 rows on the page (1.3 MiB)."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.detection.models import Alert
from dashboard.tenancy.models import Run
from dashboard.web.paging import ALERTS_PER_PAGE
from lockstep_cli import main
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
ALERTS = 250


@pytest.fixture
def noisy_run(post) -> Run:
    post(make_batch(run="noisy"))
    run = Run.objects.get(key="noisy")
    Alert.objects.bulk_create(
        Alert(run=run, kind="grad_divergence", subject=f"slot:{i}", severity="critical", ranks=[1], message=f"m{i}")
        for i in range(ALERTS)
    )
    return run


def test_the_alerts_api_serves_a_page_at_a_time_and_names_the_next(client, token, noisy_run):
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    first = client.get("/api/v1/runs/noisy/alerts", **bearer)
    body = first.json()
    assert len(body["alerts"]) == ALERTS_PER_PAGE and len(first.content) < 128 * 1024
    assert body["alerts_page"] == {"page": 1, "pages": 3, "per_page": 100, "next": "/api/v1/runs/noisy/alerts?page=2"}
    seen = [a["id"] for a in body["alerts"]]
    while body["alerts_page"]["next"]:
        body = client.get(body["alerts_page"]["next"], **bearer).json()
        seen += [a["id"] for a in body["alerts"]]
    assert seen == sorted(seen, reverse=True) and sorted(seen) == sorted(noisy_run.alerts.values_list("id", flat=True))
    assert client.get("/api/v1/runs/noisy/alerts?page=4", **bearer).json()["alerts"] == []
    refused = client.get("/api/v1/runs/noisy/alerts?page=0", **bearer)
    assert refused.status_code == 400 and refused.json()["path"] == "page"


def test_the_alerts_page_shows_a_page_of_rows_and_links_the_next_with_its_filters(project, noisy_run):
    user = User.objects.create_user("noisy-viewer", password="pw-noisy-123")
    project.members.add(user)
    browser = Client()
    browser.force_login(user)
    page = browser.get("/alerts/?run=noisy").content.decode()
    assert page.count('class="alert-row') == ALERTS_PER_PAGE and "1–100 of 250" in page
    assert 'href="?run=noisy&amp;page=2#alerts"' in page
    last = browser.get("/alerts/?run=noisy&page=3").content.decode()
    assert last.count('class="alert-row') == ALERTS - 2 * ALERTS_PER_PAGE
    assert re.search(r'href="\?run=noisy&amp;page=2#alerts">previous', last) and ">next<" not in last
    assert browser.get("/alerts/?run=noisy&page=x").status_code == 404


class ThroughTheApi:
    """The CLI's client, answered by this process's read API (Django's test client)."""

    def __init__(self, client, token: str) -> None:
        self.client, self.token = client, token

    def get(self, path: str, **params: str) -> dict:
        answer = self.client.get(f"/api/v1{path}", params, HTTP_AUTHORIZATION=f"Bearer {self.token}")
        assert answer.status_code == 200, answer.content
        return answer.json()


def test_the_cli_lists_every_alert_following_the_pages(client, token, noisy_run, capsys):
    args = argparse.Namespace(run="noisy", follow=False)
    assert main.alerts_cmd(ThroughTheApi(client, token), args, as_json=True) == 0
    listed = json.loads(capsys.readouterr().out)["alerts"]
    assert len(listed) == len({a["id"] for a in listed}) == ALERTS
