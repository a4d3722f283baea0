import os

import pytest
import torch

from agents import fingerprint
from agents.fingerprinting import balanced_buckets, bucket_fingerprints, fold

MASK = (1 << 64) - 1


def test_known_value_regression():
    # Changing the algorithm changes every stored fingerprint: bump agents.fingerprinting.ALGO if this fails.
    assert fingerprint(torch.arange(10, dtype=torch.float32)) == 13012803974516118967
    assert fingerprint(torch.arange(5000, dtype=torch.float32)) == 972587530987246311  # more than one row


def test_unsigned_64_bit_and_clone_equal():
    t = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    fp = fingerprint(t)
    assert 0 <= fp <= MASK
    assert fingerprint(t.clone()) == fp
    assert fingerprint(t.view(10, 100).t().contiguous().t()) == fp  # same logical values, other layout


@pytest.mark.parametrize("bit", [0, 7, 22, 31])
def test_every_single_bit_flip_changes_it(bit):
    t = torch.randn(4097, generator=torch.Generator().manual_seed(2))
    base = fingerprint(t)
    for pos in (0, 1, 2048, 4096):
        u = t.clone()
        u.view(torch.int32)[pos] ^= 1 << bit if bit < 31 else -(1 << 31)
        assert fingerprint(u) != base


def test_swap_of_far_apart_elements_changes_it():
    t = torch.randn(1 << 16, generator=torch.Generator().manual_seed(3))
    base = fingerprint(t)
    for i, j in ((0, 1), (0, 1 << 15), (5, (1 << 16) - 1), (100, 100 + 4096)):
        u = t.clone()
        u[i], u[j] = t[j].item(), t[i].item()
        assert fingerprint(u) != base


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int64, torch.bool],
)
def test_dtypes_and_odd_byte_counts(dtype):
    for n in (0, 1, 3, 5, 1001):
        t = (torch.arange(n) % 3).to(dtype)
        assert fingerprint(t) == fingerprint(t.clone())
        if n and dtype != torch.bool:
            u = t.clone()
            u.view(torch.uint8)[-1] ^= 1
            assert fingerprint(u) != fingerprint(t)


def test_dtype_and_shape_padding_are_distinguished():
    assert fingerprint(torch.zeros(4, dtype=torch.int8)) != fingerprint(torch.zeros(1, dtype=torch.int32))
    assert fingerprint(torch.zeros(3, dtype=torch.int8)) != fingerprint(torch.zeros(4, dtype=torch.int8))


def test_unaligned_slice_of_bf16():
    t = torch.randn(9).to(torch.bfloat16)
    assert fingerprint(t[1:]) == fingerprint(t[1:].clone())


def test_bucket_fingerprints_match_per_tensor_and_fold():
    ts = [torch.randn(n, generator=torch.Generator().manual_seed(n)) for n in (5, 100, 7, 3000)]
    per, buckets = bucket_fingerprints(ts + [None], nbuckets=2).result()
    assert per[:4] == [fingerprint(t) for t in ts]
    layout = balanced_buckets([t.numel() for t in ts] + [0], 2)
    assert buckets == [fold([per[i] for i in b]) for b in layout]


def test_balanced_buckets_are_contiguous_and_bounded():
    layout = balanced_buckets([1] * 40, 16)
    assert len(layout) == 16 and [i for b in layout for i in b] == list(range(40))
    assert balanced_buckets([10, 1], 16) == [[0], [1]]
    assert balanced_buckets([], 16) == []


def _mod32(t):
    return t & 0xFFFFFFFF


def _words(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << 31), (1 << 31) - 1, (n,), dtype=torch.int32, generator=g)


def test_compiled_and_segmented_paths_equal_the_reference():
    import agents.fingerprinting as F

    for n in (4096 * 3 + 17, 4096 * 5):
        x = _words(n, n)
        assert torch.equal(_mod32(F._lane_sums_compiled(x)), _mod32(F._lane_sums_eager(x)))
    xs = [_words(n, n) for n in (0, 1, 4095, 4096, 4097, 70000, 3 * 4096 + 17)]
    seg = F.segmented_lane_sums(xs)
    assert all(torch.equal(_mod32(seg[:, j]), _mod32(F._lane_sums_eager(x))) for j, x in enumerate(xs))
    assert F._verified.get(("compiled", "cpu")) is True


