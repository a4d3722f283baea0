"""rank_specific_artifact fires only where a rank runs code made for another target: ranks that traced
the same graph, really share a cache directory and one FX key, and run one artifact their targets
(codegen facts, rank-specific text of graph and code) say must differ."""

from dashboard.detection.rules.rank_specific_artifact import cache_location
from tests.rules import compile_view, findings_of

KEY = "fx5tq2ajmnbduolvb7wzzr4fmnt2kb3tyz2bbrxz6nsytyypqaba"
NFS = {"path": "/mnt/shared/inductor", "fs": "nfs4", "fsid": "0", "shared": True}


def local_rank(host: str, path: str = "/tmp/torchinductor_root", **facts) -> dict:
    """rank_start facts of a current agent whose cache dir is on a local filesystem."""
    return {
        "host": host,
        "device": facts.pop("device", "cpu"),
        "cache_dirs": {"inductor": path},
        "cache_fs": {"inductor": {"path": path, "fs": "ext4", "fsid": f"{host}-fsid", "shared": False}},
        "codegen": {"cpu_capability": facts.pop("isa", "AVX512")},
    }


def nfs_rank(host: str, isa: str) -> dict:
    return {
        "host": host,
        "device": "cpu",
        "cache_dirs": {"inductor": "/shared/inductor"},
        "cache_fs": {"inductor": NFS},
        "codegen": {"cpu_capability": isa},
    }


def compiled(outcome: str, code_raw: str, code_norm: str | None = None, key: str = KEY) -> dict:
    return {
        "cache": {"inductor": outcome, "aotautograd": outcome},
        "code_raw": code_raw,
        "code_norm": code_norm or code_raw,
        "detail": {"cache_keys": {"inductor": key, "aotautograd": "a" + key}},
    }


def on_device(fields: dict, rank: int) -> dict:
    """A compile whose raw Dynamo graph names the rank's device (cuda:0 / cuda:1), normalized alike."""
    return {**fields, "graph_raw": f"{rank}" * 32}


def test_same_key_different_code_written_by_ranks_sharing_one_dir_is_a_warning():
    info = {0: local_rank("node1", device="cuda:0"), 1: local_rank("node1", device="cuda:1")}
    view = compile_view(
        {0: on_device(compiled("miss", "raw0", "norm"), 0), 1: on_device(compiled("miss", "raw1", "norm"), 1)},
        index=0,
        rank_info=info,
    )
    [f] = findings_of(view, "rank_specific_artifact")
    assert (f.severity, f.ranks, f.subject, f.frame) == (
        "warning",
        (1,),
        "frame:train.py:10:forward",
        "train.py:10:forward",
    )
    assert f.details["diff"] == "rank-specific text only" and f.details["key"] == KEY
    assert (
        f.details["shared_dir"] == "/tmp/torchinductor_root"
        and f.details["location"] == "/tmp/torchinductor_root on host node1"
    )
    assert f.details["code"]["1"] == {"raw": "raw1", "norm": "norm"}
    assert f.details["codegen"]["1"] == {"cpu_capability": "AVX512", "device": "cuda:1"}
    assert "differ only in rank-specific text" in f.message and "fx5tq2ajmnbd…" in f.message
    assert "rank 1 runs with device=cuda:1, the others cuda:0" in f.message


def test_generated_code_differs_and_the_message_names_the_other_isa():
    info = {0: nfs_rank("a", "AVX512"), 1: nfs_rank("b", "AVX2"), 2: nfs_rank("c", "AVX512")}
    view = compile_view({r: compiled("miss", f"raw{r % 2}") for r in range(3)}, index=0, rank_info=info)
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.severity == "warning" and f.ranks == (1,) and f.details["diff"] == "generated code"
    assert "the generated code itself" in f.message
    assert "rank 1 runs with cpu_capability=AVX2, the others AVX512" in f.message
    assert "nfs4" in f.details["location"] and "nfs4" in f.message


def test_a_rank_loading_an_entry_while_isas_differ_is_critical():
    """The reproduced case: AVX512 and AVX2 ranks get one FX key; the AVX2 rank loads AVX512 code."""
    info = {0: nfs_rank("a", "AVX512"), 1: nfs_rank("b", "AVX2")}
    view = compile_view(
        {0: compiled("miss", "avx512-code"), 1: compiled("hit", "avx512-code")}, index=0, rank_info=info
    )
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.severity == "critical" and f.ranks == (1,) and f.details["tie"]
    assert f.details["loaded"] == [1] and f.details["loaded_from"] == {"1": 0}
    assert "rank 1 runs with cpu_capability=AVX2, the others AVX512" in f.message
    assert "give each node type its own TORCHINDUCTOR_CACHE_DIR" in f.message


