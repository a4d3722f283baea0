"""The frame page of a lone recompile names who dissented (issue 52, item 6; was: "1 / 4 reported ...
Dissenters: none", as the slot's own dissenters only compare the graphs of the ranks that reported it)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from dashboard.ledger.models import CompileSlot
from dashboard.tenancy.models import Run
from tests.fixtures.pages_data import FRAMES, Job, job_batches, settle_all

pytestmark = pytest.mark.django_db


def frame_page(client, post, project, job: Job) -> str:
    for batch in job_batches(job):
        assert post(batch).status_code == 200
    settle_all(Run.objects.get(key=job.key))
    user = User.objects.create_user("reader")
    project.members.add(user)
    client.force_login(user)
    response = client.get(f"/runs/{job.key}/frame/", {"f": FRAMES[0]})
    assert response.status_code == 200
    return response.content.decode()


def slot_row(html: str, index: int) -> str:
    """The row of compile #index in the table of compile slots."""
    table = html.split('<table class="slots">', 1)[1].split("</table>", 1)[0]
    [row] = [r for r in re.findall(r"<tr[^>]*>.*?</tr>", table, re.S) if r.split("</td>", 1)[0].endswith(f">{index}")]
    return row


def test_the_rank_that_recompiled_alone_is_the_dissenter(client, post, project):
    html = frame_page(client, post, project, Job("lone", recompile=(1, 5)))
    assert CompileSlot.objects.get(run__key="lone", frame=FRAMES[0], index=1).dissenters == []
    row = slot_row(html, 1)
    assert "1 / 4" in row and "1 (recompiled alone)" in row and "none" not in row and 'class="dissent"' in row
    assert "none" in slot_row(html, 0)  # every rank compiled #0 alike
    assert "Compile #1 is a recompile not every rank made; the odd ranks out: 1 (recompiled alone)" in html
