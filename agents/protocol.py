"""Wire protocol v1: the one definition of what an agent sends and what ingest accepts.

Both sides import these structs: the agent encodes them, `ingest` decodes request bodies
straight into them, so a field renamed here is renamed everywhere (docs/design.md, Wire protocol).
Fingerprints travel as unsigned 64-bit integers.
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, cast, get_args

import msgspec

PROTOCOL_VERSION = 1
NORM_VERSION = 1
FINGERPRINT_ALGO = "lockstep-fp64-v3"  # agents/fingerprinting.py ALGO; baselines compare only equal algorithms
# Environment variables that name one launch, not how the job is set up (the launcher's run id, error
# file, attempt, rendezvous port, rank ids): the agent does not send them, and compare ignores them in
# runs stored before it stopped.
PER_LAUNCH_ENV = frozenset(
    {
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE",
        "TORCHELASTIC_RESTART_COUNT",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "NCCL_COMM_ID",
        "TORCH_NCCL_DUMP_ON_TIMEOUT_FILE",
    }
)

# Bounds the server enforces; the agent batches below them.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_EVENTS_PER_BATCH = 50_000
MAX_RANKS = 1 << 20
MAX_BLOB_BYTES = 4 * 1024 * 1024
MAX_BLOBS_PER_UPLOAD = 256
MAX_BATCHES_PER_REQUEST = 256  # a bulk request (node relay): the ranks of a few nodes, well under MAX_BODY_BYTES
MAX_FR_ENTRIES = 512  # Flight Recorder entries per dump (the newest), frames per entry, bytes of one inflated dump
MAX_FR_FRAMES = 16
MAX_FR_BYTES = 4 * 1024 * 1024
STUCK_S = 5.0  # a phase this long is reported at every flush, so a wait's last sample is its length

_LITTLE = sys.byteorder == "little"

U64_MAX = (1 << 64) - 1
U64 = Annotated[int, msgspec.Meta(ge=0)]  # upper bound checked in _check_u64 (msgspec bounds stop at int64)
NONNEG_MAX = 1 << 62  # steps, counts, ids: far past any real value, and inside int8 columns
NonNeg = Annotated[int, msgspec.Meta(ge=0, le=NONNEG_MAX)]
Rank = Annotated[int, msgspec.Meta(ge=0, lt=MAX_RANKS)]
Short = Annotated[str, msgspec.Meta(max_length=512)]
Text = Annotated[str, msgspec.Meta(max_length=16_384)]
Hash = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{16,64}$")]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
Session = Annotated[str, msgspec.Meta(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]


class Event(msgspec.Struct, tag_field="t", kw_only=True, omit_defaults=True):
    """Base of all events; `ts` is the agent's wall clock (unix seconds)."""

    ts: float = 0.0


class CacheLocation(msgspec.Struct, omit_defaults=True):
    """Where a cache directory really is, so the server can tell a shared cache from two local ones
    that happen to have the same path: the resolved path, the filesystem type, whether that filesystem
    is one that other hosts mount too (NFS, Lustre, ...), and then its id (a local one's is left out)."""

    path: Text = ""
    fs: Short = ""
    fsid: Short = ""
    shared: bool = False


