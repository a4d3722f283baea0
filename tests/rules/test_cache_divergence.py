from dashboard.detection.rules import cache_outcome
from tests.rules import compile_view, findings_of


def test_cold_cache_on_one_rank():
    view = compile_view(
        {0: {"cache": {"inductor": "hit"}}, 1: {"cache": {"inductor": "miss"}}, 2: {"cache": {"inductor": "hit,hit"}}},
        index=0,
    )
    [f] = findings_of(view, "cache_divergence")
    assert (f.ranks, f.frame, f.severity) == ((1,), "train.py:10:forward", "info")  # a race, never a page
    assert f.details == {
        "index": 0,
        "compile_index": 0,
        "stage": "inductor",
        "hit": [0, 2],
        "miss": [1],
        "stages": {"inductor": {"hit": [0, 2], "miss": [1]}},
    }
    assert f.message == "Rank 1 missed the FX graph cache for train.py:10:forward (compile #0) while ranks 0, 2 hit it"


def test_both_caches_in_one_finding():
    view = compile_view(
        {
            0: {"cache": {"inductor": "hit,hit", "aotautograd": "hit"}},
            1: {"cache": {"inductor": "miss", "aotautograd": "miss"}},
        },
        index=0,
    )
    [f] = findings_of(view, "cache_divergence")
    assert f.ranks == (1,) and set(f.details["stages"]) == {"inductor", "aotautograd"}
    assert "missed the FX graph and AOTAutograd caches" in f.message and "while rank 0 hit them" in f.message


def test_bypass_is_a_pattern_of_its_own_and_agreement_is_quiet():
    view = compile_view(
        {0: {"cache": {"inductor": "bypass"}}, 1: {"cache": {"inductor": "miss"}}, 2: {"cache": {"inductor": "miss"}}},
        index=0,
    )
    [f] = findings_of(view, "cache_divergence")
    assert f.ranks == (0,) and f.details["stages"] == {"inductor": {"miss": [1, 2], "bypass": [0]}}
    assert f.message.startswith("Rank 0 bypassed the FX graph cache") and "while ranks 1, 2 missed it" in f.message
    hit_or_bypass = compile_view({0: {"cache": {"inductor": "hit"}}, 1: {"cache": {"inductor": "bypass"}}}, index=0)
    assert findings_of(hit_or_bypass, "cache_divergence")[0].ranks == (1,)
    assert (
        findings_of(
            compile_view({0: {"cache": {"inductor": "miss"}}, 1: {"cache": {"inductor": "miss"}}}), "cache_divergence"
        )
        == []
    )


def test_the_lookups_of_a_lone_recompile_are_caused_by_it():
    view = compile_view(
        {
            1: {
                "cache": {"inductor": "miss,miss", "aotautograd": "miss"},
                "step": 2,
                "recompile_reason": "size mismatch at index 0",
            }
        },
        index=1,
        accountable={0, 1, 2},
    )
    [f] = findings_of(view, "cache_divergence")
    assert (f.ranks, f.frame, f.step, f.severity) == ((1,), "train.py:10:forward", 2, "info")
    assert (f.details["compile_index"], f.details["cause"], f.details["not_compiled"]) == (
        1,
        "recompile_divergence",
        [0, 2],
    )
    [recompile] = findings_of(view, "recompile_divergence")
    assert (recompile.ranks, recompile.frame) == (f.ranks, f.frame)
    assert "in a recompile ranks 0, 2 did not make (compile #1)" in f.message


def test_a_recompile_every_rank_made_has_no_cause_unless_its_reason_is_the_odd_ranks():
    same = {
        r: {"cache": {"inductor": "miss" if r == 1 else "hit"}, "recompile_reason": "size mismatch"} for r in range(3)
    }
    [f] = findings_of(compile_view(same, index=1), "cache_divergence")
    assert f.ranks == (1,) and "cause" not in f.details
    odd = {r: {**same[r], "recompile_reason": "stride mismatch" if r == 1 else "size mismatch"} for r in range(3)}
    [f] = findings_of(compile_view(odd, index=1), "cache_divergence")
    assert f.details["cause"] == "recompile_divergence"


def test_a_lone_compile_without_lookups_is_quiet():
    view = compile_view({1: {"cache": {}}}, index=1, accountable={0, 1, 2})
    assert findings_of(view, "cache_divergence") == []


def test_outcome_of_several_lookups():
    assert cache_outcome({"inductor": "hit,miss"}, "inductor") == "miss"
    assert cache_outcome({"inductor": "hit,hit"}, "inductor") == "hit"
    assert cache_outcome({}, "inductor") is None


def test_ranks_running_other_compiler_settings_are_named():
    reports = {0: {"cache": {"inductor": "hit"}}, 1: {"cache": {"inductor": "miss"}}, 2: {"cache": {"inductor": "hit"}}}
    info = {
        0: {"settings": {"inductor.fx_graph_cache": "True"}},
        1: {"settings": {"inductor.fx_graph_cache": "True", "inductor.triton.cudagraphs": "False"}},
        2: {"settings": {"inductor.fx_graph_cache": "True"}},
    }
    [f] = findings_of(compile_view(reports, index=0, rank_info=info), "cache_divergence")
    assert f.message.endswith("(rank 1 runs with `inductor.triton.cudagraphs=False`)")
    assert f.details["settings"] == {"inductor.triton.cudagraphs": {"0": "default", "1": "False", "2": "default"}}
    same = {r: {"settings": {"inductor.fx_graph_cache": "True"}} for r in range(3)}
    [quiet] = findings_of(compile_view(reports, index=0, rank_info=same), "cache_divergence")
    assert "runs with" not in quiet.message and "settings" not in quiet.details


def test_a_compiler_variable_torch_read_at_import_is_named_and_where_caches_go_is_not():
    """TORCHINDUCTOR_SIZE_ASSERTS=0 becomes the setting's default when torch imports its config, so the
    agent's non-default settings cannot show it: the rank's environment does. Cache and dump places
    differ per rank on purpose, and the launcher's and other tools' variables are not the compiler's."""
    reports = {0: {"cache": {"inductor": "hit"}}, 1: {"cache": {"inductor": "miss"}}, 2: {"cache": {"inductor": "hit"}}}
    env = {
        r: {"TORCHINDUCTOR_CACHE_DIR": f"/cache/{r}", "TORCHELASTIC_MAX_RESTARTS": str(r), "NCCL_DEBUG": str(r)}
        for r in range(3)
    }
    env[1]["TORCHINDUCTOR_SIZE_ASSERTS"] = "0"
    info = {r: {"settings": {}, "env": env[r]} for r in range(3)}
    [f] = findings_of(compile_view(reports, index=0, rank_info=info), "cache_divergence")
    assert f.message.endswith("(rank 1 runs with `env.TORCHINDUCTOR_SIZE_ASSERTS=0`)"), f.message
    assert f.details["settings"] == {"env.TORCHINDUCTOR_SIZE_ASSERTS": {"0": "unset", "1": "0", "2": "unset"}}
