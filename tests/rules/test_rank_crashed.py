"""rank_crashed: one alert per rank that ended badly, naming the exception and the compile just before."""

from dashboard.detection import subjects
from dashboard.detection.rules import clean_subjects, evaluate
from tests.rules import findings_of, run_view

KEY = "fxk4gqcsmvwzj3uxt2l5z3c6b5nqzvq3z3jx3a7y2kq5t3gqkq4a"


def crash(
    status="error",
    exit_code=1,
    reason="RuntimeError: CUDA error: an illegal memory access",
    exc_type="RuntimeError",
    where="model/net.py:88 forward",
    ended_at=1000.0,
    last_step=2,
    compiled: dict | None = None,
) -> dict:
    return {
        "status": status,
        "exit_code": exit_code,
        "reason": reason,
        "exc_type": exc_type,
        "where": where,
        "ended_at": ended_at,
        "last_step": last_step,
        "last_compile": compiled,
    }


def compiled(outcome="hit", seconds_before_end=0.4, status="ok", step=3) -> dict:
    return {
        "frame": "model/net.py:40:forward",
        "index": 0,
        "step": step,
        "status": status,
        "cache": {"aotautograd": outcome, "inductor": outcome},
        "cache_keys": {"inductor": KEY},
        "seconds_before_end": seconds_before_end,
    }


def ended(crashes: dict, live: dict | None = None, **kw):
    """A run view where `crashes` ended badly, the rest of `live` (rank -> age) still reports."""
    ages = {**{r: 1.0 for r in crashes}, **(live or {})}
    return run_view(ages, ended=set(crashes), crashes=crashes, **kw)


def test_crash_right_after_loading_a_cached_artifact():
    [f] = findings_of(ended({1: crash(compiled=compiled("hit"))}, live={0: 1.0}), "rank_crashed")
    assert (f.severity, f.ranks, f.subject, f.step, f.frame) == (
        "critical",
        (1,),
        subjects.error(3, "RuntimeError", "RuntimeError: CUDA error: an illegal memory access"),
        3,
        "model/net.py:40:forward",
    )
    assert f.message == (
        "Rank 1 crashed: RuntimeError: CUDA error: an illegal memory access at model/net.py:88 forward "
        "(step 3), right after loading cached Inductor artifact fxk4gqcsmvwz… of frame model/net.py:40:forward"
    )
    assert f.details["exc_type"] == "RuntimeError" and f.details["last_compile"]["key"] == KEY
    assert "rank_specific_artifact" in f.details["hint"]


def test_crash_right_after_compiling_or_while_compiling():
    [after] = findings_of(ended({1: crash(compiled=compiled("miss"))}), "rank_crashed")
    assert "right after compiling frame model/net.py:40:forward (cache miss, key fxk4gqcsmvwz…)" in after.message
    assert "aot_eager" in after.details["hint"]
    [during] = findings_of(ended({1: crash(compiled=compiled("miss", status="failed"))}), "rank_crashed")
    assert "while compiling frame model/net.py:40:forward (compile #0, failed)" in during.message


def test_a_compile_of_an_earlier_step_is_not_blamed():
    [f] = findings_of(ended({1: crash(compiled=compiled("hit", step=0))}), "rank_crashed")
    assert f.message.endswith("at model/net.py:88 forward (step 3)") and f.frame is None and f.step == 3
    assert f.details["last_compile"]["step"] == 0  # still in the details
    assert "No compile just before it" in f.details["hint"]


def test_a_compile_outside_the_steps_counts_when_it_was_just_before():
    def outside(seconds: float) -> list:
        at = compiled("miss", seconds_before_end=seconds, step=None)
        return findings_of(ended({1: crash(last_step=None, compiled=at)}), "rank_crashed")

    [recent] = outside(0.5)
    assert recent.step is None and "right after compiling frame" in recent.message
    [old] = outside(600)
    assert old.frame is None and "compiling" not in old.message


SIGTERM = dict(status="signal", exit_code=143, reason="SIGTERM", exc_type=None, where=None)
GLOO_LOST = dict(
    reason="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
    "peer [127.0.0.1]:28047",
    exc_type="RuntimeError",
    where="train.py:40 step",
)


