"""Whole processes: LOCKSTEP_DISABLE, `agents run` exit status and what rank_start says of the machine.
A real 2-rank torchrun DDP job under the agent runs from its wheel (`tests/agents/two_rank_job.py`)."""

import os
import signal
import subprocess
import sys

from agents import protocol
from dashboard.devstack.processes import kill_tree

from .conftest import REPO, events_of, read_spool


def _run(cmd, env, timeout=300):
    """Run in its own session; on a timeout, torchrun gets SIGTERM (it stops its workers), then
    whatever is left of the tree is killed (no processes left behind)."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers (own sessions)
        try:
            proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
        raise
    return proc.returncode, out


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(
        LOCKSTEP_OFFLINE="1",
        LOCKSTEP_SPOOL_DIR=str(tmp_path / "spool"),
        TORCHINDUCTOR_COMPILE_THREADS="1",
        PYTHONFAULTHANDLER="1",
        **extra,
    )
    return env


def test_disable_gives_noop_agent(tmp_path):
    code = (
        "import agents, torch; a = agents.attach(); b = agents.attach(); assert a is b and not a.enabled; "
        "a.step(3); a.close(timeout=1); print('ok')"
    )
    rc, out = _run([sys.executable, "-c", code], _env(tmp_path, LOCKSTEP_DISABLE="1"))
    assert rc == 0 and "ok" in out, out
    assert not (tmp_path / "spool").exists()


def test_run_reports_script_failure_in_rank_end(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['--x', '1']\nraise ValueError('boom')\n")
    rc, out = _run([sys.executable, "-m", "agents", "run", str(script), "--x", "1"], _env(tmp_path))
    assert rc == 1 and "ValueError: boom" in out
    events = events_of(read_spool(str(tmp_path / "spool"))[0])
    assert isinstance(events[0], protocol.RankStart) and isinstance(events[-1], protocol.RankEnd)
    assert events[-1].status == "error" and events[-1].exit_code == 1 and "boom" in events[-1].reason
    assert events[-1].exc_type == "ValueError" and events[-1].where.endswith("boom.py:3 <module>")


def test_a_script_that_exits_by_itself_says_why_in_rank_end(tmp_path):
    """argparse exits 2 on a mistyped argument and says why only on stderr: rank_end carries it."""
    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr')\np.parse_args()\n")
    rc, out = _run([sys.executable, "-m", "agents", "run", str(script), "--lrr", "3"], _env(tmp_path))
    assert rc == 2 and "unrecognized arguments: --lrr 3" in out  # the job's stderr is as it was
    end = events_of(read_spool(str(tmp_path / "spool"))[0])[-1]
    assert (end.status, end.exit_code) == ("error", 2)
    assert end.reason.startswith("SystemExit(2): usage:") and end.reason.endswith("unrecognized arguments: --lrr 3")


def test_sigterm_while_closing_after_an_error_still_sends_rank_end(tmp_path):
    """torchrun stops the surviving ranks right after one fails: a rank whose gloo call just raised
    "Connection reset by peer" gets SIGTERM while its excepthook is closing the agent. The handler
    re-enters close; the rank_end (naming the error) must be written before the signal ends it."""
    script = tmp_path / "reset.py"
    script.write_text(
        "import os, signal, time, agents\n"
        "agent = agents.attach()\n"
        "drain = agent.grads.drain\n"
        "def stopped_while_draining(block=True):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "    return drain(block=block)\n"
        "agent.grads.drain = stopped_while_draining\n"
        "raise ConnectionError('Connection reset by peer')\n"
    )
    rc, out = _run([sys.executable, "-m", "agents", "run", str(script)], _env(tmp_path))
    assert rc == -signal.SIGTERM, out
    ends = [e for e in events_of(read_spool(str(tmp_path / "spool"))[0]) if isinstance(e, protocol.RankEnd)]
    assert len(ends) == 1, ends
    assert (ends[0].status, ends[0].exc_type) == ("error", "ConnectionError") and "reset by peer" in ends[0].reason


def test_rank_start_says_where_the_cache_is_and_what_code_it_builds(tmp_path):
    """rank_start carries the cache dir's real location and the CPU ISA that shapes generated code
    (ATEN_CPU_CAPABILITY: the setting Inductor's cache keys leave out)."""
    script = tmp_path / "quiet.py"
    script.write_text("print('ok')\n")
    cache = tmp_path / "cache"
    rc, out = _run(
        [sys.executable, "-m", "agents", "run", str(script)],
        _env(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(cache), ATEN_CPU_CAPABILITY="default"),
    )
    assert rc == 0, out
    start = events_of(read_spool(str(tmp_path / "spool"))[0])[0]
    assert start.codegen == {"cpu_capability": "DEFAULT"}
    location = start.cache_fs["inductor"]
    assert location.path == str(cache.resolve()) and location.fs and not location.fsid and not location.shared
