"""One registry of sink kinds, read by the model's choices, the TOML loader and delivery alike."""

from __future__ import annotations

import pytest

from dashboard.delivery import sinks, sinks_file
from dashboard.delivery.models import Webhook
from dashboard.delivery.sinks import Sink
from dashboard.delivery.sinks.slack import SlackWebhook


def test_sinks_are_registered_by_kind_and_cannot_shadow_one_another():
    assert sinks.SINKS["slack"] is SlackWebhook
    assert isinstance(sinks.for_webhook(Webhook(url="http://x")), SlackWebhook)
    with pytest.raises(TypeError, match="slack"):
        type("AnotherSlack", (Sink,), {"kind": "slack", "label": "another"})
    assert sinks.SINKS["slack"] is SlackWebhook


def test_the_model_and_the_sinks_file_offer_exactly_the_registered_kinds():
    assert sorted(sinks.kinds()) == ["alertmanager", "json", "pagerduty", "slack"]
    assert Webhook._meta.get_field("kind").choices == sinks.choices()
    assert sorted(sinks.kinds(stateful=True)) == ["alertmanager", "pagerduty"]
    with pytest.raises(sinks_file.SinksFileError, match="is not one of"):
        sinks_file.parse('[[destination]]\nproject = "p"\nkind = "fax"\n', {})
