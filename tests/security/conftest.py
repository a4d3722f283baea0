"""The adversarial suite (issue 17): a real stack (uvicorn + Celery, tests/stack.py) and two
projects, A (the victim) and B (the attacker), each with a token and a member's session."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
import requests
from django.db import transaction
from django.utils import timezone

from dashboard.detection import lifecycle, silences
from dashboard.detection.models import Alert, Silence
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import TOKEN_SCOPES, Project, Run
from tests.conftest import make_batch
from tests.e2e.jobs import member_session, project_with_token
from tests.stack import unique


@dataclass
class Side:
    project: Project
    token: str
    session: str
    key: str

    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Victim(Side):
    run: Run
    alert: Alert
    silence: Silence


def _side(stack, name: str) -> tuple[Project, str, str, str]:
    project, token = project_with_token(name, TOKEN_SCOPES)  # every scope: the strongest token a side holds
    key = unique(f"{name}-job-77")
    answer = requests.post(
        f"{stack.url}/api/v1/ingest",
        json=make_batch(run=key, world_size=2),
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    return project, token, member_session(project, f"{name}-member"), key


@pytest.fixture
def victim(stack, live_db) -> Victim:
    project, token, session, key = _side(stack, "team-a")
    run = Run.objects.get(project=project, key=key)
    with transaction.atomic():
        alert = lifecycle.record(
            run, Finding("critical", (1,), "rank 1 diverged", step=0, kind="grad_divergence", subject="grad:ddp")
        )[0]
    silence = silences.create(
        project.id,
        run,
        kind="grad_divergence",
        rank=1,
        until=timezone.now() + timedelta(hours=1),
        comment="known flaky node",
        author=None,
    )
    return Victim(project, token, session, key, run, alert, silence)


@pytest.fixture
def attacker(stack, live_db) -> Side:
    return Side(*_side(stack, "team-b"))
