from dashboard.detection.consensus import consensus


def test_strict_majority_wins():
    verdict = consensus({0: "a", 1: "b", 2: "a"})
    assert (verdict.reference, verdict.dissenters, verdict.tie) == ("a", (1,), False)


def test_two_ranks_disagreeing_use_the_lowest_rank_as_reference():
    verdict = consensus({3: "x", 1: "y"})
    assert (verdict.reference, verdict.dissenters, verdict.tie) == ("y", (3,), True)


def test_even_split_is_a_tie():
    verdict = consensus({0: "a", 1: "a", 2: "b", 3: "b"})
    assert (verdict.reference, verdict.dissenters, verdict.tie) == ("a", (2, 3), True)


def test_agreement_has_no_dissenters_and_no_tie():
    verdict = consensus({0: 7, 1: 7})
    assert (verdict.dissenters, verdict.tie) == ((), False)
