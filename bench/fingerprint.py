"""P3: fingerprint throughput vs `tensor.sum()` on the same bytes (target in bench.results.TARGETS).

    python -m bench fingerprint [--mb 256] [--repeat 15] [--device cpu|cuda|all]

Prints one table row per (device, path): GB/s of the fingerprint, GB/s of float32 sum over the
same tensor, and the ratio. The sum is the anchor, measured in the same loop: each repetition
times a pair (sum then fp, the next fp then sum), and the ratio is the median of the pairs' ratios,
so load on a shared machine hits both sides of a pair alike instead of the best-of of one side
meeting a quiet moment the other missed. GB/s are each side's best. On CUDA,
times come from CUDA events. Paths: `agent` (what the agent uses: Triton on CUDA, the native
kernel on the CPU, else the Inductor-compiled one), `native`, `compiled`, `eager` (the
torch-ops reference), `segmented` (~4k small tensors in one call, as a step's parameters are).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import agents.fingerprinting as F
from bench.results import markdown, record, rerun, target


def _timer(device: torch.device):
    if device.type == "cuda":

        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    else:

        def run(fn):
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t

    return run


def _pair(timer, ref, fn, flip: bool) -> tuple[float, float]:
    """(sum seconds, fingerprint seconds) timed back to back; `flip` runs the fingerprint first, so
    neither side always follows the other (warm caches, a thread pool just woken)."""
    if flip:
        t_fp = timer(fn)
        return timer(ref), t_fp
    t_sum = timer(ref)
    return t_sum, timer(fn)


def measure(device: torch.device, mb: int, repeat: int, paths: list[str]) -> list[tuple]:
    n = mb * (1 << 20) // 4
    x = torch.randn(n, device=device)
    words = x.view(torch.int32)
    timer = _timer(device)
    small = list(x[: (1 << 22)].split(1000))  # ~4k tensors of 1000 floats
    fns = {
        "agent": lambda: F.lane_sums_words(words),
        "native": lambda: F._lane_sums_native(words),
        "compiled": lambda: F._lane_sums_compiled(words),
        "triton": lambda: F._lane_sums_triton(words),
    }
    checks = {"native": F._lane_sums_native, "compiled": F._lane_sums_compiled, "triton": F._lane_sums_triton}
    fns |= {
        "eager": lambda: F._lane_sums_eager(words),
        "segmented": lambda: F.per_tensor_lane_sums(small),
    }
    rows = []
    for name in paths:
        fn = fns[name]
        nbytes = sum(t.numel() for t in small) * 4 if name == "segmented" else n * 4
        ref = (lambda: x[: (1 << 22)].sum()) if name == "segmented" else (lambda: x.sum())
        try:
            if name in checks:
                F._verify(name, checks[name], device)
            fn(), ref(), fn()  # warm up (compiles, verification)
        except Exception as e:  # noqa: BLE001
            rows.append((device.type, name, f"unavailable: {type(e).__name__}: {str(e)[:60]}", "", ""))
            continue
        reps = 2 if name == "eager" else repeat
        pairs = [_pair(timer, ref, fn, flip=i % 2 == 1) for i in range(reps)]
        t_sum, t_fp = min(p[0] for p in pairs), min(p[1] for p in pairs)
        ratio = statistics.median(s / f for s, f in pairs)
        rows.append((device.type, name, f"{nbytes / t_fp / 1e9:.1f}", f"{nbytes / t_sum / 1e9:.1f}", f"{ratio:.2f}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--repeat", type=int, default=15)
    p.add_argument("--device", default="all", help="cpu, cuda or all (cuda when available)")
    p.add_argument("--paths", default="agent,native,compiled,triton,eager", help="comma-separated")
    args = p.parse_args(argv)
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    devices = [d for d in devices if d != "cuda" or torch.cuda.is_available()]
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {args.mb} MiB float32, {args.repeat} pairs, algo {F.ALGO}, load {load:.1f}")
    print(f"{'device':<7} {'path':<10} {'fp GB/s':>10} {'sum GB/s':>10} {'ratio':>6}")
    table = []
    for d in devices:
        paths = [q for q in args.paths.split(",") if (q != "triton" or d == "cuda") and (q != "native" or d == "cpu")]
        for row in measure(torch.device(d), args.mb, args.repeat, paths):
            if row[3] == "":
                print(f"{row[0]:<7} {row[1]:<10} {row[2]}")
            else:
                print(f"{row[0]:<7} {row[1]:<10} {row[2]:>10} {row[3]:>10} {row[4]:>6}")
            table.append(row)
    print(f"fast paths equal to the reference (checked once per device): {F._verified}")
    print(f"target P3: ratio {target('P3')} for `agent`")
    record(
        "fingerprint",
        markdown(("device", "path", "fingerprint GB/s", "sum GB/s", "ratio"), table),
        rerun("fingerprint", argv),
        f"P3 (target: ratio {target('P3')} for `agent`): torch {torch.__version__}, {args.mb} MiB float32, "
        f"{torch.get_num_threads()} threads, ratio the median of {args.repeat} back-to-back (sum, fingerprint) pairs, "
        f"GB/s each side's best; load average before the run {load:.1f} on {os.cpu_count()} cores (a shared machine); "
        f"algorithm {F.ALGO}; fast paths equal to the reference: {F._verified}.",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
