"""`python -m agents replay TRACE_DIR --run KEY`: ingest existing TORCH_TRACE logs (docs/design.md, The agent).

A TORCH_TRACE directory holds one `dedicated_log_torch_trace_rank_<r>_<x>.log` per rank (the
files tlparse reads). Each record is one glog-prefixed line,
`V1130 02:43:12.980000 606 torch/_dynamo/utils.py:2126] {json metadata}`, followed by its
payload as lines that start with a tab. The records go through the same `CompileCapture` code
as live capture, so a replayed run carries the same Compile / GraphBreak events. Each rank's
events become batches under a session derived from (run, rank, file contents), so replaying
the same files twice stores nothing twice (the server deduplicates (session, seq)).
"""

from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any

from agents import protocol

_RANK_FILE = re.compile(r"rank_(\d+)(?:_[^/]*)?\.log$")
_GLOG = re.compile(r"^[IWEFV](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+)")
BATCH_EVENTS = 2000


def rank_files(trace_dir: str) -> dict[int, str]:
    """rank -> log path (the newest file when a rank has several)."""
    out: dict[int, str] = {}
    for path in sorted(glob.glob(os.path.join(trace_dir, "**", "*.log"), recursive=True), key=os.path.getmtime):
        m = _RANK_FILE.search(os.path.basename(path))
        if m:
            out[int(m.group(1))] = path
    return dict(sorted(out.items()))


def records(path: str) -> Iterator[tuple[dict[str, Any], str | None, str]]:
    """(metadata, payload or None, glog prefix) for each record of one trace file."""
    meta: dict[str, Any] | None = None
    prefix = ""
    payload: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("\t"):
                if meta is not None:
                    payload.append(line[1:])
                continue
            i = line.find("] {")
            if i < 0:
                continue
            if meta is not None:
                yield meta, ("".join(payload) if payload else None), prefix
            try:
                meta = json.loads(line[i + 2 :])
            except ValueError:
                meta = None
            prefix, payload = line[:i], []
    if meta is not None:
        yield meta, ("".join(payload) if payload else None), prefix


def _glog_time(prefix: str, year: int) -> float | None:
    m = _GLOG.match(prefix)
    if not m:
        return None
    mo, d, h, mi, s, frac = m.groups()
    try:
        t = _dt.datetime(year, int(mo), int(d), int(h), int(mi), int(s), tzinfo=_dt.UTC)
    except ValueError:
        return None
    return t.timestamp() + float("0." + frac)


_METRIC_VERSIONS = {
    "pytorch_version": "torch",
    "python_version": "python",
    "cuda_version": "cuda",
    "triton_version": "triton",
}
_GPU = re.compile(r"system_info\[device\]: \{'name': '([^']{1,200})'")


def trace_versions(meta: dict[str, Any], payload: str | None, versions: dict[str, str]) -> None:
    """What a trace says about the software it ran on: `compilation_metrics` names torch, Python,
    CUDA and Triton (torch >= 2.6), the FX cache's key components the GPU, the `torch_version`
    artifact torch; a value seen once is kept."""
    metrics = meta.get("compilation_metrics")
    if isinstance(metrics, dict):
        for field, name in _METRIC_VERSIONS.items():
            value = metrics.get(field)
            if isinstance(value, str) and value.strip():
                versions[name] = value.split()[0][:512]
    artifact = (meta.get("artifact") or {}).get("name", "") if isinstance(meta.get("artifact"), dict) else ""
    if artifact == "torch_version" and payload:
        versions.setdefault("torch", _torch_version(payload))
    elif artifact.startswith("fx_graph_cache") and payload and "gpu" not in versions:
        m = _GPU.search(payload)
        if m:
            versions["gpu"] = m.group(1)


def _torch_version(payload: str) -> str:
    """The `torch_version` artifact: the bare version (torch <= 2.11) or JSON naming it (2.13)."""
    try:
        value = json.loads(payload)
    except ValueError:
        return payload.strip()[:512]
    return str(value.get("pytorch_version", payload.strip()) if isinstance(value, dict) else value)[:512]


def rank_events(path: str, extra: dict[str, str] | None = None) -> list[protocol.Event]:
    """rank_start, the Compile/GraphBreak events of one rank's trace, rank_end; `extra` versions
    (`--meta key=value`: what the trace cannot know, such as the driver) override the trace's, and
    `settings.<dotted key>` entries are the run's compiler settings (a trace does not say which differ)."""
    from agents.capture import CompileCapture

    events: list[protocol.Event] = []
    capture = CompileCapture(events.append, lambda: None)
    year = _dt.datetime.fromtimestamp(os.path.getmtime(path), _dt.UTC).year
    clock = {"t": os.path.getmtime(path)}
    capture.now = lambda: clock["t"]
    first = last = None
    versions: dict[str, str] = {}
    for meta, payload, prefix in records(path):
        t = _glog_time(prefix, year)
        if t is not None:
            clock["t"] = t
            first = t if first is None else first
            last = t
        if "compilation_metrics" in meta and isinstance(meta["compilation_metrics"], dict):
            m = meta["compilation_metrics"]
            if isinstance(m.get("start_time"), (int, float)):
                clock["t"] = float(m["start_time"]) + float(m.get("entire_frame_compile_time_s") or 0)
        trace_versions(meta, payload, versions)
        capture.feed(meta, payload)
    settings = {k[len("settings.") :]: v for k, v in (extra or {}).items() if k.startswith("settings.")}
    versions.update({k: v for k, v in (extra or {}).items() if not k.startswith("settings.")})
    start = protocol.RankStart(
        ts=first or clock["t"],
        host="replay",
        device="",
        versions=versions,
        settings=settings,
        env={"LOCKSTEP_SOURCE": "replay:" + os.path.basename(path)[:400]},
    )
    end = protocol.RankEnd(ts=last or clock["t"], status="ok", reason="replayed from TORCH_TRACE")
    return [start, *events, end]


def session_for(run: str, rank: int, path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"lockstep-replay:{run}:{rank}:{h.hexdigest()}"))


def batches(
    trace_dir: str, run: str, world_size: int | None = None, extra: dict[str, str] | None = None
) -> list[protocol.Batch]:
    """All batches for a trace directory, rank by rank, each rank's seqs from 0."""
    files = rank_files(trace_dir)
    if not files:
        return []
    ws = max(world_size or 0, max(files) + 1)
    info = protocol.RunInfo(key=run, world_size=ws)
    out = []
    for rank, path in files.items():
        events = rank_events(path, extra)
        session = session_for(run, rank, path)
        for seq, i in enumerate(range(0, len(events), BATCH_EVENTS)):
            out.append(
                protocol.Batch(
                    v=protocol.PROTOCOL_VERSION,
                    run=info,
                    rank=rank,
                    session=session,
                    seq=seq,
                    events=protocol.wire_events(events[i : i + BATCH_EVENTS]),
                )
            )
    return out
