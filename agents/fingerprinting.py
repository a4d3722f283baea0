"""Bit-exact 64-bit tensor fingerprints (algorithm `ALGO`, sent in rank_start as `fp_algo`).

Definition (v2). The tensor's bytes in logical order, zero-padded to a multiple of 4, are
32-bit words x_0 .. x_{n-1}. Word i sits in row r = i >> 12 and column c = i & 4095 of a
virtual [rows, 4096] matrix. For each of two lanes l:

    w_l(i)    = colw_l[c] + r * R_l                    (mod 2^32)
    colw_l[c] = mix_l(c)   (odd multiplies and xorshifts: a bijection of 32-bit words)
    S_l       = sum_i  (x_i ^ w_l(i)) * (w_l(i) | 1)       (mod 2^32)

Multiplying by an odd number is a bijection mod 2^32, so any single-bit change of any word
changes its term and therefore the sum mod 2^32 (sums mod 2^32 are exact and associative, so
every summation order and accumulator width >= 32 bits gives the same S_l; kernels accumulate
in int32 or int64 as is fastest and the host keeps the low 32 bits). Weights differ between any two positions of one
row and drift by an odd multiple per row, so they never repeat with a short period (a swap of
two different words changes the sums). The host folds (S_0, S_1), numel and dtype through
splitmix64 into one unsigned 64-bit value. Only exact integer arithmetic is used: every device
and torch version gives the same value for the same bits.

Why the row/column split (v1 hashed the full index per element) and the sums mod 2^32 (v2 kept
exact 64-bit sums): the per-element work per lane is one add, xor, or, multiply and a 32-bit
add (the column table is loaded once per row block), which lets a kernel run near memory speed
(target P3, docs/design.md). v1, v2 and v3 agree on nothing but tensors of < 4096 words (v1 = v2 there).

Implementations, chosen per tensor and device, all giving the same sums:
- `_lane_sums_eager`: plain torch ops (reference; always available).
- native (CPU): `fingerprint_native.c` via ctypes, all of a step's tensors in one call
  (`agents/fingerprint_native.py` says why it beats the Inductor kernel on the CPU).
- segmented: many small tensors concatenated into one buffer, per-tensor sums with one
  `index_add_` (layout arrays cached), so a step with hundreds of parameters costs a dozen ops.
- compiled: an Inductor kernel over the [rows, 4096] view (dynamic rows, one compile), compiled
  under `capture.suppressed()` so it never appears as a user compile event.
- Triton (CUDA): a hand-written kernel doing 32-bit arithmetic with 64-bit accumulation.
- Triton, a whole group (CUDA): `fingerprint_cuda.py`, every tensor of a step by address in two
  launches with the gradient statistics (`device_pending`; why: launches, not bytes, are a GPU's cost).
Each fast path is checked against the reference once per device at first use and disabled if it
disagrees or fails; failures fall back to eager, never into user code.

The public entry is `agents.fingerprint(tensor)` (docs/design.md, The agent), which calls `fingerprint` here. This
module is not named `agents/fingerprint.py`: importing a submodule binds it as an attribute of its
package, which would replace that public function with the module.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agents import fingerprint_cuda, fingerprint_native, protocol

ALGO = protocol.FINGERPRINT_ALGO
MASK64 = (1 << 64) - 1
COLS = 4096
LOG2_COLS = 12
_CPU = torch.device("cpu")
# (column-mix multiplier 1, column-mix multiplier 2, row multiplier) per lane
_LANES = ((0x27D4EB2D, 0x165667B1, 0x9E3779B1), (0x3C6EF372, 0x7FEB352D, 0x85EBCA77))
# Tensors at least this large get their own kernel; smaller ones are batched into one call.
BIG_WORDS = {"cuda": 1 << 16}
BIG_WORDS_DEFAULT = 1 << 20
# Per-row sums inside the compiled kernel: int32 wraps (mod 2^32 is all that counts), int64 is exact.
ROW_SUM_DTYPE = torch.int32 if os.environ.get("LOCKSTEP_FP_ROW_SUM", "int32") == "int32" else torch.int64
_lock = threading.Lock()
LaneSums = Callable[[torch.Tensor], torch.Tensor]  # int32 words -> int64 [2] lane sums
RowsKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]  # `_rows_kernel`'s signature
_col_cache: dict[str | tuple[str, str], torch.Tensor] = {}
_layout_cache: dict[tuple[str, tuple[int, ...], bool], tuple[Any, ...]] = {}
_compiled: dict[str, RowsKernel | bool] = {}  # device type -> compiled kernel, or False when disabled
_triton: dict[int, Any] = {}  # Triton's JIT function (untyped)
_verified: dict[tuple[str, str], bool] = {}


def _s32(v: int) -> int:
    """Unsigned 32-bit constant as the signed int32 torch stores."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _lsr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int32 (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (32 - k)) - 1)


