"""The e2e files' shared fixture: a project, its agent token and a member's live alert feed."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.jobs import alert_feed, member_session, project_with_token


@pytest.fixture
def team(stack):
    project, token = project_with_token(f"sc-{uuid.uuid4().hex[:6]}")
    feed = alert_feed(stack, member_session(project, f"u-{uuid.uuid4().hex[:6]}"))
    yield token, feed
    feed.ws.close()
