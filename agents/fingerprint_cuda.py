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
costs one. Tables that depend only on the tensors' sizes are built once per layout; the table of
addresses once per set of addresses (the caching allocator hands a training loop the same
addresses step after step), each a fresh pinned copy, so no copy in flight is ever overwritten.

Only float32, bfloat16 and float16 tensors whose bytes are contiguous, 4-byte aligned and a whole
number of words take this path (gradients and weights of real models are); anything else falls
back to the general path. Triton is imported on first use; without it the general path remains.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from typing import Any

import torch

COLS = 4096
ITERS = 16  # rows per chunk: a chunk is 256 KiB of words
REDUCE_BLOCK = 128  # chunks folded per iteration of the reduce kernel
STATS = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}  # how the kernel reads a word's values
_ADDRESS_TABLES = 8
_lock = threading.Lock()
_kernels: dict[int, Any] = {}
_layouts: dict[tuple[str, tuple[int, ...]], tuple[torch.Tensor, ...]] = {}
_addresses: OrderedDict[tuple[str, tuple[int, ...]], torch.Tensor] = OrderedDict()


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


def _layout(sizes: tuple[int, ...], kinds: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Per layout, on the device: words per tensor, value kind per tensor, each chunk's tensor and
    first row, and where each tensor's chunks start (T + 1 entries)."""
    key = (str(device), sizes + kinds)
    with _lock:
        cached = _layouts.get(key)
    if cached is not None:
        return cached
    chunk_tensor: list[int] = []
    chunk_row: list[int] = []
    starts = [0]
    for t, n in enumerate(sizes):
        rows = max(1, -(-n // COLS))
        for r in range(0, rows, ITERS):
            chunk_tensor.append(t)
            chunk_row.append(r)
        starts.append(len(chunk_tensor))
    cached = (
        torch.tensor(sizes, dtype=torch.int64, device=device),
        torch.tensor(kinds, dtype=torch.int32, device=device),
        torch.tensor(chunk_tensor, dtype=torch.int32, device=device),
        torch.tensor(chunk_row, dtype=torch.int64, device=device),
        torch.tensor(starts, dtype=torch.int64, device=device),
    )
    with _lock:
        if len(_layouts) > 64:
            _layouts.clear()
        _layouts[key] = cached
    return cached


def _address_table(addrs: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The tensors' addresses on the device, uploaded once per set of addresses."""
    key = (str(device), addrs)
    with _lock:
        table = _addresses.get(key)
        if table is not None:
            _addresses.move_to_end(key)
            return table
    table = torch.tensor(addrs, dtype=torch.int64)
    if device.type == "cuda":
        table = table.pin_memory().to(device, non_blocking=True)
    with _lock:
        _addresses[key] = table
        while len(_addresses) > _ADDRESS_TABLES:
            _addresses.popitem(last=False)
    return table


def group_words(
    tensors: list[torch.Tensor], colw: torch.Tensor, row_mults: tuple[int, int], stats: bool
) -> torch.Tensor:
    """int64 [4T] on the device (or [2T] without `stats`): each tensor's two lane sums, then the
    float64 bits of each tensor's sum of squares, then 1 for each tensor holding a non-finite
    value. The tensors must pass `takes`; the caller keeps them alive until the words are read."""
    kernels = _build()
    if kernels is None:
        raise RuntimeError("Triton is unavailable")
    chunk_kernel, reduce_kernel = kernels
    device = tensors[0].device
    sizes = tuple(t.numel() * t.element_size() // 4 for t in tensors)
    kinds = tuple(STATS[t.dtype] for t in tensors)
    nwords, kind, chunk_tensor, chunk_row, starts = _layout(sizes, kinds, device)
    addrs = _address_table(tuple(t.data_ptr() for t in tensors), device)
    chunks = chunk_tensor.numel()
    lanes = torch.empty(chunks, 2, dtype=torch.int64, device=device)
    sq = torch.empty(chunks if stats else 1, dtype=torch.float64, device=device)
    nf = torch.empty(chunks if stats else 1, dtype=torch.int32, device=device)
    out = torch.empty((4 if stats else 2) * len(tensors), dtype=torch.int64, device=device)
    r0, r1 = row_mults
    chunk_kernel[(chunks,)](
        addrs,
        nwords,
        kind,
        chunk_tensor,
        chunk_row,
        colw,
        lanes,
        sq,
        nf,
        R0=r0,
        R1=r1,
        BLOCK=COLS,
        ITERS=ITERS,
        STATS=stats,
        num_warps=8,
    )
    reduce_kernel[(len(tensors),)](
        starts,
        lanes,
        sq,
        nf,
        out,
        out.view(torch.float64),
        len(tensors),
        BLOCK=REDUCE_BLOCK,
        STATS=stats,
        num_warps=4,
    )
    return out


def statistics(words: list[int], count: int) -> list[int]:
    """The group's statistics from `group_words`' host words, as the other paths give them: the
    float64 bits of the sum of squares (summed in tensor order) and how many tensors hold a
    non-finite value."""
    squares = struct.unpack(f"<{count}d", struct.pack(f"<{count}q", *words[2 * count : 3 * count]))
    total = 0.0
    for s in squares:
        total += s
    return [struct.unpack("<q", struct.pack("<d", total))[0], sum(1 for f in words[3 * count : 4 * count] if f)]
