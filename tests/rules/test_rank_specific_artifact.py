from tests.rules import compile_view, findings_of

SHARED = {r: {"cache_dirs": {"inductor": "/shared/cache"}} for r in range(2)}
PRIVATE = {r: {"cache_dirs": {"inductor": f"/tmp/rank{r}"}} for r in range(2)}


def test_same_graph_other_code_with_a_shared_cache():
    view = compile_view({0: {"code_norm": "1" * 16}, 1: {"code_norm": "2" * 16}}, index=0, rank_info=SHARED)
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.ranks == (1,) and f.details["artifact"] == "Inductor code"
    assert f.details["shared_cache_dirs"] == ["/shared/cache"]


def test_code_from_a_cache_hit_is_not_compared_with_fresh_code():
    info = {r: {"cache_dirs": {"inductor": "/shared/cache"}} for r in range(3)}
    view = compile_view({0: {"code_norm": "1" * 16, "cache": {"inductor": "miss"}},
                         1: {"code_norm": "2" * 16, "cache": {"inductor": "hit"}},
                         2: {"code_norm": "2" * 16, "cache": {"inductor": "hit"}}}, index=0, rank_info=info)
    assert findings_of(view, "rank_specific_artifact") == []


def test_cache_keys_differ():
    keys = lambda k: {"counts": {"graph_op_count": 3}, "cache_keys": {"inductor": k}}  # noqa: E731
    view = compile_view({0: {"detail": keys("fx1")}, 1: {"detail": keys("fx2")}}, index=0, rank_info=SHARED)
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.details["artifact"] == "cache keys"


def test_private_cache_dirs_are_fine():
    view = compile_view({0: {"code_norm": "1" * 16}, 1: {"code_norm": "2" * 16}}, index=0, rank_info=PRIVATE)
    assert findings_of(view, "rank_specific_artifact") == []


def test_different_graphs_are_graph_divergence_not_this():
    view = compile_view({0: {"graph_norm": "1" * 16, "code_norm": "1" * 16}, 1: {"graph_norm": "2" * 16}},
                        index=0, rank_info=SHARED)
    assert findings_of(view, "rank_specific_artifact") == []