def test_a_gpu_rank_loading_another_gpus_entry_is_critical():
    """Code that names its device (raw and normalized text differ) loaded by ranks whose graphs name another."""
    info = {r: local_rank("node1", device=f"cuda:{r}") for r in range(3)}
    view = compile_view(
        {r: on_device(compiled("miss" if r == 0 else "hit", "x", "x-norm"), r) for r in range(3)},
        index=0,
        rank_info=info,
    )
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.severity == "critical" and f.ranks == (1, 2) and f.details["loaded_from"] == {"1": 0, "2": 0}
    assert "rank 1 runs with device=cuda:1, rank 2 runs with device=cuda:2, the others cuda:0" in f.message


def test_rank_constants_baked_under_one_key_are_critical():
    """pytorch #188332: every rank on one device, the graphs differ only in the rank (normalized equal),
    the code carries rank-specific text, and rank 1 loaded the code rank 0 compiled."""
    info = {r: local_rank("node1", device="cuda:0") for r in range(2)}
    view = compile_view(
        {r: {**compiled("miss" if r == 0 else "hit", "rank0-code", "code-norm"), "graph_raw": f"g{r}"} for r in (0, 1)},
        index=0,
        rank_info=info,
    )
    [f] = findings_of(view, "rank_specific_artifact")
    assert (f.severity, f.ranks, f.details["loaded_from"]) == ("critical", (1,), {"1": 0})
    assert "their graphs differ in rank-specific text" in f.message


def test_loading_what_another_rank_compiled_for_the_same_graph_is_the_cache_working():
    """Ranks on one GPU sharing the default cache dir: rank 0 compiled, ranks 1 and 2 loaded its code,
    which names cuda:0, as their own graphs do."""
    info = {r: local_rank("node1", device="cuda:0") for r in range(3)}
    view = compile_view(
        {r: compiled("miss" if r == 0 else "hit", "cuda0-code", "code-norm") for r in range(3)},
        index=0,
        rank_info=info,
    )
    assert findings_of(view, "rank_specific_artifact") == []


def test_never_on_a_slot_whose_graphs_differ():
    """Rank 1 traced another graph (its forward under bf16 autocast) and compiled it, the others loaded
    theirs; whatever devices the ranks report, that is graph_divergence's slot."""
    info = {r: local_rank("node1", device=f"cuda:{r}") for r in range(3)}
    reports = {r: on_device(compiled("hit", "fp32-code", "fp32-norm"), r) for r in (0, 2)}
    reports[1] = {**compiled("miss", "bf16-code", "bf16-norm"), "graph_raw": "b" * 32, "graph_norm": "b" * 32}
    reports[0] = {**reports[0], "cache": {"inductor": "miss", "aotautograd": "miss"}}
    assert findings_of(compile_view(reports, index=0, rank_info=info), "rank_specific_artifact") == []


def test_the_gpu_does_not_count_for_a_graph_that_does_not_name_it():
    """Every rank traced the same raw graph (CPU work): its code is the same on every GPU."""
    info = {r: local_rank("node1", device=f"cuda:{r}") for r in range(2)}
    view = compile_view({0: compiled("miss", "x"), 1: compiled("hit", "x")}, index=0, rank_info=info)
    assert findings_of(view, "rank_specific_artifact") == []


def test_with_no_writer_in_the_run_critical_names_the_ranks_off_the_majority():
    """Every rank loaded one entry an earlier run wrote: it cannot be right for both ISAs."""
    info = {0: nfs_rank("a", "AVX512"), 1: nfs_rank("a", "AVX512"), 2: nfs_rank("b", "AVX2")}
    view = compile_view({r: compiled("hit", "x") for r in range(3)}, index=0, rank_info=info)
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.severity == "critical" and f.ranks == (2,) and not f.details["tie"] and f.details["loaded"] == [0, 1, 2]
    assert f.details["loaded_from"] == {}


def test_a_load_across_isas_of_code_no_other_target_runs_is_not_proof():
    """Rank 2 (AVX2) loaded code no AVX512 rank runs here: nothing says it was made for another target."""
    info = {0: nfs_rank("a", "AVX512"), 1: nfs_rank("a", "AVX512"), 2: nfs_rank("b", "AVX2")}
    view = compile_view(
        {0: compiled("miss", "x"), 1: compiled("hit", "x"), 2: compiled("hit", "z")}, index=0, rank_info=info
    )
    assert findings_of(view, "rank_specific_artifact") == []


