"""The compile bill on the real recordings: the H200 NCCL spool (torch 2.11) and one job recorded under
torch 2.11 and 2.13, checked against sums of the compile times read straight from the spooled
event files (each rank's `times.entire_frame_compile_time_s`), not through the code under test."""

from __future__ import annotations

import gzip
import json
import os
from collections import defaultdict

import pytest

from tests.agents.test_fixtures_ingest import _unpack, _upload

pytestmark = pytest.mark.django_db
RECORDINGS = [
    ("ddp_h200_spool.tgz", "h200-ddp-nccl"),
    ("compare_211_spool.tgz", "compare-211"),
    ("compare_213_spool.tgz", "compare-213"),
]


def raw_events(directory: str) -> list[tuple[int, dict]]:
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.startswith("r"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            body = f.read()
        batch = json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)
        out += [(batch["rank"], e) for e in batch["events"]]
    return out


def hand_bill(events: list[tuple[int, dict]], world: int) -> tuple[float, dict[str, float], dict[tuple, float]]:
    """Per step (or, for compiles outside the steps, per compile slot): world x the slowest rank's compile
    seconds; per frame, world x the slowest rank's seconds on that frame; per recompile (frame, index)."""
    units: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for rank, e in events:
        if e["t"] == "compile":
            unit = ("step", e["step"]) if e.get("step") is not None else ("slot", e["frame"], e.get("index", 0))
            units[unit][rank].append(e)
    total, frames, recompiles = 0.0, defaultdict(float), defaultdict(float)
    for by_rank in units.values():
        seconds = {r: sum(e["times"]["entire_frame_compile_time_s"] for e in es) for r, es in by_rank.items()}
        slowest = min(seconds, key=lambda r: (-seconds[r], r))
        total += world * seconds[slowest]
        for e in by_rank[slowest]:
            frames[e["frame"]] += world * e["times"]["entire_frame_compile_time_s"]
            if e.get("index", 0) > 0:
                recompiles[(e["frame"], e["index"])] += world * e["times"]["entire_frame_compile_time_s"]
    return total, dict(frames), dict(recompiles)


@pytest.fixture
def recordings(post, tmp_path):
    found = {}
    for name, key in RECORDINGS:
        directory = _unpack(name, tmp_path / name)
        _upload(post, directory)
        found[key] = raw_events(directory)
    return found


def test_bill_is_world_size_times_the_slowest_rank_per_step_on_real_recordings(recordings):
    from dashboard.detection.cost import bill_of
    from dashboard.tenancy.models import Run

    for key, events in recordings.items():
        assert not [e for _, e in events if e["t"] == "progress" and e.get("phase") == "collective"]  # nothing measured
        run = Run.objects.get(key=key)
        total, frames, recompiles = hand_bill(events, run.world_size)
        bill = bill_of(run)
        assert bill["gpu_seconds"] == pytest.approx(total, abs=1e-2), key
        assert bill["basis"]["measured_units"] == 0 and bill["basis"]["assumed_s"] == pytest.approx(total, abs=1e-2)
        assert {f["frame"]: f["gpu_seconds"] for f in bill["frames"]} == pytest.approx(frames, abs=1e-2), key
        recompile_lines = [line for line in bill["lines"] if line["cause"] == "recompile"]
        assert sum(line["gpu_seconds"] for line in recompile_lines) == pytest.approx(sum(recompiles.values()), abs=1e-2)
        assert bill["causes"]["compile_straggler"] == 0 and bill["causes"]["failed_compile"] == 0
        assert bill["share"] is not None and 0 < bill["share"] < 1


def test_recompile_lines_name_what_changed_and_the_remedy(recordings):
    from dashboard.detection.cost import bill_of
    from dashboard.tenancy.models import Run

    h200 = bill_of(Run.objects.get(key="h200-ddp-nccl"))
    [line] = [x for x in h200["lines"] if x["cause"] == "recompile"]
    assert line["reason"] == "dimension 0 of args[0] changes" and line["ranks"] == [1]
    assert line["remedy"].startswith("torch._dynamo.mark_dynamic(args[0], 0)")
    assert line["gpu_seconds"] == pytest.approx(2 * 1.547599, abs=1e-3)  # rank 1 alone, step 3, 2 ranks wait
    v213 = bill_of(Run.objects.get(key="compare-213"))
    reasons = {(x["label"], x["reason"]) for x in v213["lines"] if x["cause"] == "recompile"}
    assert reasons == {
        ("compare_job.py:46 Net.forward", "dimension 0 of x changes"),
        ("compare_job.py:50 loss_fn", "dimension 0 of out changes"),
    }
    assert v213["top"]["cause"] == "first_compile" and v213["top"]["label"] == "compare_job.py:46 Net.forward"
    assert v213["top"]["ranks"] == [0, 1]


def test_the_same_job_on_torch_2_13_pays_the_recompile_more_than_on_2_11(recordings):
    """What the upgrade did: the step-6 recompiles of both frames on the slower rank (rank 0 in both) cost
    2 x (14.836 + 9.058) GPU-seconds on 2.13 against 2 x (2.056 + 0.882) on 2.11."""
    from dashboard.detection.cost import bill_of
    from dashboard.tenancy.models import Run

    per = {key: bill_of(Run.objects.get(key=key))["causes"]["recompile"] for key in ("compare-211", "compare-213")}
    _, _, r211 = hand_bill(recordings["compare-211"], 2)
    _, _, r213 = hand_bill(recordings["compare-213"], 2)
    assert per["compare-211"] == pytest.approx(sum(r211.values()), abs=1e-2)
    assert per["compare-213"] == pytest.approx(sum(r213.values()), abs=1e-2)
    assert per["compare-213"] > 5 * per["compare-211"]
