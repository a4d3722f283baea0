"""CPU fast path of the fingerprint: `fingerprint_native.c`, compiled once per machine, called via ctypes.

Why not Inductor: its vectorized int32 loop for the same sums ran at 0.15-0.40x of `tensor.sum()`
on a 2-core EPYC (one row at a time, masked tails); this loop (two rows per pass, so the column
weights are loaded once per pair) runs near memory speed, and one call takes all of a step's
tensors without concatenating them. Large tensors are split by rows over torch's intra-op thread
count, as `tensor.sum()` is, and the pieces run on torch's own OpenMP threads (see the C file: a
thread pool of our own ran at half speed next to torch's threads spin-waiting after the backward
pass, 0.55-0.64x of `sum()` against 0.8x and more now). A compiler without OpenMP gives a
one-thread build.

Built with the C compiler Inductor needs anyway (`$CC`, else cc or gcc) into `$LOCKSTEP_CACHE_DIR`
(default ~/.cache/lockstep), keyed by source, recipe (compiler commands, OpenMP runtime) and the CPU's
feature flags (the build uses -march=native, so a cache shared between unlike machines must never
hand out a foreign binary). Recipes are tried best first (`_recipes`); when none builds and loads,
the Inductor and eager paths remain; `LOCKSTEP_FP_NATIVE=0` skips it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
from array import array
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("fingerprint_native.c")
COLS = 4096
SPLIT_WORDS = 1 << 20  # below this (4 MiB) a call stays on the calling thread
_lock = threading.Lock()
_lib: ctypes.CDLL | None | bool = None  # False: tried and failed


def _cpu_identity() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    lines = [line for line in text.splitlines() if line.startswith(("flags", "model name", "Features", "CPU part"))]
    return platform.machine() + "\n" + "\n".join(sorted(set(lines)))


def _cache_dir() -> Path:
    return Path(os.environ.get("LOCKSTEP_CACHE_DIR") or Path.home() / ".cache" / "lockstep")


def _openmp_runtime() -> str | None:
    """Path of the OpenMP runtime torch brought into this process (libgomp, or LLVM's or Intel's,
    which speak libgomp's ABI too), whatever its file is called (wheels rename it)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split()[-1]
        if os.path.basename(path).startswith(("libgomp", "libomp", "libiomp5")) and ".so" in path:
            return path
    return None


def _recipes(cc: str) -> list[tuple[str, list[list[str]]]]:
    """(name, commands) that build {lib} from {src}, best first. The OpenMP build is linked against
    torch's own runtime file, so the library needs that runtime's soname and shares its threads."""
    native = ["-O3", "-march=native", f"-DCOLS={COLS}"]
    recipes = []
    runtime = _openmp_runtime()
    if runtime:
        recipes.append(
            (
                f"{cc} openmp {runtime}",
                [
                    [cc, *native, "-fopenmp", "-fPIC", "-c", "-o", "{obj}", "{src}"],
                    [cc, "-shared", "-o", "{lib}", "{obj}", runtime, f"-Wl,-rpath,{os.path.dirname(runtime)}"],
                ],
            )
        )
    recipes.append((f"{cc} native", [[cc, *native, "-shared", "-fPIC", "-o", "{lib}", "{src}"]]))
    recipes.append((f"{cc} portable", [[cc, "-O3", f"-DCOLS={COLS}", "-shared", "-fPIC", "-o", "{lib}", "{src}"]]))
    return recipes


def _compile(out: Path) -> bool:
    source = SOURCE.read_bytes()
    compilers = [c for c in (os.environ.get("CC"), "cc", "gcc") if c]
    for cc in compilers:
        for _name, commands in _recipes(cc):
            key = hashlib.sha256(b"\0".join([source, repr(commands).encode(), _cpu_identity().encode()]))
            target = out / f"fingerprint-{key.hexdigest()[:16]}.so"
            if target.exists():
                if _load(target):
                    return True
                continue
            out.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out) as tmp:
                paths = {"src": str(SOURCE), "obj": f"{tmp}/kernel.o", "lib": f"{tmp}/{target.name}"}
                if _run_all([[arg.format(**paths) for arg in cmd] for cmd in commands]):
                    os.replace(paths["lib"], target)  # atomic: ranks building at once each install a whole file
                    if _load(target):
                        return True
    return False


