"""The e2e files' shared fixture: a project, its agent token (which may also choose a baseline, as a CI
step would) and a member's live alert feed."""

from __future__ import annotations

import uuid

import pytest

from dashboard.tenancy.models import BASELINE, DEFAULT_SCOPES
from tests.e2e.jobs import alert_feed, member_session, project_with_token


@pytest.fixture
def team(stack):
    project, token = project_with_token(f"sc-{uuid.uuid4().hex[:6]}", (*DEFAULT_SCOPES, BASELINE))
    feed = alert_feed(stack, member_session(project, f"u-{uuid.uuid4().hex[:6]}"))
    yield token, feed
    feed.ws.close()
