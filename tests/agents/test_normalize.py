import json
import os
import tarfile

import pytest

from agents.normalize import hash_text, normalize

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "trace_211_cuda.tgz")


@pytest.mark.parametrize(
    "a,b",
    [
        ('x: "f32[4][1]cuda:0" = y', 'x: "f32[4][1]cuda:7" = y'),
        ("device(type='cuda', index=0)", "device(type='cuda', index=3)"),
        (
            "with torch.cuda._DeviceGuard(0):\n torch.cuda.set_device(0)\n stream0 = get_raw_stream(0)",
            "with torch.cuda._DeviceGuard(1):\n torch.cuda.set_device(1)\n stream1 = get_raw_stream(1)",
        ),
        ("<object at 0x7f3a2b4c5d60>", "<object at 0x7f99aa00bb11>"),
        ("# kernel path: /tmp/torchinductor_root/5u/c5ubtvk.py", "# kernel path: /tmp/torchinductor_bob/pt/cpti.py"),
        ("open('/tmp/tmpab12_x/out.bin')", "open('/tmp/tmpzz99q/out.bin')"),
        (
            "_c10d_functional.all_gather_into_tensor(mul, 2, '0')",
            "_c10d_functional.all_gather_into_tensor(mul, 2, '3')",
        ),
        ("group_name='tp:1'", "group_name='tp:2'"),
        ("rank=0 local_rank: 0", "rank=5 local_rank: 1"),
    ],
)
def test_rank_specific_text_normalizes_equal(a, b):
    assert a != b and normalize(a) == normalize(b)
    ha, hb = hash_text(a), hash_text(b)
    assert ha.raw != hb.raw and ha.norm == hb.norm


@pytest.mark.parametrize(
    "a,b",
    [
        ('x: "f32[4][1]cuda:0"', 'x: "f32[5][1]cuda:0"'),
        ("torch.ops.aten.mul.Tensor(a, 2)", "torch.ops.aten.mul.Tensor(a, 3)"),
        ("cuda:0", "cpu"),
    ],
)
def test_real_differences_survive(a, b):
    assert normalize(a) != normalize(b)


def test_hash_format():
    h = hash_text("abc")
    assert len(h.raw) == 32 and int(h.raw, 16) >= 0 and h.raw != hash_text("abd").raw


def _parse(f) -> list[tuple[dict, str]]:
    recs: list[tuple[dict, list[str]]] = []
    for line in f.read().decode().splitlines(keepends=True):
        if line.startswith("\t"):
            recs[-1][1].append(line[1:])
        else:
            recs.append((json.loads(line[line.index("] {") + 2 :]), []))
    return [(m, "".join(p)) for m, p in recs]


def test_real_two_rank_cuda_trace_normalizes_equal():
    with tarfile.open(FIXTURE) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith(".log")), key=lambda m: m.name)
        ranks = [_parse(tar.extractfile(m)) for m in members]
    assert len(ranks) == 2
    for kind in ("dynamo_output_graph", "inductor_output_code"):
        texts = [[p for m, p in recs if kind in m] for recs in ranks]
        assert texts[0] and len(texts[0]) == len(texts[1])
        for a, b in zip(*texts):
            assert a != b  # raw text is rank-specific (cuda:0 vs cuda:1)
            assert hash_text(a).norm == hash_text(b).norm


@pytest.mark.parametrize(
    "path,expected",
    [
        ("/usr/lib/python3.12/contextlib.py", "contextlib.py"),
        ("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py", "torch/nn/modules/linear.py"),
        (
            "/home/u/.venv/lib/python3.13t/site-packages/torch/_dynamo/external_utils.py",
            "torch/_dynamo/external_utils.py",
        ),
        ("/usr/lib/python3/dist-packages/numpy/core.py", "numpy/core.py"),
        ("/root/.pyenv/versions/3.11.7/lib/python3.11/functools.py", "functools.py"),
        ("<frozen runpy>", "<frozen runpy>"),
    ],
)
def test_library_frames_read_the_same_under_every_install(path, expected):
    from agents.normalize import frame_path

    assert frame_path(path) == expected


def test_user_frames_are_relative_to_the_script_or_by_name_and_old_keys_canonicalise():
    from agents.normalize import canonical_frame, frame_key, frame_label

    assert (
        frame_key("/work/a/proj/models/block.py", 88, "Block.forward", "/work/a/proj")
        == "models/block.py:88:Block.forward"
    )
    assert frame_key("/elsewhere/lib/block.py", 88, "Block.forward", "/work/a/proj") == "block.py:88:Block.forward"
    assert frame_key("demo/ddp_job.py", 3, "main", "demo") == "ddp_job.py:3:main"
    assert canonical_frame("/usr/lib/python3.12/contextlib.py:105:__init__") == "contextlib.py:105:__init__"
    assert canonical_frame("/work/steering/probes/trace_scenario.py:20:gather") == "trace_scenario.py:20:gather"
    assert canonical_frame("torch/_dynamo/external_utils.py:67:inner") == "torch/_dynamo/external_utils.py:67:inner"
    assert frame_label("model.py:88:Block.forward") == "model.py:88 Block.forward"