def test_native_kernel_equals_the_reference_for_every_layout(monkeypatch):
    """Full row pairs, a single full row, partial rows, empty tensors, odd byte counts, copies of
    non-contiguous views, and big tensors split by rows over threads."""
    import agents.fingerprinting as F
    from agents import fingerprint_native

    assert fingerprint_native.available()
    tensors = [_words(n, n) for n in (0, 1, 7, 4095, 4096, 4097, 2 * 4096, 3 * 4096 + 17)]
    tensors += [
        torch.randn(3, 5).t(),
        torch.ones(7, dtype=torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.randn(4, dtype=torch.complex64),
    ]
    expected = torch.stack([F._lane_sums_eager(F._words(t)) for t in tensors])
    assert torch.equal(_mod32(torch.tensor(F._native_many(tensors)[0]).view(-1, 2)), _mod32(expected))
    big = _words((1 << 20) + 3 * 4096 + 5, 9)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert len(fingerprint_native._pieces([(big.data_ptr(), big.numel())], 3)) == 3
    assert torch.equal(_mod32(F._lane_sums_native(big)), _mod32(F._lane_sums_eager(big)))


def test_native_builds_share_torchs_openmp_runtime_or_fall_back(monkeypatch, tmp_path):
    """The OpenMP build links the runtime file torch loaded (no second libgomp in the process);
    without one (or when it fails to build) the one-thread build gives the same sums."""
    import agents.fingerprinting as F
    from agents import fingerprint_native

    runtime = fingerprint_native._openmp_runtime()
    assert runtime and os.path.realpath(runtime).startswith(os.path.realpath(os.path.dirname(torch.__file__)))
    big = _words((1 << 20) + 3 * 4096 + 5, 11)
    expected = _mod32(F._lane_sums_eager(big))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    for found in (runtime, None):
        monkeypatch.setattr(fingerprint_native, "_openmp_runtime", lambda found=found: found)
        monkeypatch.setenv("LOCKSTEP_CACHE_DIR", str(tmp_path / str(bool(found))))
        monkeypatch.setattr(fingerprint_native, "_lib", None)
        assert fingerprint_native.available()
        assert torch.equal(_mod32(F._lane_sums_native(big)), expected)
    runtimes = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line or "libomp" in line}
    assert runtimes == {runtime}


def test_native_pass_gives_the_gradient_statistics_of_the_torch_ops():
    """Sum of squares and non-finite tensors from the fingerprint's own pass equal what
    agents.grads._grad_stats computes with torch ops (NaN in one tensor, inf in another), except
    that finite values whose float32 norm overflows are not miscounted as non-finite."""
    import struct

    import agents.fingerprinting as F
    from agents.grads import _grad_stats

    g = torch.Generator().manual_seed(3)
    sizes = (3, 4096, 2 * 4096 + 9, 70000, 3 * 4096, 9 * 4096)
    grads = [torch.randn(n, generator=g) for n in sizes] + [None, torch.full((5,), 3e20)]
    grads[1][17] = float("nan")  # one row alone
    grads[2][4096 * 2 + 3] = float("-inf")  # the ragged last row
    grads[4][4096 + 5] = float("nan")  # inside a row pair
    grads[5][6 * 4096 + 100] = float("inf")  # inside a block of rows read together
    grads[3][1000:1010] = 3e20  # finite, but their float32 squares overflow: read again in double
    sums, stats = F.lane_sums_and_stats(grads, stats=True)
    present = [t for t in grads if t is not None]
    assert torch.equal(sums, F.lane_sums_and_stats(grads, stats=False)[0])
    assert int(stats[1]) == 4
    assert int(_grad_stats(present)[1]) == 6  # torch's float32 norms of the 3e20s overflow to inf
    finite = [t for i, t in enumerate(present) if i not in (1, 2, 4, 5)]
    native = F.lane_sums_and_stats(finite, stats=True)[1]
    as_float = lambda words: struct.unpack("<d", struct.pack("<q", int(words[0])))[0]  # noqa: E731
    assert as_float(native) == pytest.approx(sum(float((t.double() ** 2).sum()) for t in finite), rel=1e-5)
    assert int(native[1]) == 0
    halves = [t.half() for t in finite]  # not float32: statistics are left to the caller
    assert F.lane_sums_and_stats(halves, stats=True)[1] is None


def test_without_the_native_kernel_the_values_do_not_change(monkeypatch):
    import agents.fingerprinting as F
    from agents import fingerprint_native

    tensors = [torch.randn(n) for n in (5, 5000, 70000)] + [None]
    native = F.per_tensor_lane_sums(tensors)
    assert F._verified[("native", "cpu")] is True
    monkeypatch.setattr(fingerprint_native, "_lib", False)  # no compiler on this machine
    monkeypatch.setattr(F, "_verified", {})
    assert torch.equal(_mod32(F.per_tensor_lane_sums(tensors)), _mod32(native))
    assert F._verified[("native", "cpu")] is False


def test_big_tensor_uses_fast_path_and_agrees(monkeypatch):
    import agents.fingerprinting as F

    monkeypatch.setitem(F.BIG_WORDS, "cpu", 1 << 14)
    t = torch.randn(3 * 4096 * 2 + 5)
    fast = fingerprint(t)
    monkeypatch.setitem(F.BIG_WORDS, "cpu", 1 << 40)
    assert fingerprint(t) == fast


