from tests.rules import compile_view, findings_of


def sched(h):
    return {"detail": {"hashes": {"collectives": {"raw": h, "norm": h}}}}


def test_one_rank_issues_another_collective_sequence():
    view = compile_view({0: sched("a" * 16), 1: sched("b" * 16), 2: sched("a" * 16)}, index=0)
    [f] = findings_of(view, "collective_schedule_divergence")
    assert f.ranks == (1,) and f.severity == "critical"


def test_no_collectives_or_equal_ones_are_fine():
    assert findings_of(compile_view({0: {}, 1: {}}, index=0), "collective_schedule_divergence") == []
    assert (
        findings_of(compile_view({0: sched("a" * 16), 1: sched("a" * 16)}, index=0), "collective_schedule_divergence")
        == []
    )


def test_two_ranks_with_other_collective_sequences_disagree():
    view = compile_view({0: sched("a" * 16), 1: sched("b" * 16)}, index=0)
    [f] = findings_of(view, "collective_schedule_divergence")
    assert f.ranks == (0, 1) and f.message.startswith("Ranks 0 and 1 disagree on the collective sequence for")
