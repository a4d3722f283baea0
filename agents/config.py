"""Agent settings: explicit keyword arguments win over LOCKSTEP_* environment variables.

Run key default (`LOCKSTEP_RUN` unset): `TORCHELASTIC_RUN_ID` when torchrun set a real one
(it is the literal "none" unless `--rdzv-id`/`--standalone` gave one). Otherwise the key is
derived from what all local ranks of one launch share and separate launches don't:
MASTER_ADDR, MASTER_PORT, and the launcher's pid plus its start time (the parent process of
every rank, i.e. the torchrun agent or the mp.spawn parent). A plain single process uses its
own pid and start time. Limitation: multi-node static-rendezvous jobs have one launcher per
node, so they need LOCKSTEP_RUN or a torchrun --rdzv-id to share one key.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypedDict, TypeVar, Unpack

from agents import procstat

T = TypeVar("T")

DEFAULT_SPOOL_CAP = 1 << 30
FR_BUFFER_DEFAULT = 2000  # Flight Recorder entries per process group (torch's NCCL default where it records)
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # the new name and the old one


@dataclass(frozen=True)
class Config:
    url: str | None
    token: str | None
    run: str
    run_name: str
    rank: int
    world_size: int
    local_rank: int | None
    offline: bool
    spool_dir: str
    spool_cap: int
    grad_every: int
    param_every: int
    disabled: bool
    flush_interval: float
    heartbeat: float
    progress_every: float  # seconds between looks at the main thread (agents/progress.py); 0: off
    flight_recorder: bool = True  # answer the server's Flight Recorder dump requests (LOCKSTEP_FLIGHT_RECORDER=0: off)
    fr_buffer_default: int = 0  # TORCH_FR_BUFFER_SIZE to set at attach (0: leave torch's setting alone)
    page_url: str | None = (
        None  # the server as people open it (LOCKSTEP_PAGE_URL, else LOCKSTEP_URL): links from W&B / MLflow
    )


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _num(name: str, default: T, cast: Callable[[str], T]) -> T:
    try:
        return cast(os.environ[name])
    except (KeyError, ValueError):
        return default


def _sanitize(key: str) -> str:
    key = re.sub(r"[^A-Za-z0-9._:-]", "-", key.strip())[:200]
    return key if key and key[0].isalnum() else ("r" + key)[:200]


def default_run_key(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    elastic = env.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic.lower() != "none":
        return _sanitize(elastic)
    launched = "RANK" in env or "WORLD_SIZE" in env
    pid = os.getppid() if launched else os.getpid()
    parts = [
        socket.gethostname() if not env.get("MASTER_ADDR") else env["MASTER_ADDR"],
        env.get("MASTER_PORT", ""),
        str(pid),
        procstat.start_time(pid),
    ]
    return "job-" + hashlib.blake2b("|".join(parts).encode(), digest_size=8).hexdigest()


def _dist_rank() -> tuple[int, int] | None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return None


class Overrides(TypedDict, total=False):
    """What `agents.attach()` may set in code; whatever is left out (or None) comes from the
    environment (LOCKSTEP_URL, LOCKSTEP_TOKEN, LOCKSTEP_RUN, RANK, WORLD_SIZE, LOCKSTEP_OFFLINE,
    LOCKSTEP_SPOOL_DIR, LOCKSTEP_GRAD_EVERY) or torch.distributed."""

    url: str | None
    token: str | None
    run: str | None
    rank: int | None
    world_size: int | None
    offline: bool | None
    spool_dir: str | None
    grad_every: int | None


def resolve(**given: Unpack[Overrides]) -> Config:
    """The agent's configuration: `given` first, then the environment, then defaults."""
    env = os.environ
    url, token, run = given.get("url"), given.get("token"), given.get("run")
    rank, world_size, offline = given.get("rank"), given.get("world_size"), given.get("offline")
    spool_dir, grad_every = given.get("spool_dir"), given.get("grad_every")
    url = url or env.get("LOCKSTEP_URL") or None
    dist_rw = _dist_rank()
    if rank is None:
        rank = int(env["RANK"]) if env.get("RANK", "").isdigit() else (dist_rw[0] if dist_rw else 0)
    if world_size is None:
        ws = env.get("WORLD_SIZE", "")
        world_size = int(ws) if ws.isdigit() else (dist_rw[1] if dist_rw else 1)
    local = env.get("LOCAL_RANK", "")
    if offline is None:
        offline = _flag(env.get("LOCKSTEP_OFFLINE")) or url is None
    return Config(
        url=url.rstrip("/") if url else None,
        token=token or env.get("LOCKSTEP_TOKEN") or None,
        run=_sanitize(run or env.get("LOCKSTEP_RUN") or default_run_key()),
        run_name=env.get("LOCKSTEP_RUN_NAME", "")[:512],
        rank=rank,
        world_size=max(1, world_size, rank + 1),
        local_rank=int(local) if local.isdigit() else None,
        offline=offline,
        spool_dir=spool_dir or env.get("LOCKSTEP_SPOOL_DIR") or "./lockstep-spool",
        spool_cap=_num("LOCKSTEP_SPOOL_MAX_BYTES", DEFAULT_SPOOL_CAP, int),
        grad_every=max(1, grad_every or _num("LOCKSTEP_GRAD_EVERY", 1, int)),
        param_every=max(0, _num("LOCKSTEP_PARAM_EVERY", 50, int)),
        disabled=_flag(env.get("LOCKSTEP_DISABLE")),
        flush_interval=max(0.01, _num("LOCKSTEP_FLUSH_INTERVAL", 0.5, float)),
        heartbeat=max(0.1, _num("LOCKSTEP_HEARTBEAT", 5.0, float)),
        progress_every=max(0.0, _num("LOCKSTEP_PROGRESS_EVERY", 0.5, float)),
        flight_recorder=(
            fr := env.get("LOCKSTEP_FLIGHT_RECORDER", "1").strip().lower() not in ("0", "false", "no", "off")
        ),
        fr_buffer_default=FR_BUFFER_DEFAULT if fr and not any(env.get(v) for v in FR_BUFFER_VARS) else 0,
        page_url=(env.get("LOCKSTEP_PAGE_URL") or url or "").rstrip("/") or None,
    )
