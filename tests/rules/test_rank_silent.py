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


def test_killed_rank_named_when_a_stopped_peer_died_before_its_goodbye():
    """Rank 2 killed, rank 1 ended (stopped by torchrun), rank 0 stopped too but its rank_end never came:
    the lost rank is the one silent since before anybody ended; rank 0 talked until after that."""
    view = run_view({0: 22.0, 1: 23.0, 2: 25.0}, ended={1}, silent_after=20)
    [f] = findings_of(view, "rank_silent")
    assert f.ranks == (2,) and "never ended" in f.message and f.details["lost"]
    still_going = run_view({0: 2.0, 1: 13.0, 2: 15.0}, ended={1}, silent_after=20)
    assert findings_of(still_going, "rank_silent") == []  # rank 0 still reports: not over yet


def test_ended_ranks_are_not_silent():
    assert findings_of(run_view({0: 1.0, 1: 95.0}, ended={1}), "rank_silent") == []


def test_a_silent_rank_that_reports_again_is_a_clean_subject():
    view = run_view({0: 1.0, 1: 95.0, 2: 0.5}, alerted=frozenset({0}))
    clean = clean_subjects(view, evaluate(view))
    assert ("rank_silent", "rank:0") in clean and ("rank_silent", "rank:1") not in clean
    assert ("rank_silent", "rank:2") not in clean  # fresh, never alerted: not named at all (100,000 of them)


def test_silence_counts_from_the_last_time_ingest_turned_batches_away():
    """A server shedding load refuses some racks' batches: their ranks look silent without being so."""
    assert findings_of(run_view({0: 1.0, 1: 95.0, 2: 2.0}, since_shed=30.0), "rank_silent") == []
    [f] = findings_of(run_view({0: 1.0, 1: 95.0, 2: 2.0}, since_shed=61.0), "rank_silent")
    assert f.ranks == (1,) and "95 s" in f.message  # once shedding is that long past, the whole silence counts
    killed = {0: 30.0, 1: 40.0, 2: 31.0}  # killed outright: its peers ended and it never did, shed or not
    [f] = findings_of(run_view(killed, ended={0, 2}, silent_after=20, since_shed=5.0), "rank_silent")
    assert f.ranks == (1,) and f.details["lost"]