def _column_weights(device: torch.device) -> torch.Tensor:
    """int32 [2, COLS]: colw_l[c] = mix_l(c)."""
    key = str(device)
    with _lock:
        cached = _col_cache.get(key)
    if cached is not None:
        return cached
    c = torch.arange(COLS, dtype=torch.int32)
    rows = []
    for m1, m2, _ in _LANES:
        w = c * _s32(m1)
        w = w ^ _lsr(w, 15)
        w = w * _s32(m2)
        rows.append(w ^ _lsr(w, 13))
    cached = torch.stack(rows).to(device)
    with _lock:
        _col_cache[key] = cached
    return cached


def _row_mults(device: torch.device) -> torch.Tensor:
    """int32 [2, 1]: each lane's row multiplier R_l."""
    return torch.tensor([[_s32(r)] for _, _, r in _LANES], dtype=torch.int32, device=device)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (logical order) as int32 words, zero-padded to a multiple of 4 bytes."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    u8 = flat.contiguous().view(torch.uint8)
    pad = (-u8.numel()) % 4
    if pad or u8.storage_offset() % 4:
        u8 = torch.cat([u8, u8.new_zeros(pad)])
    return u8.view(torch.int32)


def _weights_at(pos: torch.Tensor, device: torch.device) -> torch.Tensor:
    """int32 [2, len(pos)] weights of the int64 positions `pos`."""
    col = _column_weights(device)[:, (pos & (COLS - 1))]
    row = (pos >> LOG2_COLS).to(torch.int32).unsqueeze(0)  # wraps mod 2^32 for > 2^43 words only
    return col + row * _row_mults(device)