class RankStart(Event, tag="rank_start"):
    host: Short = ""
    pid: NonNeg = 0
    local_rank: NonNeg | None = None
    device: Short = ""
    versions: dict[Short, Short] = {}
    config_hash: Short = ""
    # compiler settings that differ from torch's defaults, dotted ("inductor.triton.cudagraphs" -> "False")
    settings: dict[Short, Text] = {}
    # the same job's runs in other tools ("wandb" / "mlflow" -> URL), for links both ways
    links: dict[Short, Text] = {}
    env: dict[Short, Text] = {}
    cache_dirs: dict[Short, Text] = {}
    cache_fs: dict[Short, CacheLocation] = {}  # per cache_dirs entry
    codegen: dict[Short, Short] = {}  # what shapes generated code but not cache keys (cpu_capability)
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
    """One compilation of one frame on this rank (`compilation_metrics` and its artifacts).

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


class CompileRuntime(Event, tag="compile_runtime"):
    """Timings torch reports after a compile, from the compiled code's first runs (runtime Triton
    autotuning, `compilation_metrics_runtime`): `frame` and `compile_id` name the compile event."""

    frame: Short = ""
    compile_id: Short = ""
    times: dict[Short, Seconds] = {}


class CompileStart(Event, tag="compile_start"):
    """Dynamo started compiling a frame (`dynamo_start`): sent at once, so a compile that runs for
    minutes is known while it runs, not only when `compile` reports it. `reason` is "first compile"
    or the guard that failed (the recompile reason)."""

    frame: Short = ""
    compile_id: Short = ""
    reason: Text = ""
    step: NonNeg | None = None


class Progress(Event, tag="progress"):
    """Where the main thread is, sampled from another thread at every heartbeat (agents/progress.py).

    `phase`: compiling | collective | backward | data | step | other (a newer agent may send others);
    `phase_s`: seconds in it at `ts` (sent at every flush once it reaches STUCK_S); `step`: the optimizer step in progress and `since_step_s` how
    long since the previous one ended; `where`: the innermost frame of user code ("file:line name");
    `op`: the collective or the compiling frame; `reason`: why it compiles (as `compile_start`)."""

    phase: Short = "other"
    phase_s: Seconds = 0.0
    step: NonNeg | None = None
    since_step_s: Seconds | None = None
    where: Short = ""
    op: Short = ""
    compile_id: Short = ""
    reason: Text = ""


class GraphBreak(Event, tag="graph_break"):
    frame: Short = ""
    reason: Text = ""
    step: NonNeg | None = None


def _check_u64(values: Iterable[int]) -> None:
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


MAX_BUCKETS = 4096
MAX_GRADS_STEPS = 4096


class Grads(Event, tag="grads"):
    """Compact form of `grad` for the steady state (P1/P7): many consecutive steps in one event.

    `fps` is base64 (standard alphabet, padded) of `steps * buckets` unsigned 64-bit
    fingerprints, little-endian, step-major: step `step + i * stride`, bucket `b` is the u64 at
    byte offset `8 * (i * buckets + b)` (`stride` is LOCKSTEP_GRAD_EVERY). Raw bytes neither need a u64 range check nor cost ~20
    decimal digits each, and one event amortizes the JSON framing over `steps` rank-steps.
    `nonfinite` and `norms`, when given, hold one value per step. Each step counts as one
    grad event (one rank-step) everywhere, exactly as if sent as a `grad` event.
    """

    step: NonNeg
    buckets: Annotated[int, msgspec.Meta(ge=1, le=MAX_BUCKETS)]
    fps: bytes
    steps: Annotated[int, msgspec.Meta(ge=1, le=MAX_GRADS_STEPS)] = 1
    stride: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 1
    group: Short = "ddp"
    norms: list[float] = []
    nonfinite: list[NonNeg] = []

    def __post_init__(self) -> None:
        if len(self.fps) != 8 * self.steps * self.buckets:
            raise ValueError(
                f"fps holds {len(self.fps)} bytes, expected 8 * steps * buckets = {8 * self.steps * self.buckets}"
            )
        if self.norms and len(self.norms) != self.steps:
            raise ValueError("norms must hold one value per step")
        if self.nonfinite and len(self.nonfinite) != self.steps:
            raise ValueError("nonfinite must hold one value per step")

    @classmethod
    def pack(cls, step: int, rows: list[list[int]], group: str = "ddp", **kw: Any) -> Grads:
        """Build from per-step bucket fingerprints (what an agent has after `steps` grad events);
        pass `stride=K` when steps are K apart."""
        buckets = len(rows[0])
        fps = b"".join(v.to_bytes(8, "little") for row in rows for v in row)
        return cls(step=step, steps=len(rows), buckets=buckets, group=group, fps=fps, **kw)

    def step_numbers(self) -> range:
        return range(self.step, self.step + self.steps * self.stride, self.stride)

    def unpack(self) -> list[list[int]]:
        """Per-step lists of u64 fingerprints (the `fps` of the equivalent `grad` events)."""
        if _LITTLE:
            values = memoryview(self.fps).cast("Q").tolist()
        else:
            values = [int.from_bytes(self.fps[i : i + 8], "little") for i in range(0, len(self.fps), 8)]
        n = self.buckets
        return [values[i * n : (i + 1) * n] for i in range(self.steps)]


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
    nonfinite_loss: bool = False  # the loss was NaN or inf: JSON has no such number (`loss` is then absent)


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
    reason: Text | None = None  # "ExceptionType: message", or the signal
    exc_type: Short | None = None
    where: Short | None = None  # innermost frame of the exception: "file.py:line function"


class Dropped(Event, tag="dropped"):
    count: NonNeg = 0
    reason: Short = ""


class Notice(Event, tag="notice"):
    """What the agent could not capture without changing the program it observes, said once per
    process (`code`: a stable name; `text`: what it means for the checks)."""

    code: Short
    text: Text = ""


class PeerGone(Event, tag="peer_gone"):
    """Another rank of this node whose process vanished without a rank_end (SIGKILL, the OOM killer, a
    crash in native code), as its node's peers saw it go (agents/peers.py); `pid`: the process that went."""

    rank: Rank
    pid: NonNeg


