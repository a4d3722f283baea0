from hypothesis import given
from hypothesis import strategies as st

from dashboard.detection.consensus import consensus, consensus_of_groups


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


@given(st.dictionaries(st.integers(0, 300), st.sampled_from("abcd"), min_size=1), st.randoms(use_true_random=False))
def test_counted_as_stored_groups_it_is_the_same_verdict_as_rank_by_rank(values, rnd):
    """Ranks stored as agreement (a value and its ranks, a group per request, several groups per
    value) give the verdict their ranks give one by one."""
    ranks = list(values)
    rnd.shuffle(ranks)
    groups: list[tuple[list[int], str]] = []
    for rank in ranks:  # requests of up to 3 agreeing ranks, in arrival order
        if groups and groups[-1][1] == values[rank] and len(groups[-1][0]) < 3:
            groups[-1][0].append(rank)
        else:
            groups.append(([rank], values[rank]))
    assert consensus_of_groups(groups) == consensus(values)