def test_agent_kernels_never_show_up_as_user_compiles(monkeypatch):
    import agents.fingerprinting as F
    from agents import protocol
    from agents.capture import CompileCapture, install, uninstall

    monkeypatch.setattr(F, "_compiled", {})
    monkeypatch.setattr(F, "_verified", {("native", "cpu"): False})  # the Inductor kernel is the one at risk
    monkeypatch.setattr(F, "_layout_cache", {})
    events: list = []
    handler = CompileCapture(events.append, lambda: 0)
    install(handler)
    try:
        per, _ = bucket_fingerprints([torch.randn(300), torch.randn(5000), None], 2).result()
    finally:
        uninstall(handler)
    assert not [e for e in events if isinstance(e, (protocol.Compile, protocol.GraphBreak))]
    assert F._verified.get(("compiled", "cpu")) is True  # the compiled kernel really ran


def test_cpu_and_h200_give_the_same_values():
    """tests/fixtures/fingerprint_probe_h200.json: agents.probe run on the CPU and on an H200
    (torch 2.11, Triton kernel); this machine (any torch) must reproduce both."""
    import json
    import os

    from agents.fingerprinting import ALGO
    from agents.probe import fingerprints

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "fingerprint_probe_h200.json")
    with open(path) as f:
        fixture = json.load(f)
    assert fixture["cuda"]["device"] == "cuda" and fixture["cuda"]["torch"].startswith("2.11")
    assert fixture["cuda"]["algo"] == fixture["cpu"]["algo"] == ALGO
    assert fixture["cuda"]["fps"] == fixture["cpu"]["fps"] == fingerprints("cpu")


def test_host_pending_equals_the_general_path():
    """The CPU fast path (Python ints from kernel to host words) gives the bucket fingerprints,
    per-tensor fingerprints and statistics of the general path; it declines what it cannot take."""
    import struct

    import agents.fingerprinting as F

    g = torch.Generator().manual_seed(5)
    tensors = [torch.randn(n, generator=g) for n in (5, 4096 * 3 + 1, 300)]
    tensors.insert(1, None)
    buckets = [[0, 1], [2], [3]]
    fast = F.host_pending(tensors, buckets, stats=True)
    sums, extra = F.lane_sums_and_stats(tensors, stats=True)
    slow = F.bucket_fingerprints(tensors, buckets=buckets, extra=extra, sums=sums)
    assert (
        fast.result() == slow.result()
        and fast.result()[1] == F.bucket_fingerprints(tensors, buckets=buckets).result()[1]
    )
    assert fast.extra()[1] == slow.extra()[1] == 0
    squares = struct.unpack("<d", struct.pack("<q", fast.extra()[0]))[0]
    assert squares == pytest.approx(sum(float((t.double() ** 2).sum()) for t in tensors if t is not None), rel=1e-5)
    weights = F.host_pending(tensors, buckets, stats=False)
    assert weights.result() == slow.result() and weights.extra() == []
    assert F.host_pending([t.half() if t is not None else None for t in tensors], buckets, stats=True) is None
    assert F.host_pending([], [], stats=True) is None


def test_group_kernels_words_are_read_back_as_the_other_paths_give_them():
    """The CUDA group path's host words (lanes of present tensors, per-tensor squares, non-finite
    flags) become the common layout: zero lanes for absent gradients, the squares summed in tensor
    order and the tensors holding a non-finite value counted."""
    import struct

    from agents.fingerprint_cuda import statistics
    from agents.fingerprinting import _group_layout

    squares = [2.5, float("inf"), 0.25]
    raw = [11, 12, 21, 22, 31, 32] + [struct.unpack("<q", struct.pack("<d", s))[0] for s in squares] + [0, 1, 0]
    words = _group_layout([True, False, True, True], True, raw)
    assert words[:8] == [11, 12, 0, 0, 21, 22, 31, 32]
    assert struct.unpack("<d", struct.pack("<q", words[8]))[0] == float("inf") and words[9] == 1
    finite = statistics(raw[:6] + raw[6:7] + raw[8:9] + raw[6:7] + [0, 0, 0], 3)
    assert struct.unpack("<d", struct.pack("<q", finite[0]))[0] == 5.25 and finite[1] == 0
    assert _group_layout([False, True], False, [7, 8]) == [0, 0, 7, 8]


def test_group_kernels_take_only_whole_words_of_known_dtypes_on_one_gpu():
    from agents.fingerprint_cuda import takes
    from agents.fingerprinting import device_pending

    assert not takes([])
    assert not takes([torch.zeros(4)])  # the CPU has its native pass
    assert device_pending([torch.zeros(4), None], [[0, 1]], stats=True) is None


def test_the_gpu_group_kernels_give_the_cpu_values():
    """tests/fixtures/fingerprint_probe_group.json: `agents.probe --group` on an H100 (torch 2.11,
    Triton): the two-launch kernels of agents/fingerprint_cuda.py took the tensors (path "group") and
    gave the fingerprints this machine computes on the CPU, and counted the tensors whose bits hold a
    NaN or an infinity."""
    import json
    import os

    from agents.probe import group, group_tensors

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "fingerprint_probe_group.json")
    with open(path) as f:
        cuda = json.load(f)["cuda"]
    assert cuda["device"] == "cuda" and cuda["group"]["path"] == "group"
    assert cuda["group"]["fps"] == group("cpu")["fps"]
    assert cuda["group"]["nonfinite"] == sum(not bool(t.float().isfinite().all()) for t in group_tensors())
