from tests.rules import compile_view, findings_of


def times(*values, info=None):
    return compile_view({r: {"compile_time": t} for r, t in enumerate(values)}, index=0, rank_info=info)


def test_three_times_the_median():
    [f] = findings_of(times(2.0, 2.1, 7.0), "compile_straggler")
    assert f.ranks == (2,) and f.severity == "warning"
    assert f.details["median_s"] == 2.1


def test_ten_seconds_of_skew_even_below_3x():
    [f] = findings_of(times(20.0, 20.0, 31.0), "compile_straggler")
    assert f.ranks == (2,)


def test_critical_at_half_the_collective_timeout():
    info = {r: {"collective_timeout_s": 60.0} for r in range(3)}
    [f] = findings_of(times(5.0, 5.0, 40.0, info=info), "compile_straggler")
    assert f.severity == "critical"


def test_small_absolute_skews_are_noise():
    assert findings_of(times(0.1, 0.1, 0.5), "compile_straggler") == []
    assert findings_of(times(10.0, 11.0, 12.0), "compile_straggler") == []
