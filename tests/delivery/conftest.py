"""Delivery tests talk to receivers on 127.0.0.1: private destinations are allowed here, and the tests
of the refusal (tests/security/test_sink_urls.py) have their own."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def private_sinks_allowed(settings):
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True
