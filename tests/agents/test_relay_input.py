"""What the node relay accepts from an agent before it puts the batch into a bulk body."""
from __future__ import annotations

import gzip

import pytest

from agents import protocol, relay


def test_a_gzip_body_becomes_its_exact_json_trimmed():
    body = b'{"v":1,"seq":3}'
    assert relay.read_batch(gzip.compress(body + b"\n"), "gzip") == body
    assert relay.read_batch(b"  " + body, "") == body


@pytest.mark.parametrize("raw", [
    b'{"v":1},{"v":1,"rank":0}',  # a second batch riding along would shift every other agent's answer
    b'{"v":1}]}',
    b'[{"v":1}]',
    b'"text"',
    b"{not json",
])
def test_anything_but_one_json_object_is_refused(raw):
    with pytest.raises(ValueError):  # msgspec.DecodeError is one
        relay.read_batch(raw, "")


def test_truncated_and_unknown_encodings_are_refused():
    with pytest.raises(ValueError):
        relay.read_batch(gzip.compress(b'{"v":1}')[:-6], "gzip")
    with pytest.raises(ValueError):
        relay.read_batch(b'{"v":1}', "br")


def test_a_bulk_body_round_trips_the_batches_byte_for_byte():
    batches = [b'{"v":1,"rank":0}', b'{"v":1,"rank":1,"events":[]}']
    assert protocol.decode_bulk(protocol.bulk_body(batches)) == batches
