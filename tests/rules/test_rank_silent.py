from dashboard.detection.rules import clean_subjects, evaluate
from tests.rules import findings_of, run_view


def test_rank_that_stopped_while_others_report():
    [f] = findings_of(run_view({0: 1.0, 1: 95.0, 2: 2.0}), "rank_silent")
    assert f.ranks == (1,) and f.subject == "rank:1"


def test_everyone_quiet_is_not_one_rank_silent():
    assert findings_of(run_view({0: 90.0, 1: 95.0}), "rank_silent") == []


def test_rank_that_never_ended_while_all_others_did():
    """Killed outright: torchrun stopped the others (they ended) and this rank said nothing more."""
    [f] = findings_of(run_view({0: 30.0, 1: 40.0, 2: 31.0}, ended={0, 2}, silent_after=20), "rank_silent")
    assert f.ranks == (1,) and "never ended" in f.message
    just_finishing = run_view({0: 30.0, 1: 3.0, 2: 31.0}, ended={0, 2}, silent_after=20)
    assert findings_of(just_finishing, "rank_silent") == []
    assert findings_of(run_view({0: 40.0}, silent_after=20), "rank_silent") == []  # nobody to compare with


def test_ended_ranks_are_not_silent():
    assert findings_of(run_view({0: 1.0, 1: 95.0}, ended={1}), "rank_silent") == []


def test_reporting_ranks_are_clean_subjects():
    view = run_view({0: 1.0, 1: 95.0})
    clean = clean_subjects(view, evaluate(view))
    assert ("rank_silent", "rank:0") in clean and ("rank_silent", "rank:1") not in clean
