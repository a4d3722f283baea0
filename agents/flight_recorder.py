"""Flight Recorder dumps on the server's request (issue 15: what the collectives say during a hang).

torch's process groups record their collectives in a ring buffer (the Flight Recorder: NCCL, and
gloo on torch 2.13) when `TORCH_FR_BUFFER_SIZE` is set before the process group is created. At
attach, before any process group exists, the agent sets it to 2000 (torch's NCCL default) unless
the user set it (or the old name `TORCH_NCCL_TRACE_BUFFER_SIZE`) or opted out
(`LOCKSTEP_FLIGHT_RECORDER=0`). When an ingest reply says `flight_recorder: true` (the server saw a
`hang_forecast`), the sender thread takes a dump with torch's own call and posts it, bounded and
gzip'd, to `POST /api/v1/flight-recorder`. The main thread may be blocked in the collective the
dump is about: torch's dump takes only the recorder's lock, and a gloo wait releases the GIL, so the
dump works during a real hang (tests/agents/test_flight_recorder.py shows it on a real 3-rank job).

torch's dump is a pickle; the agent unpickles its own process's bytes and sends JSON, so the
server never unpickles what a client sent. Never raises.
"""

from __future__ import annotations

import gzip
import os
import pickle
import time
from typing import Any

import msgspec

from agents import normalize, protocol

_KEEP_TEXT = 512


def enable_default(buffer_size: int) -> bool:
    """Set TORCH_FR_BUFFER_SIZE for the process groups still to come; False when too late (one exists) or not wanted."""
    if buffer_size <= 0:
        return False
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return False
    except Exception:
        return False
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(buffer_size))
    return True


def _raw_dump() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("no process group")
    c10d = torch._C._distributed_c10d
    if not hasattr(c10d, "_dump_fr_trace"):
        raise RuntimeError("this torch has no Flight Recorder dump")
    dump: dict[str, Any] = pickle.loads(c10d._dump_fr_trace())
    return dump


def _text(value: object, limit: int = _KEEP_TEXT) -> str:
    return str(value if value is not None else "")[:limit]


def _int(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if 0 <= n <= protocol.NONNEG_MAX else None


def _sizes(value: Any) -> list[list[int]]:
    out: list[list[int]] = []
    for shape in list(value or [])[:64]:
        try:
            out.append([max(0, min(int(d), protocol.NONNEG_MAX)) for d in list(shape)[:64]])
        except (TypeError, ValueError):
            out.append([])
    return out


def _entry(e: dict[str, Any], frames: int) -> protocol.FREntry | None:
    record = _int(e.get("record_id"))
    if record is None:
        return None
    pg = list(e.get("process_group") or ("", ""))[:2]
    pg += [""] * (2 - len(pg))
    return protocol.FREntry(
        record_id=record,
        collective_seq_id=_int(e.get("collective_seq_id")) or 0,
        p2p_seq_id=_int(e.get("p2p_seq_id")) or 0,
        op_id=_int(e.get("op_id")) or 0,
        pg_id=_int(e.get("pg_id")) or 0,
        process_group=[_text(p) for p in pg],
        profiling_name=_text(e.get("profiling_name")),
        state=_text(e.get("state")),
        retired=bool(e.get("retired")),
        is_p2p=bool(e.get("is_p2p")),
        timeout_ms=_int(e.get("timeout_ms")),
        time_created_ns=_int(e.get("time_created_ns")),
        time_discovered_started_ns=_int(e.get("time_discovered_started_ns")) or None,
        time_discovered_completed_ns=_int(e.get("time_discovered_completed_ns")) or None,
        input_sizes=_sizes(e.get("input_sizes")),
        output_sizes=_sizes(e.get("output_sizes")),
        input_dtypes=[_text(d) for d in list(e.get("input_dtypes") or [])[:64]],
        output_dtypes=[_text(d) for d in list(e.get("output_dtypes") or [])[:64]],
        frames=[
            protocol.FRFrame(
                name=_text(f.get("name")), filename=_text(f.get("filename")), line=_int(f.get("line")) or 0
            )
            for f in call_site_frames(e.get("frames") or [], frames)
        ],
    )


def call_site_frames(frames: list[Any], limit: int) -> list[dict[str, Any]]:
    """The frames worth sending, innermost first as torch records them: never the agent's own (its
    wrapper of DDP's __init__ is not where the user called), at most `limit`, and the first frame
    outside torch among them even when torch's own frames alone fill the limit."""
    mine = [f for f in frames if isinstance(f, dict) and not normalize.is_agent_file(str(f.get("filename") or ""))]
    kept = mine[:limit]
    user = next((f for f in mine if not _in_torch(str(f.get("filename") or ""))), None)
    if user is not None and limit > 0 and user not in kept:
        kept = kept[: limit - 1] + [user]
    return kept


def _in_torch(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename


def bounded(
    raw: dict[str, Any], entries: int = protocol.MAX_FR_ENTRIES, frames: int = protocol.MAX_FR_FRAMES
) -> protocol.FRDump:
    """torch's dump dict -> the wire's FRDump: the newest `entries` entries, `frames` frames each, strings cut;
    keys a torch version lacks get their defaults."""
    kept = [x for e in (raw.get("entries") or []) if isinstance(e, dict) and (x := _entry(e, frames)) is not None]
    kept.sort(key=lambda e: e.record_id)
    config = {
        _text(pg): {_text(k): _text(v, 16_384) for k, v in (c or {}).items()}
        for pg, c in list((raw.get("pg_config") or {}).items())[:1024]
        if isinstance(c, dict)
    }
    status = {}
    for pg, st in list((raw.get("pg_status") or {}).items())[:1024]:
        if isinstance(st, dict):
            status[_text(pg)] = {
                _text(k): (
                    v if isinstance(v, int) and not isinstance(v, bool) and abs(v) <= protocol.NONNEG_MAX else _text(v)
                )
                for k, v in st.items()
            }
    return protocol.FRDump(
        version=_text(raw.get("version")),
        comm_lib_version=_text(raw.get("comm_lib_version")),
        pg_config=config,
        pg_status=status,
        entries=kept[-entries:],
    )


def body(run: str, rank: int, session: str) -> bytes:
    """The gzip'd `POST /api/v1/flight-recorder` body of a dump taken now (or of why there is none)."""
    try:
        dump = bounded(_raw_dump())
    except Exception as exc:  # no process group, a torch without the recorder, a dump that failed
        dump = protocol.FRDump(error=f"{type(exc).__name__}: {exc}"[:16_384])
    record = protocol.FlightRecord(
        v=protocol.PROTOCOL_VERSION, run=run, rank=rank, session=session, ts=time.time(), dump=dump
    )
    raw = msgspec.json.encode(record)
    while (
        len(raw) > protocol.MAX_FR_BYTES and record.dump.entries
    ):  # frames are the bulk: halve the entries until it fits
        record.dump.entries = record.dump.entries[len(record.dump.entries) // 2 + 1 :]
        raw = msgspec.json.encode(record)
    return gzip.compress(raw, 6)