def _run_all(commands: list[list[str]]) -> bool:
    for cmd in commands:
        try:
            if subprocess.run(cmd, capture_output=True, timeout=60).returncode != 0:
                return False
        except (OSError, subprocess.SubprocessError):
            return False
    return True


def _load(path: Path) -> bool:
    """False when the library does not load (an OpenMP build against a libgomp this process lacks)."""
    global _lib
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return False
    fn = lib.lockstep_lane_sums
    fn.restype = None
    fn.argtypes = [
        ctypes.c_int64,
        *[ctypes.c_void_p] * 6,
        ctypes.c_uint32,
        ctypes.c_uint32,
        ctypes.c_void_p,
        ctypes.c_int,
    ]
    _lib = lib
    return True


def available() -> bool:
    """Build or load the kernel once per process; False when it cannot be had."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                ok = False
                if os.environ.get("LOCKSTEP_FP_NATIVE", "1") != "0":
                    try:
                        ok = _compile(_cache_dir())
                    except OSError:
                        ok = False
                if not ok:
                    _lib = False
    return bool(_lib)


def _pieces(spans: list[tuple[int, int]], threads: int) -> list[tuple[int, int, int, int, int]]:
    """(span index, data pointer, words, first row, end row): big spans cut into row ranges of at
    most SPLIT_WORDS, at least `threads` of them. Small pieces taken dynamically keep every thread
    busy when one is descheduled on a loaded machine (halves left the other thread waiting: 0.5x of
    `sum()` at load 6 on 2 cores, where torch's sum kept pace)."""
    pieces = []
    for j, (ptr, n) in enumerate(spans):
        rows = (n + COLS - 1) // COLS
        if n < SPLIT_WORDS or threads == 1:
            pieces.append((j, ptr, n, 0, rows))
            continue
        step = min(-(-rows // threads), SPLIT_WORDS // COLS)
        pieces.extend((j, ptr, n, first, min(rows, first + step)) for first in range(0, rows, step))
    return pieces


def lane_sums(
    spans: list[tuple[int, int]], colw: torch.Tensor, row_mults: tuple[int, int], stats: list[bool] | None = None
) -> tuple[list[int], float, int]:
    """Lane sums of (address, words) spans of 32-bit words in CPU memory (the caller keeps the
    memory alive): [lane 0, lane 1] per span, flat, as 32-bit ints; and over the spans flagged in
    `stats` (float32 data) the float64 sum of squares and how many spans hold a non-finite value.

    Runs inside every optimizer step, so the call's own cost counts: the piece table and the
    results live in `array` buffers (a few microseconds, where torch tensors cost tens)."""
    if not available() or not isinstance(_lib, ctypes.CDLL):
        raise RuntimeError("native fingerprint kernel unavailable")
    total = sum(n for _, n in spans)
    threads = max(1, torch.get_num_threads()) if total >= SPLIT_WORDS else 1
    pieces = _pieces(spans, threads)
    flags = stats or [False] * len(spans)
    columns = [array("q", (p[k] for p in pieces)) for k in range(1, 5)]
    columns.append(array("q", (int(flags[p[0]]) for p in pieces)))
    addresses = [c.buffer_info()[0] for c in columns]
    out = array("q", bytes(32 * len(pieces)))  # per piece: lane 0, lane 1, sum of squares (bits), non-finite
    colw = colw.contiguous()
    _lib.lockstep_lane_sums(
        len(pieces), *addresses, colw.data_ptr(), row_mults[0], row_mults[1], out.buffer_info()[0], threads
    )
    lanes = [0] * (2 * len(spans))
    squares, nonfinite = 0.0, [0] * len(spans)
    square_bits = array("d", out.tobytes())
    for i, p in enumerate(pieces):
        j = 2 * p[0]
        lanes[j] = (lanes[j] + out[4 * i]) & 0xFFFFFFFF
        lanes[j + 1] = (lanes[j + 1] + out[4 * i + 1]) & 0xFFFFFFFF
        squares += square_bits[4 * i + 2]
        nonfinite[p[0]] += out[4 * i + 3]
    return lanes, squares, sum(n > 0 for n in nonfinite)