AnyEvent = (
    RankStart
    | Compile
    | CompileStart
    | CompileRuntime
    | Progress
    | GraphBreak
    | Grad
    | Grads
    | Param
    | Step
    | Heartbeat
    | Detail
    | RankEnd
    | Dropped
    | Notice
    | PeerGone
)
EVENT_CLASSES: tuple[type[Event], ...] = get_args(AnyEvent)
EVENT_TYPES = tuple(cls.__struct_config__.tag for cls in EVENT_CLASSES)


def wire_events(events: Sequence[Event]) -> list[AnyEvent]:
    """The events as the batch's field types them; an event of a class the protocol does not list is a
    programming error, refused here rather than sent."""
    for event in events:
        if not isinstance(event, EVENT_CLASSES):
            raise TypeError(f"not a wire event: {type(event).__name__}")
    return cast(list[AnyEvent], list(events))


class RunInfo(msgspec.Struct, omit_defaults=True):
    key: Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
    world_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)]
    name: Short = ""
    meta: dict[Short, Text] = {}


class Batch(msgspec.Struct):
    v: Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
    run: RunInfo
    rank: Rank
    session: Session
    seq: NonNeg
    events: Annotated[list[AnyEvent], msgspec.Meta(max_length=MAX_EVENTS_PER_BATCH)]


class IngestReply(msgspec.Struct):
    accepted: int
    duplicate: bool = False
    want_blobs: list[str] = []
    detail: list[int] = []
    # true: send a Flight Recorder dump (`POST /api/v1/flight-recorder`); absent otherwise, so the reply
    # is the protocol's four fields exactly unless the server asks, and old agents ignore it
    flight_recorder: bool | msgspec.UnsetType = msgspec.UNSET
    # backpressure: flush no more often than every this many seconds; absent while the server keeps up
    flush_interval_s: float | msgspec.UnsetType = msgspec.UNSET
    # fingerprint the weights (a `param` event) after each of these steps' update, as every rank is asked
    # to: after a divergence the server wants the weights compared at once, not at the next
    # LOCKSTEP_PARAM_EVERY step; absent otherwise (old agents ignore it)
    weights_at: list[NonNeg] | msgspec.UnsetType = msgspec.UNSET


class Bulk(msgspec.Struct):
    """Body of `POST /api/v1/ingest/bulk`: several ranks' batches, each exactly as a rank would post it.

    A node relay (`agents.relay`) sends these: one request and one transaction carry the batches
    of every rank of a node, instead of one request per rank. All-or-nothing as a whole; each
    batch keeps its own (session, seq) identity, so a resent one is a duplicate on either endpoint.
    """

    v: Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
    batches: Annotated[list[Batch], msgspec.Meta(min_length=1, max_length=MAX_BATCHES_PER_REQUEST)]


class Refused(msgspec.Struct, omit_defaults=True):
    """A batch of a relay's bulk request that was not accepted although others were (`BulkReply.refused`):
    the answer its agent gets, exactly as the server gave it (status, JSON body, Retry-After)."""

    index: NonNeg  # the batch's place in the request (its entry in `results` is a placeholder)
    status: Annotated[int, msgspec.Meta(ge=400, le=599)]
    answer: msgspec.Raw
    retry_after: Short = ""


class BulkReply(msgspec.Struct, omit_defaults=True):
    results: list[IngestReply]  # one per batch, in the request's order
    # only from a relay, only to a relay that sent a packed body (`Packed`): the batches answered on their
    # own because the server refused them alone; absent otherwise, so the server's reply is unchanged
    refused: list[Refused] = []


PACKED_VERSION = 2  # `Packed`: the bulk body of a relay tree
MAX_PACKED_HOLDERS = MAX_BATCHES_PER_REQUEST
Index = Annotated[int, msgspec.Meta(ge=0, lt=MAX_BATCHES_PER_REQUEST)]
Place = Annotated[int, msgspec.Meta(ge=0, lt=MAX_EVENTS_PER_BATCH)]


