"""Bit-exact 64-bit tensor fingerprints (algorithm `protocol.FINGERPRINT_ALGO`).

Why this design: the value must be identical for the same bits on CPU and CUDA and on every
torch version, so the device part uses only exact integer arithmetic. Each 32-bit word x_i of
the tensor's bytes is combined with a position weight w_i (a bijective hash of i, so weights
never repeat with a short period) as (x_i ^ w_i) * (w_i | 1) mod 2^32; multiplying by an odd
number is a bijection, so any single-bit flip changes that term and therefore the exact int64
sum. Two lanes with different weight constants are summed on the device; the host mixes them
with numel and dtype through splitmix64 into one unsigned 64-bit value.

`lane_sums` is the core a compiled or Triton kernel can replace later; everything else is
host bookkeeping.
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import torch

MASK64 = (1 << 64) - 1
_LANES = ((0x27D4EB2D, 0x165667B1), (0x3C6EF372, 0x7FEB352D))  # (multiplier 1, multiplier 2) per lane
_weights_cache: dict[tuple[str, int], torch.Tensor] = {}
_weights_lock = threading.Lock()


def _s32(v: int) -> int:
    """Unsigned 32-bit constant as the signed int32 torch stores."""
    return v - (1 << 32) if v >= 1 << 31 else v


def _lsr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int32 (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (32 - k)) - 1)


def _position_weights(n: int, device: torch.device, lane: int) -> torch.Tensor:
    """w_i = mix(i): odd multiplies and xorshifts, each a bijection of 32-bit words."""
    m1, m2 = _LANES[lane]
    w = torch.arange(n, dtype=torch.int64, device=device).to(torch.int32)
    w = w * _s32(m1)
    w = w ^ _lsr(w, 15)
    w = w * _s32(m2)
    return w ^ _lsr(w, 13)


def _weights(n: int, device: torch.device, lane: int) -> torch.Tensor:
    """Cached weights (grown by doubling) so steady-state steps don't rebuild them."""
    key = (str(device), lane)
    with _weights_lock:
        cached = _weights_cache.get(key)
        if cached is None or cached.numel() < n:
            size = max(n, 2 * (cached.numel() if cached is not None else 0), 1024)
            cached = _position_weights(size, device, lane)
            _weights_cache[key] = cached
    return cached[:n]


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (logical order) as int32 words, zero-padded to a multiple of 4 bytes."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    u8 = flat.contiguous().view(torch.uint8)
    pad = (-u8.numel()) % 4
    if pad or u8.storage_offset() % 4:
        u8 = torch.cat([u8, u8.new_zeros(pad)])
    return u8.view(torch.int32)


def lane_sums(t: torch.Tensor) -> torch.Tensor:
    """Device-side core: int64 tensor [2] of exact lane sums; no host synchronization."""
    x = _words(t)
    out = []
    for lane in range(len(_LANES)):
        w = _weights(x.numel(), x.device, lane)
        out.append(((x ^ w) * (w | 1)).sum(dtype=torch.int64))
    return torch.stack(out)


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def _dtype_code(dtype: torch.dtype | None) -> int:
    name = "none" if dtype is None else str(dtype).removeprefix("torch.")
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def mix(lanes: tuple[int, ...], numel: int, dtype: torch.dtype | None) -> int:
    """Host-side finish: fold numel, dtype and the lane sums into one u64."""
    h = splitmix64(numel ^ _dtype_code(dtype))
    for s in lanes:
        h = splitmix64(h ^ (s & MASK64))
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
    """Fingerprints whose lane sums are in flight to the host; read them a step later."""

    host: torch.Tensor
    event: object | None
    numels: list[int]
    dtypes: list[torch.dtype | None]
    buckets: list[list[int]]

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def per_tensor(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        sums = self.host.tolist()
        return [mix((sums[2 * i], sums[2 * i + 1]), n, d) for i, (n, d) in enumerate(zip(self.numels, self.dtypes))]

    def extra(self) -> list[int]:
        """Raw int64 words appended after the lane sums (used for grad statistics)."""
        return self.host.tolist()[2 * len(self.numels):]

    def result(self) -> tuple[list[int], list[int]]:
        """(per-tensor fingerprints, per-bucket fingerprints)."""
        per = self.per_tensor()
        return per, [fold([per[i] for i in b]) for b in self.buckets]


def start_copy(device_words: torch.Tensor) -> tuple[torch.Tensor, object | None]:
    """One non-blocking device->host copy (pinned on CUDA) plus an event to poll."""
    if device_words.device.type != "cuda":
        return device_words.cpu(), None
    host = torch.empty(device_words.shape, dtype=device_words.dtype, pin_memory=True)
    host.copy_(device_words, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def bucket_fingerprints(
    tensors: list[torch.Tensor | None],
    nbuckets: int = 16,
    buckets: list[list[int]] | None = None,
    extra: torch.Tensor | None = None,
) -> Pending:
    """Per-tensor lane sums on the device into one int64 tensor, then one async copy.

    `None` entries (parameters without a gradient) get the fingerprint of "no tensor".
    `extra` (int64 words) rides along in the same copy.
    """
    present = [t for t in tensors if t is not None]
    device = present[0].device if present else torch.device("cpu")
    zero = torch.zeros(2, dtype=torch.int64, device=device)
    parts = [lane_sums(t) if t is not None else zero for t in tensors]
    if extra is not None:
        parts.append(extra.to(device=device, dtype=torch.int64).reshape(-1))
    words = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    host, event = start_copy(words)
    numels = [t.numel() if t is not None else 0 for t in tensors]
    if buckets is None:
        buckets = balanced_buckets(numels, nbuckets)
    return Pending(host, event, numels, [t.dtype if t is not None else None for t in tensors], buckets)


__all__ = ["fingerprint", "bucket_fingerprints", "lane_sums", "balanced_buckets", "fold", "Pending"]