def by_severity(found: list) -> dict[str, list]:
    return {sev: [f.ranks for f in found if f.severity == sev] for sev in ("critical", "warning")}


def test_ranks_that_crashed_on_their_own_are_roots_and_the_ranks_torchrun_stopped_their_consequences():
    crashes = {
        1: crash(),
        2: crash(reason="ValueError: bad batch", where="data.py:12 load"),
        0: crash(**SIGTERM, ended_at=1001.0),
        3: crash(**SIGTERM, ended_at=1001.5),
    }
    found = findings_of(ended(crashes), "rank_crashed")
    assert by_severity(found) == {"critical": [(1,), (2,)], "warning": [(0,), (3,)]}
    assert found[1].details["stopped_after"] == [0, 3] and "ranks 0, 3 then lost it or were stopped" in found[1].message
    assert [f.details["consequence_of"] for f in found if f.severity == "warning"] == [1, 1]
    assert "consequence_of" not in found[0].details


def test_a_job_stopped_from_outside_waits_for_its_root_then_pages_once():
    crashes = {
        0: crash(**SIGTERM, ended_at=1000.2),
        1: crash(**SIGTERM, ended_at=1000.1),
        2: crash(**SIGTERM, ended_at=1000.3),
    }
    assert findings_of(ended(crashes, now=1010.0), "rank_crashed") == []  # inside the grace window: who did it?
    found = findings_of(ended(crashes, now=1020.2), "rank_crashed")
    assert by_severity(found) == {"critical": [(1,)], "warning": [(0,), (2,)]}
    assert (
        found[0].message
        == "Rank 1 was stopped by SIGTERM, exit code 143 (step 3); ranks 0, 2 then lost it or were stopped"
    )
    assert "launcher" in found[0].details["hint"]


def test_peers_that_lost_a_rank_killed_outright_wait_for_it_and_name_it():
    lost = {0: crash(**GLOO_LOST, ended_at=1000.0), 1: crash(**GLOO_LOST, ended_at=1000.4)}
    early = ended(lost, live={2: 6.0}, now=1005.0)  # rank 2's last heartbeat was 6 s ago: not known dead yet
    assert findings_of(early, "rank_crashed") == [] and findings_of(early, "rank_silent") == []
    later = ended(lost, live={2: 12.5}, now=1011.5)
    [silent] = findings_of(later, "rank_silent")
    assert silent.ranks == (2,) and silent.details["lost"] and "never ended" in silent.message
    found = findings_of(later, "rank_crashed")
    assert by_severity(found) == {"critical": [], "warning": [(0,), (1,)]}
    assert {f.details["consequence_of"] for f in found} == {2}
    assert "it lost its connection to rank 2" in found[0].message


def test_a_lost_peer_error_names_its_root_whatever_the_backend_says():
    for reason in (
        "NCCL error: remote process exited or there was a network error",
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)",
        "RuntimeError: NCCL communicator was aborted on rank 0",
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer",
    ):
        found = findings_of(ended({0: crash(reason=reason), 1: crash(ended_at=999.0)}), "rank_crashed")
        assert by_severity(found) == {"critical": [(1,)], "warning": [(0,)]}, reason


def test_ranks_stopped_after_a_rank_was_killed_outright_are_its_consequences():
    view = ended({0: crash(**SIGTERM), 1: crash(**SIGTERM)}, live={2: 90.0}, silent_after=20)
    found = findings_of(view, "rank_crashed")
    assert by_severity(found) == {"critical": [], "warning": [(0,), (1,)]}
    assert [f.ranks for f in findings_of(view, "rank_silent")] == [(2,)]


def test_a_non_zero_exit_without_an_exception():
    [f] = findings_of(
        ended({0: crash(status="ok", exit_code=3, reason=None, exc_type=None, where=None)}), "rank_crashed"
    )
    assert f.message == "Rank 0 exited with code 3 (step 3)"


def test_an_abort_without_a_reason():
    [f] = findings_of(
        ended({0: crash(status="abort", exit_code=None, reason=None, where=None, last_step=None)}), "rank_crashed"
    )
    assert f.message == "Rank 0 ended with status abort"


