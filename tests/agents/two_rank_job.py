"""A real 2-rank torchrun DDP job under the agent, offline, and what its spool must show. The agent's
wheel runs it (`tests/packaging/test_wheels.py`): one job proves both the package and the agent's
capture, where two such jobs cost the suite half a minute of CPU each.

Rank 1 alone gets a bigger batch at step 3 and nudges one gradient at step 5. What the spools must
show needs no majority, so two ranks do (the server's verdicts on three: tests/e2e)."""

from __future__ import annotations

from agents import protocol

from .conftest import events_of, read_spool

STEPS = 8
ARGS = ("--steps", str(STEPS), "--shape-rank", "1", "--shape-step", "3", "--perturb-rank", "1", "--perturb-step", "5")


def check_spool(spool: str, run: str) -> None:
    """Both ranks' batches: one run of world size 2, a complete rank_start once the first step ran,
    every step's gradients and weights, one recompile on the shape rank only, DDP's bitwise-equal
    gradients except the nudged bucket, and a clean rank_end."""
    ranks = read_spool(spool)
    assert sorted(ranks) == [0, 1]
    assert {b.run.key for bs in ranks.values() for b in bs} == {run}
    assert all(b.run.world_size == 2 for bs in ranks.values() for b in bs)
    grads, compiles = {}, {}
    for rank, batches in ranks.items():
        events = events_of(batches)
        assert isinstance(events[0], protocol.RankStart) and isinstance(events[-1], protocol.RankEnd)
        assert events[-1].status == "ok" and events[-1].exit_code == 0
        # attach ran before the script built its model and process group; the first step completes rank_start
        assert events[0].params == [] and events[0].collective_timeout_s is None
        complete = [e for e in events if isinstance(e, protocol.RankStart)][1:]
        assert len(complete) == 1 and complete[0].collective_timeout_s > 0
        assert complete[0].params[0] == "ddp:_orig_mod.0.weight" and len(complete[0].buckets) == len(complete[0].params)
        assert sorted(i for b in complete[0].buckets for i in b) == list(range(len(complete[0].params)))
        compiles[rank] = [e for e in events if isinstance(e, protocol.Compile)]
        assert all(c.status == "ok" for c in compiles[rank])
        grads[rank] = {e.step: e.fps for e in events if isinstance(e, protocol.Grad) and e.group == "ddp"}
        assert sorted(grads[rank]) == list(range(STEPS))
        assert sorted(e.step for e in events if isinstance(e, protocol.Step)) == list(range(STEPS))
        # weights every 50 steps, and after the last one at the clean exit (the script's objects long gone)
        assert [e.step for e in events if isinstance(e, protocol.Param)] == [0, STEPS - 1]
    # Only the shape rank recompiles, at step 3, for a size mismatch.
    recompiles = {r: [c for c in cs if c.index > 0] for r, cs in compiles.items()}
    assert recompiles[0] == []
    assert len(recompiles[1]) == 1 and recompiles[1][0].step == 3
    assert "size mismatch" in recompiles[1][0].recompile_reason
    first = {r: cs[0] for r, cs in compiles.items()}
    assert len({c.frame for c in first.values()}) == 1 and all(c.index == 0 and c.step == 0 for c in first.values())
    assert len({c.hashes["dynamo"].norm for c in first.values()}) == 1
    # DDP grads agree bitwise except where rank 1 nudged its grad after the all-reduce.
    for step in range(STEPS):
        if step == 5:
            assert sum(a != b for a, b in zip(grads[0][5], grads[1][5])) == 1  # one bucket differs
        else:
            assert grads[0][step] == grads[1][step], step
