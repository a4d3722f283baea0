from agents import protocol
from agents.packing import compact


def grad(step, fps, group="ddp", norm=1.0, nonfinite=0):
    return protocol.Grad(step=step, fps=fps, group=group, norm=norm, nonfinite=nonfinite, ts=1.0)


def test_consecutive_grads_pack_into_one_event_without_losing_anything():
    hb = protocol.Heartbeat(step=3)
    events = [grad(0, [1, 2]), grad(1, [3, (1 << 64) - 1]), grad(2, [5, 6], nonfinite=1), hb]
    out = compact(events)
    assert [type(e) for e in out] == [protocol.Grads, protocol.Heartbeat]
    packed = out[0]
    assert list(packed.step_numbers()) == [0, 1, 2]
    assert packed.unpack() == [[1, 2], [3, (1 << 64) - 1], [5, 6]]
    assert packed.nonfinite == [0, 0, 1] and packed.norms == [1.0, 1.0, 1.0]
    decoded = protocol.msgspec.json.decode(protocol.encode(packed), type=protocol.Grads)
    assert decoded.unpack() == packed.unpack()


def test_runs_break_on_group_stride_or_bucket_change():
    events = [
        grad(0, [1]),
        grad(2, [1]),
        grad(4, [1]),
        grad(5, [1]),
        grad(6, [1], group="ddp.1"),
        grad(7, [1, 2], group="ddp.1"),
    ]
    out = compact(events)
    assert [(e.group, list(e.step_numbers())) for e in out] == [
        ("ddp", [0, 2, 4]),
        ("ddp", [5]),
        ("ddp.1", [6]),
        ("ddp.1", [7]),
    ]
    assert out[0].stride == 2


def test_compact_is_smaller_on_the_wire():
    events = [grad(s, [(s * 7919 + b) * 0x9E3779B97F4A7C15 % (1 << 64) for b in range(16)]) for s in range(64)]
    assert len(protocol.encode(compact(events)[0])) < 0.6 * sum(len(protocol.encode(e)) for e in events)


def test_non_finite_norms_are_left_out_rather_than_sent_as_null():
    out = compact([grad(0, [1], norm=float("nan"), nonfinite=1), grad(1, [2])])
    assert out[0].norms == [] and out[0].nonfinite == [1, 0]
    batch = protocol.Batch(
        v=1, run=protocol.RunInfo(key="k", world_size=1), rank=0, session="abcdefgh", seq=0, events=out
    )
    assert protocol.decode_batch(protocol.encode(batch)).events[0].unpack() == [[1], [2]]
