"""hang_forecast on progress samples as the sweep sees them (rank -> RankProgress carried to now)."""

from dashboard.detection.rules import RankProgress, clean_subjects, evaluate
from tests.rules import findings_of, run_view

FRAME = "model.py:88:forward"
GUARD = "tensor 'x' size mismatch at index 0. expected 16, actual 17"


def wait(s: float, step: int = 5, op: str = "all_reduce", phase: str = "collective") -> RankProgress:
    return RankProgress(phase=phase, phase_s=s, step=step, since_step_s=s + 0.4, where="job.py:40:train", op=op)


def compiling(s: float, step: int = 5, reason: str = GUARD) -> RankProgress:
    return RankProgress(
        phase="compiling", phase_s=s, step=step, since_step_s=s + 0.2, where="job.py:35:train", op=FRAME, reason=reason
    )


def view(progress: dict, timeout: float | None = 600.0, **kw):
    return run_view({r: 1.0 for r in progress}, progress=progress, timeout=timeout, **kw)


def test_warns_when_others_wait_past_the_threshold_naming_the_late_rank_and_time_left():
    [f] = findings_of(view({0: wait(212), 1: compiling(213), 2: wait(200)}), "hang_forecast")
    assert f.severity == "warning" and f.ranks == (1,) and f.step == 5 and f.frame == FRAME
    assert f.subject == "hang"
    assert f.message.startswith(
        "Ranks 0, 2 waited 212 s in all_reduce of step 5 for rank 1: rank 1 is compiling "
        f"{FRAME} for 213 s (recompile because of {GUARD})"
    )
    assert f.message.endswith("388 s left before the 600 s collective timeout kills the job")
    assert f.details["waiting"] == [0, 2] and f.details["left_s"] == 388.0
    assert f.details["late"]["1"]["phase"] == "compiling" and f.details["late"]["1"]["reason"] == GUARD


def test_critical_at_half_the_collective_timeout():
    [f] = findings_of(view({0: wait(301), 1: compiling(302, reason="first compile"), 2: wait(300)}), "hang_forecast")
    assert f.severity == "critical" and "(first compile)" in f.message and "299 s left" in f.message


def test_below_the_threshold_nothing_and_the_subject_is_clean():
    v = view({0: wait(9), 1: compiling(9.5), 2: wait(8)})
    assert findings_of(v, "hang_forecast") == []
    assert ("hang_forecast", "hang") in clean_subjects(v, evaluate(v))


def test_a_short_timeout_fires_before_half_of_it_even_under_the_threshold():
    [f] = findings_of(view({0: wait(6), 1: compiling(7)}, timeout=12), "hang_forecast")
    assert f.severity == "critical"  # half of 12 s comes before the 10 s warning threshold
    assert (
        findings_of(view({0: wait(3), 1: compiling(4)}, timeout=12, warn_after=2), "hang_forecast")[0].severity
        == "warning"
    )


def test_a_data_loader_stall_and_python_are_named():
    data = RankProgress(
        phase="data", phase_s=40, step=7, since_step_s=40, where="data.py:12:__getitem__", op="__next__"
    )
    [f] = findings_of(
        view({0: wait(30, step=7), 1: data, 2: RankProgress("step", 31, 7, 31, "job.py:50:save")}), "hang_forecast"
    )
    assert f.ranks == (1, 2) and f.frame is None
    assert "rank 1 is waiting in the data loader at data.py:12:__getitem__ for 40 s" in f.message
    assert "rank 2 is running Python at job.py:50:save for 31 s" in f.message


def test_ddp_backward_counts_as_waiting():
    [f] = findings_of(
        view({0: wait(20, phase="backward", op="_engine_run_backward"), 1: compiling(21)}), "hang_forecast"
    )
    assert f.ranks == (1,) and "in backward (DDP's all-reduce)" in f.message


def test_everyone_in_the_collective_or_ahead_is_no_forecast():
    assert findings_of(view({0: wait(30), 1: wait(30), 2: wait(29)}), "hang_forecast") == []
    ahead = RankProgress("step", 30, 6, 0.5, "job.py:40:train")  # passed step 5 already: not late
    assert findings_of(view({0: wait(30), 1: ahead}), "hang_forecast") == []


def test_silent_or_ended_ranks_are_left_to_rank_silent_and_rank_crashed():
    progress = {0: wait(30), 1: compiling(31), 2: wait(30)}
    silent = run_view({0: 1.0, 1: 70.0, 2: 1.0}, progress=progress, timeout=600)
    assert findings_of(silent, "hang_forecast") == []
    ended = run_view({0: 1.0, 1: 1.0, 2: 1.0}, ended={1}, progress=progress, timeout=600)
    assert findings_of(ended, "hang_forecast") == []


def test_unknown_timeout_still_warns():
    [f] = findings_of(view({0: wait(12), 1: compiling(13)}, timeout=None), "hang_forecast")
    assert f.severity == "warning" and f.message.endswith("the collective timeout is unknown")
    assert f.details["left_s"] is None