class Agreed(msgspec.Struct, omit_defaults=True):
    """One event that several batches of a `Packed` body hold alike, sent once with the batches that hold it.

    Alike: the same event, but for what is each rank's own and travels per holder where it differs: its
    place among the holder's events, `ts` (the agent's clock) and a compile's `times`. A node's agreeing
    replicas report the same gradient fingerprints of a step, the same graph hashes of a compile: that
    travels once; a rank that dissents keeps its own event in its batch.
    """

    event: AnyEvent  # with the first holder's `ts` and `times`
    of: Annotated[list[tuple[Index, Index]], msgspec.Meta(min_length=1, max_length=MAX_PACKED_HOLDERS)]
    at: Place = 0  # its place among each holder's events
    places: Annotated[list[Place], msgspec.Meta(max_length=MAX_PACKED_HOLDERS)] = []  # per holder, where they differ
    ts: Annotated[
        list[float], msgspec.Meta(max_length=MAX_PACKED_HOLDERS)
    ] = []  # per holder (as `Event.ts`); empty: all alike
    times: Annotated[list[dict[Short, Seconds]], msgspec.Meta(max_length=MAX_PACKED_HOLDERS)] = []  # likewise


class PackedBatch(msgspec.Struct, omit_defaults=True):
    """One batch of a `Packed` body: its identity, and the events it does not share (its dissent)."""

    run: Index  # its entry in `Packed.runs`
    rank: Rank
    session: Session
    seq: NonNeg
    events: Annotated[list[AnyEvent], msgspec.Meta(max_length=MAX_EVENTS_PER_BATCH)] = []


class Packed(msgspec.Struct, omit_defaults=True):
    """Body of `POST /api/v1/ingest/bulk` at version 2: a relay's batches with their agreement sent once.

    Each batch is still a protocol 1 `Batch` with its own (session, seq): `agents.agreement.unpack`
    rebuilds it, byte for byte the JSON its agent sent (a relay packs only batches whose JSON is this
    encoder's own: `agents.agreement.packable`), so its digest, duplicates and 409s are those of the
    batch sent alone. Batches a relay cannot pack travel as sent in `raw`. Answers (`BulkReply.results`)
    follow `batches`, then `raw`. The server takes version 1 (`Bulk`) too, and single batches.
    """

    v: Annotated[int, msgspec.Meta(ge=PACKED_VERSION, le=PACKED_VERSION)]
    runs: Annotated[list[RunInfo], msgspec.Meta(max_length=MAX_BATCHES_PER_REQUEST)] = []
    batches: Annotated[list[PackedBatch], msgspec.Meta(max_length=MAX_BATCHES_PER_REQUEST)] = []
    agreed: Annotated[list[Agreed], msgspec.Meta(max_length=MAX_EVENTS_PER_BATCH)] = []
    raw: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_BATCHES_PER_REQUEST)] = []


BlobHash = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}$")]


def blob_hash(text: str) -> str:
    """Content address of a graph text: the `norm` hash the agent already sends (128-bit blake2b, hex)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class Blob(msgspec.Struct):
    """One normalized graph text the server asked for in `want_blobs`; `hash` must be `blob_hash(text)`."""

    hash: BlobHash
    text: Annotated[str, msgspec.Meta(max_length=MAX_BLOB_BYTES)]


class BlobUpload(msgspec.Struct):
    """Body of `POST /api/v1/blobs` (JSON, optional gzip, same token as ingest)."""

    v: Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
    blobs: Annotated[list[Blob], msgspec.Meta(min_length=1, max_length=MAX_BLOBS_PER_UPLOAD)]


class BlobReply(msgspec.Struct):
    stored: list[str] = []
    known: list[str] = []


class FRFrame(msgspec.Struct, omit_defaults=True):
    name: Short = ""
    filename: Short = ""
    line: NonNeg = 0


Sizes = Annotated[list[Annotated[list[NonNeg], msgspec.Meta(max_length=64)]], msgspec.Meta(max_length=64)]
Names = Annotated[list[Short], msgspec.Meta(max_length=64)]


class FREntry(msgspec.Struct, omit_defaults=True):
    """One Flight Recorder entry as torch records it (`torch._C._distributed_c10d._dump_fr_trace()`), the
    fields torch's own analysis (`torch.distributed.flight_recorder`) reads; `process_group` is (name, desc)."""

    record_id: NonNeg
    collective_seq_id: NonNeg = 0
    p2p_seq_id: NonNeg = 0
    op_id: NonNeg = 0
    pg_id: NonNeg = 0
    process_group: Annotated[list[Short], msgspec.Meta(min_length=2, max_length=2)] = msgspec.field(
        default_factory=lambda: ["", ""]
    )
    profiling_name: Short = ""
    state: Short = ""
    retired: bool = False
    is_p2p: bool = False
    timeout_ms: NonNeg | None = None
    time_created_ns: NonNeg | None = None
    time_discovered_started_ns: NonNeg | None = None
    time_discovered_completed_ns: NonNeg | None = None
    input_sizes: Sizes = []
    output_sizes: Sizes = []
    input_dtypes: Names = []
    output_dtypes: Names = []
    frames: Annotated[list[FRFrame], msgspec.Meta(max_length=MAX_FR_FRAMES)] = []


