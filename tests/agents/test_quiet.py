"""The agent adds one line to a job's output at default verbosity, rank 0's naming the run and its page
(issue 52, item 5; the other ranks' silence: tests/agents/test_run_line.py): otherwise the same
torchrun DDP job with and without it prints the same stderr (the DDP scan at attach once printed
torch's `FutureWarning: torch.distributed.reduce_op is deprecated` on every rank; one rank shows it)."""

from __future__ import annotations

from tests.agents import tiny_jobs


def test_the_agent_adds_only_rank_0s_run_line_to_the_jobs_stderr(tmp_path):
    bare = tiny_jobs.start(tmp_path / "bare", "quiet-bare", agent=False, ranks=1)
    watched = tiny_jobs.start(tmp_path / "watched", "quiet-watched", ranks=1)
    bare_err, watched_err = tiny_jobs.finish(bare), tiny_jobs.finish(watched)
    added = [line for line in watched_err.splitlines() if line not in set(bare_err.splitlines())]
    assert added == [f"lockstep: run quiet-watched (offline: spooled in {tmp_path / 'watched'})"], watched_err
    assert list((tmp_path / "watched").iterdir())  # the agent did run and record the job
