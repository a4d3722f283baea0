"""Agent-supplied text reaches Slack inert (issue 29, item 5): `&`, `<` and `>` escaped in every Slack
text field, so `<!channel>` or `<https://evil|Open run>` neither pings nor links, and every sink bounds
its fields. Real pipeline (findings -> incident -> outbox -> transports) against local receivers."""

from __future__ import annotations

import pytest

from dashboard.delivery import transports
from tests.delivery.pipeline import apply, crash, deliver, run, sinks  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_sinks_allowed(settings):
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True  # the receivers listen on 127.0.0.1


def test_agent_text_reaches_slack_inert_and_every_sink_bounded(run, sinks):
    evil = "<!channel> click <https://evil.example|Open run> & <@U123> " + "x" * 20000
    apply(run, crash(2, message=evil))
    deliver()
    body = sinks["slack"].bodies()[0]
    texts = [
        body["text"],
        body["attachments"][0]["title"],
        body["attachments"][0]["text"],
        *(f["value"] for f in body["attachments"][0]["fields"]),
    ]
    assert all("<" not in t and ">" not in t for t in texts)
    assert (
        "&lt;!channel&gt; click &lt;https://evil.example|Open run&gt; &amp; &lt;@U123&gt;"
        in body["attachments"][0]["text"]
    )
    assert all(len(t) <= transports.TEXT_MAX_CHARS * 5 for t in texts)
    (am,) = sinks["alertmanager"].active()
    assert len(am["annotations"]["description"]) <= transports.TEXT_MAX_CHARS
    assert all(len(v) <= transports.SHORT_MAX_CHARS for v in am["labels"].values())
    assert len(sinks["pagerduty"].bodies()[0]["payload"]["summary"]) <= 1024
    assert len(sinks["json"].bodies()[0]["incident"]["root"]["message"]) <= transports.TEXT_MAX_CHARS
