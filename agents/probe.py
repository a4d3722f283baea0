"""A fixed, device-independent probe tensor and its fingerprints (CPU vs CUDA fixture)."""

from __future__ import annotations

import json
import sys

import torch

from agents.fingerprinting import ALGO, fingerprint

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


if __name__ == "__main__":
    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    print(json.dumps({"device": dev, "torch": torch.__version__, "algo": ALGO, "fps": fingerprints(dev)}))
