"""CLI verbs: --help for each, and the progress display on a terminal vs one summary line."""
import io
import subprocess
import sys

import pytest

from agents.cli import Progress

from .conftest import REPO


@pytest.mark.parametrize("verb,word", [("run", "rank_end"), ("upload", "idempotent"), ("replay", "TORCH_TRACE")])
def test_every_verb_has_help(verb, word):
    out = subprocess.run([sys.executable, "-m", "agents", verb, "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and word in out.stdout.replace("\n", " ")


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_and_summary_otherwise():
    tty, plain = _Tty(), io.StringIO()
    for stream in (tty, plain):
        p = Progress("uploaded", 3, stream)
        for ok in (True, False, True):
            p.update(10, ok)
        p.summary()
    assert "batches left" in tty.getvalue() and "ev/s" in tty.getvalue() and "\r" in tty.getvalue()
    lines = plain.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("uploaded: 2 batches (20 events)") and "1 failed" in lines[0]
