"""The JSON webhook's schema: a URL, and an optional signing key (the signed body itself is pinned
end to end in tests/delivery/test_sinks.py)."""

from __future__ import annotations

from dashboard.delivery import transports
from dashboard.delivery.sinks.json import JsonWebhook


def test_a_json_webhook_needs_a_url_and_may_sign_its_bodies():
    assert JsonWebhook.problem("", "") == {"url": "a JSON webhook needs a URL"}
    assert JsonWebhook.problem("https://in.example/hook", "") == {}
    assert JsonWebhook.problem("https://in.example/hook", "key") == {}
    assert (
        transports.signature("key", b"{}") == "a777724d943eb48dc69bca8a4a6d57a04db3f9ec7e1de4e581e860265bdf3032"
    )  # HMAC-SHA256, hex