def test_a_load_of_exactly_another_targets_code_is_critical_whatever_the_keys():
    info = {0: nfs_rank("a", "AVX512"), 1: nfs_rank("b", "AVX2")}
    view = compile_view(
        {0: compiled("miss", "avx512-code", key="fxA,fxB"), 1: compiled("hit", "avx512-code", key="fxA")},
        index=0,
        rank_info=info,
    )
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.severity == "critical" and f.ranks == (1,) and f.details["loaded_from"] == {"1": 0}
    assert "rank 1 (cpu_capability=AVX2) loaded the code rank 0 compiled (cpu_capability=AVX512)" in f.message


def test_loads_among_ranks_of_one_target_are_fine():
    info = {r: nfs_rank(f"h{r}", "AVX512") for r in range(3)}
    view = compile_view(
        {0: compiled("miss", "x"), 1: compiled("hit", "y"), 2: compiled("hit", "y")}, index=0, rank_info=info
    )
    assert findings_of(view, "rank_specific_artifact") == []


def test_per_rank_keys_on_a_multi_gpu_node_are_harmless():
    """Shaped like the recorded 2 x H200 job: one host, default cache dir, cuda:0 / cuda:1, the same
    normalized graph, code that differs even after normalization, and an FX key per rank."""
    old_agent = {
        r: {"host": "vm", "device": f"cuda:{r}", "local_rank": r, "cache_dirs": {"inductor": "/tmp/torchinductor_root"}}
        for r in range(2)
    }
    reports = {
        0: {
            **compiled(
                "miss",
                "f04f2f72d0ef74a960ec0a2d3ffa74ab",
                "9dc766cb6a4e831b75107c60a670dbc9",
                key="fcqtahki64lkaef5l7zbt66a2u7lphobxi4yafd3ueqibjs24hbm",
            ),
            "graph_raw": "81e43d81a04d6866fe5586f694db99c5",
            "graph_norm": "bcfc564c04f824ea1eff03d2948b06be",
        },
        1: {
            **compiled(
                "miss",
                "201c7bc292516a988dd022e3d715d4a0",
                "8bfa35f95490d20e89e29d8b1d34f092",
                key="frfowhg4wszow5fyabjio6wz3iawhixr6o4hbieawjiaxutlakpn",
            ),
            "graph_raw": "c2f1b71f55e157990167c37da8ddc209",
            "graph_norm": "bcfc564c04f824ea1eff03d2948b06be",
        },
    }
    assert findings_of(compile_view(reports, index=0, rank_info=old_agent), "rank_specific_artifact") == []
    current = {r: local_rank("vm", device=f"cuda:{r}") for r in range(2)}
    assert findings_of(compile_view(reports, index=0, rank_info=current), "rank_specific_artifact") == []


def test_the_same_local_path_on_two_hosts_is_two_caches():
    info = {0: local_rank("node1"), 1: local_rank("node2", isa="AVX2")}
    view = compile_view({0: compiled("miss", "x"), 1: compiled("hit", "y")}, index=0, rank_info=info)
    assert findings_of(view, "rank_specific_artifact") == []


def test_old_agents_on_two_hosts_do_not_share():
    info = {r: {"host": f"node{r}", "cache_dirs": {"inductor": "/tmp/torchinductor_root"}} for r in range(2)}
    view = compile_view({0: compiled("miss", "x"), 1: compiled("miss", "y")}, index=0, rank_info=info)
    assert findings_of(view, "rank_specific_artifact") == []


def test_old_agents_on_one_host_share_by_path():
    info = {r: {"host": "node1", "cache_dirs": {"inductor": "/tmp/torchinductor_root"}} for r in range(2)}
    view = compile_view({0: compiled("miss", "x", "n"), 1: compiled("miss", "y", "n")}, index=0, rank_info=info)
    [f] = findings_of(view, "rank_specific_artifact")
    assert f.severity == "warning" and f.details["codegen"] == {"0": {}, "1": {}}
    assert "runs with" not in f.message  # no codegen facts reported: nothing to name


def test_a_missing_codegen_fact_is_unknown_not_different():
    info = {0: nfs_rank("a", "AVX512"), 1: {**nfs_rank("b", "AVX2"), "codegen": {}}}
    view = compile_view({0: compiled("miss", "x"), 1: compiled("hit", "x")}, index=0, rank_info=info)
    assert findings_of(view, "rank_specific_artifact") == []


def test_cache_location():
    assert cache_location(nfs_rank("a", "AVX2")) == ("fs", "0", "/mnt/shared/inductor")
    assert cache_location(local_rank("n")) == ("host", "n", "/tmp/torchinductor_root")
    assert cache_location({"cache_dirs": {"inductor": "/x"}}) is None  # no host: cannot tell
