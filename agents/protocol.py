"""Wire protocol v1: the one definition of what an agent sends and what ingest accepts.

Both sides import these structs: the agent encodes them, `ingest` decodes request bodies
straight into them, so a field renamed here is renamed everywhere (DESIGN 3.2).
Fingerprints travel as unsigned 64-bit integers.
"""
from __future__ import annotations

from typing import Annotated, Union

import msgspec

PROTOCOL_VERSION = 1
NORM_VERSION = 1
FINGERPRINT_ALGO = "lockstep-fp64-v1"

# Bounds the server enforces; the agent batches below them.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_EVENTS_PER_BATCH = 50_000
MAX_RANKS = 1 << 20
MAX_BLOB_BYTES = 4 * 1024 * 1024

U64_MAX = (1 << 64) - 1
U64 = Annotated[int, msgspec.Meta(ge=0)]  # upper bound checked in _check_u64 (msgspec bounds stop at int64)
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=(1 << 62))]
Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_RANKS)]
Short = Annotated[str, msgspec.Meta(max_length=512)]
Text = Annotated[str, msgspec.Meta(max_length=16_384)]
Hash = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{16,64}$")]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e9)]


class Event(msgspec.Struct, tag_field="t", kw_only=True, omit_defaults=True):
    """Base of all events; `ts` is the agent's wall clock (unix seconds)."""

    ts: float = 0.0


class RankStart(Event, tag="rank_start"):
    host: Short = ""
    pid: NonNeg = 0
    local_rank: NonNeg | None = None
    device: Short = ""
    versions: dict[Short, Short] = {}
    config_hash: Short = ""
    env: dict[Short, Text] = {}
    cache_dirs: dict[Short, Text] = {}
    collective_timeout_s: Seconds | None = None
    params: list[Short] = []
    buckets: list[list[NonNeg]] = []
    fp_algo: Short = FINGERPRINT_ALGO
    norm_v: NonNeg = NORM_VERSION


class GraphHash(msgspec.Struct, omit_defaults=True):
    """Raw and normalized hash of one artifact (Dynamo graph, Inductor code, ...)."""

    raw: Hash
    norm: Hash


class Compile(Event, tag="compile"):
    """One compilation of one frame on this rank (DESIGN 4: `compilation_metrics` + artifacts).

    `index` is the n-th compile of `frame` in this process (0-based): with `frame` it names
    the compile slot that ranks are compared on. `step` is the optimizer step in progress.
    """

    frame: Short = ""
    index: NonNeg = 0
    compile_id: Short = ""
    step: NonNeg | None = None
    status: Short = "ok"  # ok | failed | eager
    fail_type: Short | None = None
    fail_reason: Text | None = None
    recompile_reason: Text | None = None
    times: dict[Short, Seconds] = {}
    counts: dict[Short, NonNeg] = {}
    hashes: dict[Short, GraphHash] = {}
    cache: dict[Short, Short] = {}
    cache_keys: dict[Short, Short] = {}
    graph_breaks: NonNeg = 0


class GraphBreak(Event, tag="graph_break"):
    frame: Short = ""
    reason: Text = ""
    step: NonNeg | None = None


def _check_u64(values) -> None:
    if any(v > U64_MAX for v in values):
        raise ValueError("fingerprint exceeds 64 bits")


class Grad(Event, tag="grad"):
    """Gradient fingerprints of one optimizer step: one u64 per bucket of one comparison group."""

    step: NonNeg
    group: Short = "ddp"
    fps: list[U64] = []
    norm: float | None = None
    nonfinite: NonNeg = 0

    def __post_init__(self) -> None:
        _check_u64(self.fps)


class Param(Event, tag="param"):
    step: NonNeg
    group: Short = "ddp"
    fps: list[U64] = []

    def __post_init__(self) -> None:
        _check_u64(self.fps)


class Step(Event, tag="step"):
    step: NonNeg
    loss: float | None = None
    step_time: Seconds | None = None


class Heartbeat(Event, tag="heartbeat"):
    step: NonNeg | None = None


class Detail(Event, tag="detail"):
    """Per-parameter fingerprints for one step, sent when the server asked for it."""

    step: NonNeg
    group: Short = "ddp"
    params: dict[Short, U64] = {}

    def __post_init__(self) -> None:
        _check_u64(self.params.values())


class RankEnd(Event, tag="rank_end"):
    status: Short = "ok"  # ok | error | signal | abort
    exit_code: int | None = None
    reason: Text | None = None


class Dropped(Event, tag="dropped"):
    count: NonNeg = 0
    reason: Short = ""


AnyEvent = Union[RankStart, Compile, GraphBreak, Grad, Param, Step, Heartbeat, Detail, RankEnd, Dropped]
EVENT_TYPES = tuple(cls.__struct_config__.tag for cls in AnyEvent.__args__)


class RunInfo(msgspec.Struct, omit_defaults=True):
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
    world_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)]
    name: Short = ""
    meta: dict[Short, Text] = {}


class Batch(msgspec.Struct):
    v: Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
    run: RunInfo
    rank: Rank
    session: Annotated[str, msgspec.Meta(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]
    seq: NonNeg
    events: Annotated[list[AnyEvent], msgspec.Meta(max_length=MAX_EVENTS_PER_BATCH)]


class IngestReply(msgspec.Struct):
    accepted: int
    duplicate: bool = False
    want_blobs: list[str] = []
    detail: list[int] = []


def encode(obj: msgspec.Struct) -> bytes:
    return msgspec.json.encode(obj)


def decode_batch(body: bytes) -> Batch:
    """Decode and validate; raises msgspec.ValidationError / DecodeError with the failing path."""
    return msgspec.json.decode(body, type=Batch)
