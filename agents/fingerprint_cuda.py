"""CUDA fast path of the fingerprint: a whole group of tensors in two Triton launches.

Why: on a GPU the cost of fingerprinting a step is not the bytes (an H100 reads a 2 ms step's
gradients in microseconds) but the launches. A kernel per tensor, a segmented pass for the small
ones and three ops for the statistics cost the optimizer step a launch-bound 1-2 ms, more than a
small model's whole step (bench `observer_effect`, docs/agent.md). Here one launch reads every
tensor of the group where it lies, by address, and writes per-chunk partial sums; a second launch
folds the chunks into per-tensor lane sums, sums of squares and non-finite flags, in one int64
buffer that goes to the host in one copy. The global statistics are summed on the host, in tensor
order, when the words are read: run to run and rank to rank the same bits give the same figures
(no float atomics anywhere).

Chunks are `ITERS` rows of `COLS` words of one tensor (the row/column weights of the fingerprint's
definition, `agents/fingerprinting.py`), so a big tensor spreads over many programs and a small one
costs one. Everything but the tensors (tables, addresses, buffers) is built once per set of tensors
and reused while the caching allocator hands the loop the same addresses, as it does step after
step: a step then costs a key of its tensors, two launches, and the copy.

Only float32, bfloat16 and float16 tensors whose bytes are contiguous, 4-byte aligned and a whole
number of words take this path (gradients and weights of real models are); anything else falls
back to the general path. Triton is imported on first use; without it the general path remains.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

COLS = 4096
ITERS = 16  # rows per chunk: a chunk is 256 KiB of words
REDUCE_BLOCK = 128  # chunks folded per iteration of the reduce kernel
STATS = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}  # how the kernel reads a word's values
_PLANS = 16
_lock = threading.Lock()
_kernels: dict[int, Any] = {}
_plans: OrderedDict[tuple[Any, ...], _Plan] = OrderedDict()


def _build() -> Any:
    """(chunk kernel, reduce kernel), built once; None when Triton is missing or fails."""
    if 0 in _kernels:
        return _kernels[0]
    try:
        import triton
        import triton.language as tl

        @triton.jit  # type: ignore[untyped-decorator]  # Triton reads the parameters' annotations itself
        def chunk_kernel(  # type: ignore[no-untyped-def]
            addr_ptr,
            nwords_ptr,
            kind_ptr,
            chunk_tensor_ptr,
            chunk_row_ptr,
            colw_ptr,
            lanes_ptr,
            sq_ptr,
            nf_ptr,
            R0: tl.constexpr,
            R1: tl.constexpr,
            BLOCK: tl.constexpr,
            ITERS: tl.constexpr,
            STATS: tl.constexpr,
        ):
            pid = tl.program_id(0)
            t = tl.load(chunk_tensor_ptr + pid)
            row0 = tl.load(chunk_row_ptr + pid)
            x_ptr = tl.load(addr_ptr + t).to(tl.pointer_type(tl.int32))
            n = tl.load(nwords_ptr + t)
            offs = tl.arange(0, BLOCK)
            c0 = tl.load(colw_ptr + offs)
            c1 = tl.load(colw_ptr + BLOCK + offs)
            acc0 = tl.zeros([BLOCK], dtype=tl.int32)  # wrapping: the sums count mod 2^32
            acc1 = tl.zeros([BLOCK], dtype=tl.int32)
            sq = tl.zeros([BLOCK], dtype=tl.float32)
            bad = tl.zeros([BLOCK], dtype=tl.int32)
            kind = tl.load(kind_ptr + t)
            for it in range(ITERS):
                row = row0 + it
                pos = row * BLOCK + offs
                mask = pos < n
                x = tl.load(x_ptr + pos, mask=mask, other=0, eviction_policy="evict_first")
                r = row.to(tl.int32)
                w0 = (c0 + r * R0).to(tl.int32)
                w1 = (c1 + r * R1).to(tl.int32)
                acc0 += tl.where(mask, ((x ^ w0) * (w0 | 1)).to(tl.int32), 0)
                acc1 += tl.where(mask, ((x ^ w1) * (w1 | 1)).to(tl.int32), 0)
                if STATS:
                    if kind == 1:
                        v = x.to(tl.float32, bitcast=True)
                        sq += v * v
                        bad |= ((x & 0x7F800000) == 0x7F800000).to(tl.int32)
                    elif kind == 2:
                        lo = (x << 16).to(tl.float32, bitcast=True)
                        hi = (x & -65536).to(tl.float32, bitcast=True)
                        sq += lo * lo + hi * hi
                        bad |= ((x & 0x7F80) == 0x7F80).to(tl.int32) | ((x & 0x7F800000) == 0x7F800000).to(tl.int32)
                    elif kind == 3:
                        lo = (x & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
                        hi = ((x >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
                        sq += lo * lo + hi * hi
                        bad |= ((x & 0x7C00) == 0x7C00).to(tl.int32) | ((x & 0x7C000000) == 0x7C000000).to(tl.int32)
            tl.store(lanes_ptr + pid * 2, tl.sum(acc0.to(tl.int64), axis=0))
            tl.store(lanes_ptr + pid * 2 + 1, tl.sum(acc1.to(tl.int64), axis=0))
            if STATS:
                tl.store(sq_ptr + pid, tl.sum(sq.to(tl.float64), axis=0))
                tl.store(nf_ptr + pid, tl.max(bad, axis=0))

        @triton.jit  # type: ignore[untyped-decorator]
        def reduce_kernel(  # type: ignore[no-untyped-def]
            chunk_start_ptr,
            lanes_ptr,
            sq_ptr,
            nf_ptr,
            out_ptr,
            out_sq_ptr,
            T,
            BLOCK: tl.constexpr,
            STATS: tl.constexpr,
        ):
            t = tl.program_id(0)
            lo = tl.load(chunk_start_ptr + t)
            hi = tl.load(chunk_start_ptr + t + 1)
            a0 = tl.zeros([BLOCK], dtype=tl.int64)
            a1 = tl.zeros([BLOCK], dtype=tl.int64)
            s = tl.zeros([BLOCK], dtype=tl.float64)
            b = tl.zeros([BLOCK], dtype=tl.int32)
            for start in range(lo, hi, BLOCK):
                idx = start + tl.arange(0, BLOCK)
                m = idx < hi
                a0 += tl.load(lanes_ptr + idx * 2, mask=m, other=0)
                a1 += tl.load(lanes_ptr + idx * 2 + 1, mask=m, other=0)
                if STATS:
                    s += tl.load(sq_ptr + idx, mask=m, other=0.0)
                    b |= tl.load(nf_ptr + idx, mask=m, other=0)
            tl.store(out_ptr + t * 2, tl.sum(a0, axis=0))
            tl.store(out_ptr + t * 2 + 1, tl.sum(a1, axis=0))
            if STATS:
                tl.store(out_sq_ptr + 2 * T + t, tl.sum(s, axis=0))
                tl.store(out_ptr + 3 * T + t, tl.max(b, axis=0).to(tl.int64))

        _kernels[0] = (chunk_kernel, reduce_kernel)
    except Exception:
        _kernels[0] = None
    return _kernels[0]


def takes(tensors: list[torch.Tensor]) -> bool:
    """Whether every tensor can be read in place by the kernels: one CUDA device, a dtype whose
    values the statistics know, contiguous, 4-byte aligned and a whole number of words."""
    if not tensors:
        return False
    device = tensors[0].device
    for t in tensors:
        if t.device != device or t.dtype not in STATS or not t.is_contiguous():
            return False
        if (t.numel() * t.element_size()) % 4 or t.data_ptr() % 4:
            return False
    return device.type == "cuda"


@dataclass
class _Plan:
    """What a step of one group needs on the device besides its tensors, built once for a set of
    tensors (their addresses, sizes and dtypes) and reused while the caching allocator hands the
    group the same ones: its tables, its address table, and its output buffers. Reusing the buffers
    is safe on one stream: the next step's kernels are queued after this step's copy to the host."""

    tables: tuple[torch.Tensor, ...]  # words and value kind per tensor, chunk -> tensor and row, chunk starts
    addresses: torch.Tensor
    lanes: torch.Tensor
    sq: torch.Tensor
    nf: torch.Tensor
    out: torch.Tensor


def _plan(tensors: list[torch.Tensor], stats: bool, key: tuple[Any, ...]) -> _Plan:
    with _lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
            return plan
    plan = _new_plan(tensors, stats)
    with _lock:
        _plans[key] = plan
        while len(_plans) > _PLANS:
            _plans.popitem(last=False)
    return plan


def _new_plan(tensors: list[torch.Tensor], stats: bool) -> _Plan:
    device = tensors[0].device
    chunk_tensor: list[int] = []
    chunk_row: list[int] = []
    starts = [0]
    sizes = [t.numel() * t.element_size() // 4 for t in tensors]
    for t, n in enumerate(sizes):
        for r in range(0, max(1, -(-n // COLS)), ITERS):
            chunk_tensor.append(t)
            chunk_row.append(r)
        starts.append(len(chunk_tensor))
    addresses = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    chunks = len(chunk_tensor)
    return _Plan(
        (
            torch.tensor(sizes, dtype=torch.int64, device=device),
            torch.tensor([STATS[t.dtype] for t in tensors], dtype=torch.int32, device=device),
            torch.tensor(chunk_tensor, dtype=torch.int32, device=device),
            torch.tensor(chunk_row, dtype=torch.int64, device=device),
            torch.tensor(starts, dtype=torch.int64, device=device),
        ),
        addresses.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else addresses,
        torch.empty(chunks, 2, dtype=torch.int64, device=device),
        torch.empty(chunks if stats else 1, dtype=torch.float64, device=device),
        torch.empty(chunks if stats else 1, dtype=torch.int32, device=device),
        torch.empty((4 if stats else 2) * len(tensors), dtype=torch.int64, device=device),
    )


def plan_key(tensors: list[torch.Tensor], stats: bool) -> tuple[Any, ...]:
    """What a plan is valid for: the tensors' addresses, sizes, dtypes and layouts, the statistics
    and the stream the step runs on (buffers are reused in that stream's order only)."""
    stream = torch.cuda.current_stream(tensors[0].device).cuda_stream if tensors[0].is_cuda else 0
    return (stats, stream, *[(t.data_ptr(), t.numel(), t.dtype, t.is_contiguous()) for t in tensors])


def known(key: tuple[Any, ...]) -> bool:
    """A plan exists for this key: its tensors passed `takes` when it was made."""
    with _lock:
        return key in _plans


def group_words(
    tensors: list[torch.Tensor], colw: torch.Tensor, row_mults: tuple[int, int], stats: bool, key: tuple[Any, ...]
) -> torch.Tensor:
    """int64 [4T] on the device (or [2T] without `stats`): each tensor's two lane sums, then the
    float64 bits of each tensor's sum of squares, then 1 for each tensor holding a non-finite
    value. The tensors must pass `takes`; `key` is their `plan_key`. The result is a buffer the
    plan reuses: copy it (in stream order) before the next call of the same plan."""
    kernels = _build()
    if kernels is None:
        raise RuntimeError("Triton is unavailable")
    chunk_kernel, reduce_kernel = kernels
    plan = _plan(tensors, stats, key)
    nwords, kind, chunk_tensor, chunk_row, starts = plan.tables
    r0, r1 = row_mults
    chunk_kernel[(chunk_tensor.numel(),)](
        plan.addresses,
        nwords,
        kind,
        chunk_tensor,
        chunk_row,
        colw,
        plan.lanes,
        plan.sq,
        plan.nf,
        R0=r0,
        R1=r1,
        BLOCK=COLS,
        ITERS=ITERS,
        STATS=stats,
        num_warps=8,
    )
    reduce_kernel[(len(tensors),)](
        starts,
        plan.lanes,
        plan.sq,
        plan.nf,
        plan.out,
        plan.out.view(torch.float64),
        len(tensors),
        BLOCK=REDUCE_BLOCK,
        STATS=stats,
        num_warps=4,
    )
    return plan.out


def statistics(words: list[int], count: int) -> list[int]:
    """The group's statistics from `group_words`' host words, as the other paths give them: the
    float64 bits of the sum of squares (summed in tensor order) and how many tensors hold a
    non-finite value."""
    squares = struct.unpack(f"<{count}d", struct.pack(f"<{count}q", *words[2 * count : 3 * count]))
    total = 0.0
    for s in squares:
        total += s
    return [struct.unpack("<q", struct.pack("<d", total))[0], sum(1 for f in words[3 * count : 4 * count] if f)]
