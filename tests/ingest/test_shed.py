"""When ingest last turned batches away for load (`ingest.shed`), against the real Redis: a project's
own refusals count for it alone, one refused before its project was known counts for every project."""

from __future__ import annotations

import math

from ingest import ratelimit, shed


def test_a_project_s_refusals_hold_back_its_own_silence_only():
    assert shed.seconds_since(7) == math.inf  # nothing refused yet (tests/conftest.py forgets the last test's)
    shed.refused(7)
    assert shed.seconds_since(7) < 5 and shed.seconds_since(8) == math.inf
    shed.refused(None)  # a process past its shedding point, before reading the token
    assert shed.seconds_since(8) < 5


def test_a_shedding_process_writes_a_key_at_most_once_a_second():
    shed.refused(7)
    ratelimit.client().delete(shed._key(7))
    shed.refused(7)  # within the second: not written again
    assert shed.seconds_since(7) == math.inf
    shed._written_at[shed._key(7)] -= shed.WRITE_EVERY_S
    shed.refused(7)
    assert shed.seconds_since(7) < 5
