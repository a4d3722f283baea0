"""Steady-state wire volume: consecutive `grad` events of one group become one compact `grads`
event (base64 u64s instead of ~20 decimal digits each, one JSON frame for many steps; P7)."""

from __future__ import annotations

import math

from agents import protocol


def compact(events: list[protocol.Event]) -> list[protocol.AnyEvent]:
    """Same information, fewer bytes: runs of Grad (same group, bucket count and step stride) are
    packed; everything else keeps its place. The server treats both forms identically."""
    out: list[protocol.Event] = []
    run: list[protocol.Grad] = []
    for event in events:
        if isinstance(event, protocol.Grad) and event.fps and _extends(run, event):
            run.append(event)
            continue
        out.extend(_pack(run))
        run = [event] if isinstance(event, protocol.Grad) and event.fps else []
        if not run:
            out.append(event)
    out.extend(_pack(run))
    return protocol.wire_events(out)


def _extends(run: list[protocol.Grad], event: protocol.Grad) -> bool:
    if not run:
        return True
    last = run[-1]
    if event.group != last.group or len(event.fps) != len(last.fps) or len(run) >= protocol.MAX_GRADS_STEPS:
        return False
    stride = event.step - last.step
    return stride > 0 and (len(run) == 1 or stride == last.step - run[-2].step)


def _pack(run: list[protocol.Grad]) -> list[protocol.Event]:
    if not run:
        return []
    stride = run[1].step - run[0].step if len(run) > 1 else 1
    norms = [g.norm for g in run]
    # JSON has no NaN/Inf (they would go out as null and sink the batch): keep norms only when all are finite
    extra = {"norms": norms} if all(n is not None and math.isfinite(n) for n in norms) else {}
    if any(g.nonfinite for g in run):
        extra["nonfinite"] = [g.nonfinite for g in run]
    return [
        protocol.Grads.pack(run[0].step, [g.fps for g in run], group=run[0].group, stride=stride, ts=run[0].ts, **extra)
    ]
