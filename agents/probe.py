"""A fixed, device-independent probe tensor and its fingerprints (CPU vs CUDA fixture)."""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import torch

from agents.fingerprinting import ALGO, bucket_fingerprints, device_pending, fingerprint, host_pending

SIZES = {"f32_1m": (1 << 20) + 3, "bf16_small": 1001, "f32_3rows": 3 * 4096 + 5}


def probe_tensors() -> dict[str, torch.Tensor]:
    """Deterministic contents on every machine: integer patterns built on the CPU."""
    out = {}
    for name, n in SIZES.items():
        i = torch.arange(n, dtype=torch.int64)
        words = ((i * 2654435761 + 12345) % (1 << 32) - (1 << 31)).to(torch.int32)
        if name.startswith("bf16"):
            out[name] = words.view(torch.bfloat16)[:n]
        else:
            out[name] = words.view(torch.float32)
    return out


def fingerprints(device: str = "cpu") -> dict[str, str]:
    return {name: str(fingerprint(t.to(device))) for name, t in probe_tensors().items()}


def group_tensors() -> list[torch.Tensor]:
    """A step's worth of gradients as the group paths take them: whole words of float32 and bfloat16."""
    t = probe_tensors()
    return [t["f32_1m"], t["bf16_small"][:1000], t["f32_3rows"], t["f32_3rows"][:8].clone()]


def group(device: str = "cpu") -> dict[str, Any]:
    """Per-tensor fingerprints and statistics of `group_tensors` as the optimizer hook takes them
    (the native pass on the CPU, the two-launch kernels on CUDA) and the path that took them."""
    tensors: list[torch.Tensor | None] = [t.to(device) for t in group_tensors()]
    buckets = [[0, 1], [2, 3]]
    pending = host_pending(tensors, buckets, stats=True) or device_pending(tensors, buckets, stats=True)
    path = "native" if device == "cpu" else "group"
    if pending is None:
        pending, path = bucket_fingerprints(tensors, buckets=buckets), "general"
    stats = pending.extra() if path != "general" else [0, None]
    squares = struct.unpack("<d", struct.pack("<q", stats[0]))[0]
    return {
        "path": path,
        "fps": [str(fp) for fp in pending.per_tensor()],
        "sumsq": repr(squares),
        "nonfinite": stats[1],
    }


if __name__ == "__main__":
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    out = {"device": dev, "torch": torch.__version__, "algo": ALGO, "fps": fingerprints(dev)}
    if "--group" in sys.argv:
        out["group"] = group(dev)
    print(json.dumps(out))
