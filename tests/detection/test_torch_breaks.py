"""Graph breaks a user cannot fix (issue 52, item 6): under torch.compile(DDP(model)) Dynamo breaks
inside DDP's own code (`_pre_forward` calling `Logger.set_runtime_stats_and_log`, the context
managers that call the skipped `_inside_ddp_forward`), keyed by the user's line that entered it.
The bill offers no graph-break fix there, but what the user can do: DDP(torch.compile(model)).
Checked on the H200 recording of torch.compile(DDP(model)) (torch 2.11, demo/realism_job.py)."""

from __future__ import annotations

import pytest

from dashboard.detection.remedies import inside_torch, remedy
from tests.detection.test_compiled_work import _ingest

TRAIN_STEP = "realism_job.py:129:train_step"
LOGGER = (
    "Graph break in user code at /opt/torch/.venv/lib/python3.12/site-packages/torch/nn/parallel/distributed.py:1566\n"
    "Graph Break Reason: Encountered graph break when attempting to trace CALL_FUNCTION_EX\n\n"
    "Unsupported method call\n  Explanation: Dynamo does not know how to trace method `set_runtime_stats_and_log`"
    " of class `Logger`\n"
)
SKIPPED = (
    "Graph break in user code at /usr/lib/python3.12/contextlib.py:105\nGraph Break Reason: Encountered graph break"
    "\n\nAttempted to call function marked as skipped\n  Explanation: Dynamo developers have intentionally marked"
    " that the function `DistributedDataParallel._inside_ddp_forward` in file "
    "`/opt/torch/.venv/lib/python3.12/site-packages/torch/_compile.py` should not be traced.\n"
)
MINE = "Graph break in user code at /home/me/train.py:40\nGraph Break Reason: Data-dependent branching\n"


def test_a_break_at_torchs_line_or_in_a_context_manager_calling_torch_is_torchs_own():
    assert inside_torch(TRAIN_STEP, LOGGER)
    assert inside_torch(f"{TRAIN_STEP} via contextlib.helper", SKIPPED)
    assert inside_torch("torch/nn/parallel/distributed.py:1600:DistributedDataParallel._inside_ddp_forward")
    assert inside_torch(f"{TRAIN_STEP} via torch.nn.parallel.distributed.DistributedDataParallel.forward")
    assert inside_torch("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py:1:_call_impl")
    assert not inside_torch(TRAIN_STEP, MINE)
    assert not inside_torch(f"{TRAIN_STEP} via contextlib.helper", MINE.replace("/home/me/train.py", "contextlib.py"))
    inside = remedy("first_compile", "1 graph break inside torch's own code", TRAIN_STEP)
    assert "DDP(torch.compile(model))" in inside and "explain" not in inside


@pytest.mark.django_db
def test_the_bill_of_compiled_ddp_offers_what_the_user_can_do_not_a_break_fix_in_torch(post, tmp_path):
    from dashboard.detection import cost

    run = _ingest(post, tmp_path, "realism_clean.tgz", "realism-compile-ddp-cold-shared")
    bill = cost._bill_of(run, None)
    broken = [x for f in bill["frames"] for x in f["lines"] if "graph break" in x["reason"]]
    assert {x["frame"] for x in broken} == {
        TRAIN_STEP,
        f"{TRAIN_STEP} via contextlib.helper",
        f"{TRAIN_STEP} via contextlib.__init__",
    }
    for line in broken:
        assert line["reason"] == "1 graph break inside torch's own code", line
        assert "DDP(torch.compile(model))" in line["remedy"] and "explain" not in line["remedy"], line
