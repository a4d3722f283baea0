"""The alert reference the remedies link to (dashboard/web/pages/reference.py): docs/alerts.md
rendered, every kind the server raises with its anchor; members only; built from the rules' own
docstrings where the document is not there."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from dashboard.detection.rules import REGISTRY
from dashboard.web.pages import reference

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


def test_the_reference_is_docs_alerts_md_rendered_with_an_anchor_per_kind(client):
    """What `docs/alerts.md#kind` names is what the link shows: the document's table, each kind's
    row carrying its anchor, its columns (typical causes, what to do), and no link to a document the
    server does not serve."""
    client.force_login(User.objects.create_user("reader"))
    page = client.get("/alerts/reference/").content.decode()
    assert '<article class="doc"><h1>Alert reference</h1>' in page
    assert "<th>typical causes</th>" in page and "<th>what to do</th>" in page
    for kind in {rule.kind for rule in REGISTRY}:
        assert re.search(rf'<tr>\s*<td><a id="{kind}"></a><code>{kind}</code></td>', page), kind
    assert "run with deterministic algorithms, compare with eager" in page  # grad_divergence's row
    assert 'href="cost.md' not in page and '<span class="doc-ref" title="docs/cost.md">' in page
    assert "<h2>Incidents: one page per cause</h2>" in page


def test_without_the_document_the_reference_is_built_from_the_rules(client, monkeypatch):
    monkeypatch.setattr(reference, "doc_path", lambda: None)
    client.force_login(User.objects.create_user("reader"))
    page = client.get("/alerts/reference/").content.decode()
    assert '<section class="reference" id="grad_divergence">' in page and 'class="doc"' not in page