def test_a_long_reason_is_cut_in_the_message_only():
    [f] = findings_of(ended({0: crash(reason="RuntimeError: " + "x" * 1000)}), "rank_crashed")
    assert len(f.message) < 400 and len(f.details["reason"]) == 1014


def test_crashed_ranks_are_not_silent_and_only_crashed_ranks_are_checked():
    view = ended({1: crash()}, live={0: 1.0})
    assert findings_of(view, "rank_silent") == []
    clean = clean_subjects(view, evaluate(view))
    [f] = findings_of(view, "rank_crashed")
    assert ("rank_crashed", f.subject) not in clean and ("rank_crashed", "rank:0") not in clean
    assert findings_of(run_view({0: 1.0, 1: 2.0}), "rank_crashed") == []


DDP_UNUSED = (
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
    "Parameter indices which did not receive grad for rank {rank}: 3"
)


def test_ranks_that_raise_the_same_error_in_the_same_step_are_one_finding_naming_them_all():
    alike = DDP_UNUSED.format(rank="N")
    crashes = {
        r: crash(reason=DDP_UNUSED.format(rank=r), where="train.py:30 step", ended_at=1000.0 + r / 10) for r in (1, 0)
    }
    [f] = findings_of(ended(crashes), "rank_crashed")
    assert (f.severity, f.ranks, f.subject, f.step) == ("critical", (0, 1), subjects.error(3, "RuntimeError", alike), 3)
    assert f.message.startswith("Ranks 0, 1 raised the same error: RuntimeError: Expected to have finished reduction")
    assert f.details["alike"] == [0, 1]


def test_ranks_that_failed_alike_stay_one_alert_whichever_report_comes_first():
    """An upload sends a spool rank by rank: rank 2's crash is known first, then 1's, then 0's (which
    ended first by the clocks). The alert's subject is the error's, so the one alert grows."""
    crashes = {r: crash(reason=DDP_UNUSED.format(rank=r), ended_at=1000.0 + r / 10) for r in (0, 1, 2)}
    seen = []
    for known in ((2,), (2, 1), (2, 1, 0)):
        [f] = findings_of(ended({r: crashes[r] for r in known}), "rank_crashed")
        seen.append((f.subject, f.ranks))
    assert len({subject for subject, _ in seen}) == 1
    assert [ranks for _, ranks in seen] == [(2,), (1, 2), (0, 1, 2)]


def test_the_same_error_in_another_step_or_another_error_is_another_finding():
    crashes = {0: crash(), 1: crash(last_step=5), 2: crash(reason="ValueError: bad batch")}
    assert sorted(f.ranks for f in findings_of(ended(crashes), "rank_crashed")) == [(0,), (1,), (2,)]


def test_every_rank_exiting_alike_by_itself_is_one_alert_with_what_it_printed():
    """A mistyped argument: argparse exits 2 on every rank; the zero-code agent carries its last words."""
    said = "SystemExit(2): usage: train.py [-h] [--lr LR]\ntrain.py: error: unrecognized arguments: --lrr 3"
    crashes = {
        r: crash(exit_code=2, reason=said, exc_type=None, where=None, ended_at=1000.0 + r, last_step=None)
        for r in range(3)
    }
    [f] = findings_of(ended(crashes), "rank_crashed")
    assert f.ranks == (0, 1, 2) and f.severity == "critical"
    assert f.message.startswith("Ranks 0-2 raised the same error: SystemExit(2): usage")
    assert "unrecognized arguments: --lrr 3" in f.message
    assert "exited by itself with code 2" in f.details["hint"] and "named frame" not in f.details["hint"]


def test_every_rank_exiting_with_the_same_code_and_no_message_is_one_alert():
    crashes = {r: crash(exit_code=3, reason=None, exc_type=None, where=None, last_step=4) for r in range(3)}
    [f] = findings_of(ended(crashes), "rank_crashed")
    assert f.ranks == (0, 1, 2) and f.message.startswith("Ranks 0-2 exited alike, with code 3 (step 5)")