class FRDump(msgspec.Struct, omit_defaults=True):
    """A bounded Flight Recorder dump: torch's top-level keys (`pg_config`: pg name -> name/desc/ranks,
    `pg_status`: pg id -> last enqueued/started/completed collective) and the newest entries."""

    version: Short = ""
    comm_lib_version: Short = ""
    pg_config: Annotated[dict[Short, dict[Short, Text]], msgspec.Meta(max_length=1024)] = {}
    pg_status: Annotated[dict[Short, dict[Short, int | Short]], msgspec.Meta(max_length=1024)] = {}
    entries: Annotated[list[FREntry], msgspec.Meta(max_length=MAX_FR_ENTRIES)] = []
    error: Text = ""  # why the agent has no dump (no process group, torch without a recorder)


class FlightRecord(msgspec.Struct):
    """Body of `POST /api/v1/flight-recorder` (JSON, gzip, the ingest token): one rank's dump, sent
    when an ingest reply said `flight_recorder: true`. JSON, never torch's pickle: the server unpickles nothing."""

    v: Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
    run: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    rank: Rank
    session: Session
    ts: float
    dump: FRDump


class FlightRecordReply(msgspec.Struct):
    """200 answer of `POST /api/v1/flight-recorder`: stored, and how many of the server's requests it answered."""

    stored: bool
    answered: int


class BodyError(ValueError):
    """A request body that cannot be read as sent; `status` is the HTTP answer it deserves."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    """Undo a body's Content-Encoding (gzip or none) with a hard cap on the inflated size (no gzip
    bombs). Ingest and the node relay both read agents' bodies through this."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding != "gzip":
        raise BodyError(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise BodyError(400, f"invalid gzip body: {exc}") from None
    if len(body) > limit:
        raise BodyError(413, f"decompressed body exceeds {limit} bytes")
    if not inflater.eof:
        raise BodyError(400, "truncated gzip body")
    return body


def encode(obj: msgspec.Struct) -> bytes:
    return msgspec.json.encode(obj)


_BATCH = msgspec.json.Decoder(Batch)


class _RawBulk(msgspec.Struct):
    """`Bulk` with each batch's exact bytes: decoded one by one (error paths per batch) and digested as sent."""

    v: Annotated[int, msgspec.Meta(ge=PROTOCOL_VERSION, le=PROTOCOL_VERSION)]
    batches: Annotated[list[msgspec.Raw], msgspec.Meta(min_length=1, max_length=MAX_BATCHES_PER_REQUEST)]


_BULK = msgspec.json.Decoder(_RawBulk)
_BLOBS = msgspec.json.Decoder(BlobUpload)
_FLIGHT = msgspec.json.Decoder(FlightRecord)


def decode_batch(body: bytes) -> Batch:
    """Decode and validate; raises msgspec.ValidationError / DecodeError with the failing path."""
    return _BATCH.decode(body)


class _Version(msgspec.Struct):
    v: int


_VERSION = msgspec.json.Decoder(_Version)
_PACKED = msgspec.json.Decoder(Packed)


def bulk_version(body: bytes) -> int:
    """The version a bulk body declares: 1 (`Bulk`) or 2 (`Packed`); a body without one fails to decode."""
    return _VERSION.decode(body).v


def decode_bulk(body: bytes) -> list[bytes]:
    """The exact JSON bytes of each batch of a `Bulk` body (each then goes through `decode_batch`)."""
    return [bytes(raw) for raw in _BULK.decode(body).batches]


def decode_packed(body: bytes) -> Packed:
    """A `Packed` body, validated as its structs say; `agents.agreement.unpack` checks how its parts fit."""
    return _PACKED.decode(body)


def bulk_body(batches: list[bytes]) -> bytes:
    """A `Bulk` body around batches already encoded as JSON (a relay forwards them byte for byte)."""
    return b'{"v":%d,"batches":[' % PROTOCOL_VERSION + b",".join(batches) + b"]}"


def decode_blobs(body: bytes) -> BlobUpload:
    return _BLOBS.decode(body)


def decode_flight_record(body: bytes) -> FlightRecord:
    return _FLIGHT.decode(body)