def _lane_sums_eager(x: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Reference: int64 [2] lane sums of int32 words `x` sitting at positions start.. ."""
    if x.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=x.device)
    pos = torch.arange(start, start + x.numel(), dtype=torch.int64, device=x.device)
    w = _weights_at(pos, x.device)
    return ((x.unsqueeze(0) ^ w) * (w | 1)).sum(dim=1, dtype=torch.int64)


# --- compiled (Inductor) path --------------------------------------------------------------
def _rows_kernel(x2: torch.Tensor, col0: torch.Tensor, col1: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """int64 [2, rows]: per-row lane sums of x2 [rows, COLS], row i weighted as row r[i]."""
    out = []
    for col, (_, _, rm) in zip((col0, col1), _LANES):
        w = col + r * _s32(rm)
        out.append(((x2 ^ w) * (w | 1)).sum(dim=1, dtype=ROW_SUM_DTYPE).to(torch.int64))
    return torch.stack(out)


def _arange_rows(k: int, device: torch.device) -> torch.Tensor:
    """int32 [k, 1] row numbers 0..k-1, from one cached, growing tensor per device (no arange per step)."""
    key = ("rows", str(device))
    with _lock:
        cached = _col_cache.get(key)
    if cached is None or cached.shape[0] < k:
        cached = torch.arange(
            max(k, 2 * (cached.shape[0] if cached is not None else 0), 64), dtype=torch.int32, device=device
        ).view(-1, 1)
        with _lock:
            _col_cache[key] = cached
    return cached[:k]


def _compiled_for(device: torch.device) -> RowsKernel | None:
    """The Inductor-compiled `_rows_kernel` for this device type, compiled once (None: disabled or failed)."""
    fn = _compiled.get(device.type)
    if fn is None:
        if os.environ.get("LOCKSTEP_FP_COMPILE", "1") == "0":
            fn = False
        else:
            try:
                fn = torch.compile(_rows_kernel, dynamic=True, fullgraph=True)
            except Exception:
                fn = False
        _compiled[device.type] = fn
    return None if isinstance(fn, bool) else fn


def _rows_call(fn: RowsKernel, x2: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Run the compiled kernel with dynamic rows (one compile for every size), invisible to the capture."""
    from agents.capture import suppressed

    if x2.shape[0] >= 2:
        torch._dynamo.maybe_mark_dynamic(x2, 0)
        torch._dynamo.maybe_mark_dynamic(r, 0)
    colw = _column_weights(x2.device)
    with suppressed():
        return fn(x2, colw[0:1], colw[1:2], r)


def _lane_sums_compiled(x: torch.Tensor) -> torch.Tensor:
    """Whole rows through the compiled kernel, the partial last row through the reference."""
    fn = _compiled_for(x.device)
    if fn is None:
        raise RuntimeError("compiled fingerprint disabled")
    k = x.numel() >> LOG2_COLS
    sums = _rows_call(fn, x[: k * COLS].view(k, COLS), _arange_rows(k, x.device)).sum(dim=1)
    if x.numel() > k * COLS:
        sums = sums + _lane_sums_eager(x[k * COLS :], k * COLS)
    return sums


# --- Triton path (CUDA) -----------------------------------------------------------------------
_TRITON_ITERS = int(os.environ.get("LOCKSTEP_FP_TRITON_ITERS", "16"))
_TRITON_WARPS = int(os.environ.get("LOCKSTEP_FP_TRITON_WARPS", "16"))


def _triton_kernel() -> Any:
    """The Triton kernel, built once (None: Triton missing or the build failed)."""
    key = 0
    if key in _triton:
        return _triton[key]
    try:
        import triton
        import triton.language as tl

        @triton.jit  # type: ignore[untyped-decorator]  # Triton reads the parameters' annotations itself
        def fp_kernel(  # type: ignore[no-untyped-def]
            x_ptr,
            colw_ptr,
            out_ptr,
            n,
            row_base,
            R0: tl.constexpr,
            R1: tl.constexpr,
            BLOCK: tl.constexpr,
            ITERS: tl.constexpr,
            MASKED: tl.constexpr,
        ):
            # BLOCK == COLS: every iteration covers exactly one row, so the column weights are
            # loaded once per program and the row weight is one scalar per iteration. The bulk
            # launch covers whole groups of ITERS full rows with no masks at all; a second, masked
            # launch takes the remaining rows.
            pid = tl.program_id(0)
            offs = tl.arange(0, BLOCK)
            c0 = tl.load(colw_ptr + offs)
            c1 = tl.load(colw_ptr + BLOCK + offs)
            acc0 = tl.zeros([BLOCK], dtype=tl.int32)  # wrapping: sums are taken mod 2^32
            acc1 = tl.zeros([BLOCK], dtype=tl.int32)
            row0 = row_base + pid.to(tl.int64) * ITERS
            for it in range(ITERS):
                row = row0 + it
                pos = row * BLOCK + offs
                r = row.to(tl.int32)
                w0 = (c0 + r * R0).to(tl.int32)
                w1 = (c1 + r * R1).to(tl.int32)
                if MASKED:
                    mask = pos < n
                    x = tl.load(x_ptr + pos, mask=mask, other=0)
                    acc0 += tl.where(mask, ((x ^ w0) * (w0 | 1)).to(tl.int32), 0)
                    acc1 += tl.where(mask, ((x ^ w1) * (w1 | 1)).to(tl.int32), 0)
                else:
                    x = tl.load(x_ptr + pos, eviction_policy="evict_first")
                    acc0 += ((x ^ w0) * (w0 | 1)).to(tl.int32)
                    acc1 += ((x ^ w1) * (w1 | 1)).to(tl.int32)
            tl.store(out_ptr + pid * 2, tl.sum(acc0.to(tl.int64), axis=0))
            tl.store(out_ptr + pid * 2 + 1, tl.sum(acc1.to(tl.int64), axis=0))

        _triton[key] = fp_kernel
    except Exception:
        _triton[key] = None
    return _triton[key]


def _lane_sums_triton(x: torch.Tensor) -> torch.Tensor:
    """An unmasked launch over whole groups of rows, then a masked one for the rest."""
    kernel = _triton_kernel()
    if kernel is None or x.device.type != "cuda":
        raise RuntimeError("triton fingerprint unavailable")
    n = x.numel()
    bulk = (n // COLS) // _TRITON_ITERS  # programs of ITERS full rows each
    rest = -(-(n - bulk * _TRITON_ITERS * COLS) // (COLS * _TRITON_ITERS))
    out = torch.empty(bulk + rest, 2, dtype=torch.int64, device=x.device)
    colw = _column_weights(x.device)
    consts = dict(
        R0=_s32(_LANES[0][2]), R1=_s32(_LANES[1][2]), BLOCK=COLS, ITERS=_TRITON_ITERS, num_warps=_TRITON_WARPS
    )
    if bulk:
        kernel[(bulk,)](x, colw, out, n, 0, MASKED=False, **consts)
    if rest:
        kernel[(rest,)](x, colw, out[bulk:], n, bulk * _TRITON_ITERS, MASKED=True, **consts)
    return out.sum(dim=0)


# --- native path (CPU) --------------------------------------------------------------------------
def _span(t: torch.Tensor, keep: list[torch.Tensor]) -> tuple[int, int]:
    """(address, words) of a CPU tensor's bytes: in place when contiguous, aligned and a whole number
    of words (the bytes are then exactly `_words(t)`'s), else of a padded copy kept in `keep`."""
    nbytes = t.numel() * t.element_size()
    if t.is_contiguous() and nbytes % 4 == 0 and t.data_ptr() % 4 == 0:
        return t.data_ptr(), nbytes // 4
    words = _words(t)
    keep.append(words)
    return words.data_ptr(), words.numel()


def _native_many(tensors: list[torch.Tensor], stats: bool = False) -> tuple[list[int], float, int]:
    """Lane sums ([lane 0, lane 1] per tensor, flat) of CPU tensors' bytes in one native call, no
    concatenation; with `stats`, also the sum of squares of the float32 tensors and how many hold a
    non-finite value."""
    keep: list[torch.Tensor] = []
    spans = [_span(t, keep) for t in tensors]
    flags = [t.dtype == torch.float32 for t in tensors] if stats else None
    return fingerprint_native.lane_sums(
        spans, _column_weights(torch.device("cpu")), (_LANES[0][2], _LANES[1][2]), flags
    )


def _lane_sums_native(x: torch.Tensor) -> torch.Tensor:
    """`_native_many` for one tensor, as a tensor like the other paths return."""
    if x.device.type != "cpu":
        raise RuntimeError("the native fingerprint runs on the CPU")
    return torch.tensor(_native_many([x])[0], dtype=torch.int64)


# --- choosing a path ----------------------------------------------------------------------------
def _fast_paths(device: torch.device) -> list[tuple[str, LaneSums]]:
    """The fast paths to try on this device, fastest first."""
    paths: list[tuple[str, LaneSums]] = []
    if device.type == "cuda" and os.environ.get("LOCKSTEP_FP_TRITON", "1") != "0":
        paths.append(("triton", _lane_sums_triton))
    if device.type == "cpu":
        paths.append(("native", _lane_sums_native))
    paths.append(("compiled", _lane_sums_compiled))
    return paths


def _verify(name: str, fn: LaneSums, device: torch.device) -> bool:
    """Once per (path, device type): the fast path must equal the reference on a probe."""
    key = (name, device.type)
    ok = _verified.get(key)
    if ok is None:
        try:
            g = torch.Generator().manual_seed(12345)
            probe = torch.randint(-(1 << 31), (1 << 31) - 1, (5 * COLS + 77,), dtype=torch.int32, generator=g)
            probe = probe.to(device)
            ok = bool(torch.equal(fn(probe).cpu() & 0xFFFFFFFF, _lane_sums_eager(probe).cpu() & 0xFFFFFFFF))
        except Exception:
            ok = False
        _verified[key] = ok
    return ok


def lane_sums_words(x: torch.Tensor) -> torch.Tensor:
    """int64 [2] lane sums of int32 words, on x's device, without host synchronization (after
    the one-time verification of the fast path)."""
    if x.numel() >= BIG_WORDS.get(x.device.type, BIG_WORDS_DEFAULT):
        for name, fn in _fast_paths(x.device):
            if _verify(name, fn, x.device):
                try:
                    return fn(x)
                except Exception:
                    _verified[(name, x.device.type)] = False
    return _lane_sums_eager(x)


def lane_sums(t: torch.Tensor) -> torch.Tensor:
    """Device-side core: int64 tensor [2] of exact lane sums; no host synchronization."""
    return lane_sums_words(_words(t))


def segmented_lane_sums(words: list[torch.Tensor]) -> torch.Tensor:
    """int64 [2, len(words)]: lane sums of several word tensors in a handful of ops.

    Compiled: each tensor is zero-padded to whole rows of COLS words and concatenated (one
    `cat`), one kernel call gives per-row sums with each tensor's rows numbered from 0, a small
    `index_add_` folds rows into tensors, and the padding's known contribution (cached per
    layout) is subtracted. Eager fallback: per-element weights cached per layout.
    """
    device = words[0].device
    sizes = tuple(w.numel() for w in words)
    fn = _compiled_for(device) if _verify("compiled", _lane_sums_compiled, device) else None
    key = (str(device), sizes, fn is not None)
    with _lock:
        cached = _layout_cache.get(key)
    if cached is None:
        cached = _layout(sizes, device, fn is not None)
        with _lock:
            if len(_layout_cache) > 64:
                _layout_cache.clear()
            _layout_cache[key] = cached
    if fn is not None:
        pads, rows, row_seg, pad_sums = cached
        parts = []
        for w, pad in zip(words, pads):
            parts.append(w)
            if pad is not None:
                parts.append(pad)
        x2 = torch.cat(parts).view(-1, COLS)
        try:
            per_row = _rows_call(fn, x2, rows)
        except Exception:
            _verified[("compiled", device.type)] = False
            return segmented_lane_sums(words)
        sums = torch.zeros(2, len(words), dtype=torch.int64, device=device).index_add_(1, row_seg, per_row)
        return torch.sub(sums, pad_sums)
    w, seg = cached
    x = torch.cat(words).unsqueeze(0)
    terms = ((x ^ w) * (w | 1)).to(torch.int64)
    return torch.zeros(2, len(words), dtype=torch.int64, device=device).index_add_(1, seg, terms)


def _layout(sizes: tuple[int, ...], device: torch.device, rows_layout: bool) -> tuple[Any, ...]:
    """What `segmented_lane_sums` caches per layout: the compiled path's padding, row numbers, row ->
    tensor index and the padding's lane sums; or the eager path's weights and element -> tensor index."""
    if not rows_layout:
        pos = (
            torch.cat([torch.arange(n, dtype=torch.int64) for n in sizes])
            if sum(sizes)
            else torch.zeros(0, dtype=torch.int64)
        )
        seg = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.int64))
        return _weights_at(pos.to(device), device), seg.to(device)
    pads, rows, row_seg, pad_sums = [], [], [], []
    for j, n in enumerate(sizes):
        k = max(1, -(-n // COLS))
        extra = k * COLS - n
        pads.append(torch.zeros(extra, dtype=torch.int32, device=device) if extra else None)
        rows.append(torch.arange(k, dtype=torch.int32))
        row_seg.append(torch.full((k,), j, dtype=torch.int64))
        pad_sums.append(_lane_sums_eager(torch.zeros(extra, dtype=torch.int32), n))
    return (
        pads,
        torch.cat(rows).view(-1, 1).to(device),
        torch.cat(row_seg).to(device),
        torch.stack(pad_sums, dim=1).to(device),
    )


def splitmix64(x: int) -> int:
    """The splitmix64 finalizer: a bijection of u64 that spreads every input bit over the output."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


@functools.cache
def _dtype_code(dtype: torch.dtype | None) -> int:
    """A u64 per dtype name, stable across torch versions (not torch's own enum values)."""
    name = "none" if dtype is None else str(dtype).removeprefix("torch.")
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


@functools.lru_cache(maxsize=4096)
def _mix_seed(numel: int, dtype: torch.dtype | None) -> int:
    """Where `mix` starts: equal bits of another length or dtype fingerprint differently."""
    return splitmix64(numel ^ _dtype_code(dtype))


def mix(lanes: tuple[int, ...], numel: int, dtype: torch.dtype | None) -> int:
    """Host-side finish: fold numel, dtype and the lane sums into one u64."""
    h = _mix_seed(numel, dtype)
    for s in lanes:
        h = splitmix64(h ^ (s & 0xFFFFFFFF))
    return h


def fingerprint(tensor: torch.Tensor) -> int:
    """Public 64-bit fingerprint of the exact bits of `tensor` (synchronizes; not for the hot path)."""
    sums = lane_sums(tensor).cpu().tolist()
    return mix(tuple(sums), tensor.numel(), tensor.dtype)


def fold(fps: list[int]) -> int:
    """Order-sensitive combination of several fingerprints (a bucket's parameters)."""
    h = splitmix64(len(fps))
    for fp in fps:
        h = splitmix64(h ^ fp)
    return h


def balanced_buckets(numels: list[int], nbuckets: int = 16) -> list[list[int]]:
    """Contiguous runs of indices with roughly equal numel; at most `nbuckets`, none empty."""
    n = len(numels)
    k = min(nbuckets, n)
    total = sum(max(size, 1) for size in numels)
    buckets: list[list[int]] = [[]] if n else []
    acc = 0
    for i, size in enumerate(numels):
        if buckets[-1] and (acc >= total * len(buckets) / k or n - i <= k - len(buckets)):
            buckets.append([])
        buckets[-1].append(i)
        acc += max(size, 1)
    return buckets


@dataclass
class Pending:
    """Fingerprints whose lane sums are in flight to the host; read them a step later. `host` is
    the host copy (a tensor) or, from `host_pending`, the words themselves."""

    host: torch.Tensor | list[int]
    event: torch.cuda.Event | None
    numels: list[int]
    dtypes: list[torch.dtype | None]
    buckets: list[list[int]]
    finish: Callable[[list[int]], list[int]] | None = None  # raw host words -> the layout above

    def ready(self) -> bool:
        """The copy has landed: reading now does not wait."""
        return self.event is None or self.event.query()

    def words(self) -> list[int]:
        """The host words (waits for the copy if it has not landed): two lane sums per tensor, then
        the extra words."""
        if not isinstance(self.host, list):
            if self.event is not None:
                self.event.synchronize()
            raw = self.host.tolist()
            self.host = raw if self.finish is None else self.finish(raw)
        return self.host

    def per_tensor(self) -> list[int]:
        """Each tensor's fingerprint, as `fingerprint` gives it."""
        sums = self.words()
        return [mix((sums[2 * i], sums[2 * i + 1]), n, d) for i, (n, d) in enumerate(zip(self.numels, self.dtypes))]

    def extra(self) -> list[int]:
        """Raw int64 words appended after the lane sums (used for grad statistics)."""
        return self.words()[2 * len(self.numels) :]

    def result(self) -> tuple[list[int], list[int]]:
        """(per-tensor fingerprints, per-bucket fingerprints)."""
        per = self.per_tensor()
        return per, [fold([per[i] for i in b]) for b in self.buckets]


def start_copy(device_words: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """One non-blocking device->host copy (pinned on CUDA) plus an event to poll."""
    if device_words.device.type != "cuda":
        return device_words.cpu(), None
    host = torch.empty(device_words.shape, dtype=device_words.dtype, pin_memory=True)
    host.copy_(device_words, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def per_tensor_lane_sums(tensors: list[torch.Tensor | None]) -> torch.Tensor:
    """int64 [len(tensors), 2]; None -> zeros. Small tensors batched per device, big ones alone."""
    return lane_sums_and_stats(tensors, stats=False)[0]


def _native_ok(present: list[torch.Tensor]) -> bool:
    """The native kernel takes these tensors: all on the CPU, and it passed its check."""
    return bool(present) and all(t.is_cpu for t in present) and _verify("native", _lane_sums_native, _CPU)


def lane_sums_and_stats(tensors: list[torch.Tensor | None], stats: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-tensor lane sums, plus (with `stats`, when the native kernel can take every tensor:
    float32 on the CPU) gradient statistics from the same pass: int64 [2] = the float64 bits of
    the sum of squares and the number of tensors holding a non-finite value. None means the
    caller computes the statistics itself."""
    native = _native_words(tensors, stats)
    if native is None:
        return _per_tensor_generic(tensors), None
    lanes, extra = native
    sums = torch.tensor(lanes, dtype=torch.int64).view(len(tensors), 2)
    return sums, None if extra is None else torch.tensor(extra, dtype=torch.int64)


def host_pending(tensors: list[torch.Tensor | None], buckets: list[list[int]], stats: bool) -> Pending | None:
    """The CPU fast path of `bucket_fingerprints` (plus, with `stats`, the gradient statistics):
    when every tensor is on the CPU (float32 for `stats`) and the native kernel is verified, the
    lane sums come back as Python ints and stay so, with no tensor between kernel and host words
    (this runs inside every optimizer step). None: use the general path."""
    native = _native_words(tensors, stats)
    if native is None or (stats and native[1] is None):
        return None
    lanes, extra = native
    return Pending(
        lanes + (extra or []),
        None,
        [t.numel() if t is not None else 0 for t in tensors],
        [t.dtype if t is not None else None for t in tensors],
        buckets,
    )


def device_pending(tensors: list[torch.Tensor | None], buckets: list[list[int]], stats: bool) -> Pending | None:
    """The CUDA fast path of `bucket_fingerprints` (plus, with `stats`, the gradient statistics):
    every present tensor in two launches and one copy (`fingerprint_cuda`). None: use the general
    path (other devices or dtypes, Triton missing, or its check failed)."""
    present = [t for t in tensors if t is not None]
    if not present or not present[0].is_cuda or os.environ.get("LOCKSTEP_FP_TRITON", "1") == "0":
        return None
    key = fingerprint_cuda.plan_key(present, stats)
    if not fingerprint_cuda.known(key) and not fingerprint_cuda.takes(present):
        return None
    device = present[0].device
    if not _verify_group(device):
        return None
    try:
        words = _group_words(present, stats, key)
    except Exception:
        _verified[("group", device.type)] = False
        return None
    host, event = start_copy(words)
    return Pending(
        host,
        event,
        [t.numel() if t is not None else 0 for t in tensors],
        [t.dtype if t is not None else None for t in tensors],
        buckets,
        functools.partial(_group_layout, [t is not None for t in tensors], stats),
    )


def _group_words(present: list[torch.Tensor], stats: bool, key: tuple[Any, ...] | None = None) -> torch.Tensor:
    device = present[0].device
    return fingerprint_cuda.group_words(
        present,
        _column_weights(device),
        (_s32(_LANES[0][2]), _s32(_LANES[1][2])),
        stats,
        key or fingerprint_cuda.plan_key(present, stats),
    )


def _group_layout(has: list[bool], stats: bool, raw: list[int]) -> list[int]:
    """`fingerprint_cuda.group_words`' host words as `Pending.words` gives them: zeros for absent
    tensors, then the statistics words."""
    count = sum(has)
    it = iter(zip(raw[0 : 2 * count : 2], raw[1 : 2 * count : 2]))
    lanes = [w for present in has for w in (next(it) if present else (0, 0))]
    return lanes + (fingerprint_cuda.statistics(raw, count) if stats else [])


def _verify_group(device: torch.device) -> bool:
    """Once per device type: the group kernels' lane sums equal the reference for tensors of three
    dtypes and sizes spanning several chunks, and the statistics see squares and a NaN."""
    key = ("group", device.type)
    ok = _verified.get(key)
    if ok is None:
        try:
            g = torch.Generator().manual_seed(12345)
            big = torch.randn(fingerprint_cuda.COLS * fingerprint_cuda.ITERS + 4099, generator=g)
            tensors = [big.to(device), torch.randn(78, generator=g).bfloat16().to(device)]
            tensors.append(torch.tensor([1.0, float("nan"), 2.0, 3.0], dtype=torch.float16, device=device))
            words = _group_layout([True] * 3, True, _group_words(tensors, True).cpu().tolist())
            want = [w & 0xFFFFFFFF for t in tensors for w in _lane_sums_eager(_words(t)).cpu().tolist()]
            squares = struct.unpack("<d", struct.pack("<q", words[6]))[0]
            expected = float(big.double().square().sum() + tensors[1].double().square().sum().cpu())
            ok = (
                [w & 0xFFFFFFFF for w in words[:6]] == want
                and words[7] == 1
                and squares != squares  # the NaN of the third tensor reaches the sum
                and _squares_close(tensors[:2], expected)
            )
        except Exception:
            ok = False
        _verified[key] = ok
    return ok


def _squares_close(tensors: list[torch.Tensor], expected: float) -> bool:
    words = _group_layout([True] * len(tensors), True, _group_words(tensors, True).cpu().tolist())
    squares: float = struct.unpack("<d", struct.pack("<q", words[2 * len(tensors)]))[0]
    return abs(squares - expected) <= 1e-4 * expected


def _native_words(tensors: list[torch.Tensor | None], stats: bool) -> tuple[list[int], list[int] | None] | None:
    """One native pass: [lane 0, lane 1] per tensor, flat (zeros for None), and with `stats`, when
    every tensor is float32, the statistics words (float64 bits of the sum of squares, non-finite
    tensors). None when the kernel cannot take these tensors, or failed (never used again then)."""
    present = [t for t in tensors if t is not None]
    if not _native_ok(present):
        return None
    stats = stats and all(t.dtype == torch.float32 for t in present)
    try:
        lanes, squares, nonfinite = _native_many(present, stats)
    except Exception:
        _verified[("native", "cpu")] = False
        return None
    if len(present) != len(tensors):
        it = iter(zip(lanes[::2], lanes[1::2]))
        lanes = [w for t in tensors for w in (next(it) if t is not None else (0, 0))]
    return lanes, [struct.unpack("<q", struct.pack("<d", squares))[0], nonfinite] if stats else None


def _per_tensor_generic(tensors: list[torch.Tensor | None]) -> torch.Tensor:
    """int64 [len(tensors), 2] on any device: big tensors one by one, small ones per device in one segmented pass."""
    if not tensors:
        return torch.zeros(0, 2, dtype=torch.int64)
    present = [t for t in tensors if t is not None]
    device = present[0].device if present else torch.device("cpu")
    out: list[torch.Tensor | None] = [None] * len(tensors)
    small: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        if t is None:
            continue
        w = _words(t)
        if w.numel() >= BIG_WORDS.get(w.device.type, BIG_WORDS_DEFAULT):
            out[i] = lane_sums_words(w).to(device)
        else:
            small.setdefault(w.device, []).append((i, w))
    for items in small.values():
        sums = segmented_lane_sums([w for _, w in items]).to(device)
        for j, (i, _) in enumerate(items):
            out[i] = sums[:, j]
    zero = torch.zeros(2, dtype=torch.int64, device=device)
    return torch.stack([o if o is not None else zero for o in out])


def bucket_fingerprints(
    tensors: list[torch.Tensor | None],
    nbuckets: int = 16,
    buckets: list[list[int]] | None = None,
    extra: torch.Tensor | None = None,
    sums: torch.Tensor | None = None,
) -> Pending:
    """Per-tensor lane sums on the device into one int64 tensor, then one async copy.

    `None` entries (parameters without a gradient) get the fingerprint of "no tensor".
    `extra` (int64 words) rides along in the same copy; `sums` are lane sums already taken.
    All on the CPU, with nothing given along, it is `host_pending`'s: no tensors at all.
    """
    numels = [t.numel() if t is not None else 0 for t in tensors]
    if buckets is None:
        buckets = balanced_buckets(numels, nbuckets)
    if sums is None and extra is None:
        pending = host_pending(tensors, buckets, stats=False) or device_pending(tensors, buckets, stats=False)
        if pending is not None:
            return pending
    if sums is None:
        sums = per_tensor_lane_sums(tensors)
    words = sums.reshape(-1)
    if extra is not None:
        words = torch.cat([words, extra.to(device=words.device, dtype=torch.int64).reshape(-1)])
    host, event = start_copy(words)
    return Pending(host, event, numels, [t.dtype if t is not None else None for t in tensors], buckets)


__all__ = [
    "ALGO",
    "fingerprint",
    "bucket_fingerprints",
    "device_pending",
    "lane_sums",
    "balanced_buckets",
    "fold",
    "Pending",
]
