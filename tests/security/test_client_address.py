"""Issue 39, item 5, the rule itself (`dashboard.web.edge.client_address`): which address is the
client's, from the socket's peer and X-Forwarded-For. Against a real server: test_connections.py."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard.web.edge import client_address, trusted_networks

TRUSTED = trusted_networks(["10.0.0.0/8", "2001:db8::1"])


@pytest.mark.parametrize(
    "peer, forwarded, client",
    [
        ("203.0.113.7", ["198.51.100.1"], "203.0.113.7"),  # an untrusted peer: its header is its own say
        ("10.0.0.2", [], "10.0.0.2"),  # a proxy that forwarded nothing
        ("10.0.0.2", ["6.6.6.6", "198.51.100.1"], "198.51.100.1"),  # the right-most untrusted entry
        ("10.0.0.2", ["198.51.100.1", "10.9.9.9"], "198.51.100.1"),  # past a second trusted proxy
        ("10.0.0.2", ["10.1.1.1", "10.9.9.9"], "10.1.1.1"),  # every hop trusted: the farthest
        ("10.0.0.2", ["6.6.6.6", "not-an-address"], "10.0.0.2"),  # garbage where the client should be
        ("2001:db8::1", ["2001:db8::2"], "2001:db8::2"),
    ],
)
def test_the_client_is_the_peer_unless_a_trusted_proxy_names_it(peer, forwarded, client):
    assert client_address(peer, forwarded, TRUSTED) == client


def test_a_setting_that_is_no_address_is_refused_at_start():
    with pytest.raises(ImproperlyConfigured, match="LOCKSTEP_TRUSTED_PROXIES"):
        trusted_networks(["10.0.0.0/8", "proxy.example.com"])
