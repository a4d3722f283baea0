"""The alert reference the remedies link to (dashboard/web/pages/reference.py): every kind the server
raises has its section, with what its rule looks for; members only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from dashboard.detection.rules import REGISTRY

pytestmark = pytest.mark.django_db


def test_every_registered_kind_has_a_section_with_its_rules_own_words(client):
    assert client.get("/alerts/reference/").status_code == 302  # login first
    client.force_login(User.objects.create_user("reader"))
    page = client.get("/alerts/reference/").content.decode()
    for kind in {rule.kind for rule in REGISTRY}:
        assert f'id="{kind}"' in page, kind
    assert (
        "the normalized Dynamo graphs of one compile slot differ across ranks" in page
    )  # graph_divergence's docstring
