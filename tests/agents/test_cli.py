"""CLI verbs: --help for each, and the progress display on a terminal vs one summary line."""

import io
import subprocess
import sys

import pytest

from agents.cli import Progress

from .conftest import REPO


@pytest.mark.parametrize("verb,word", [("run", "rank_end"), ("upload", "idempotent"), ("replay", "TORCH_TRACE")])
def test_every_verb_has_help(verb, word):
    out = subprocess.run(
        [sys.executable, "-m", "agents", verb, "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
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


def test_replay_takes_versions_from_the_trace_and_meta_for_the_rest(tmp_path):
    import gzip
    import json
    import tarfile

    from agents.cli import main, with_meta
    from agents.spool import list_batches

    with tarfile.open(f"{REPO}/tests/fixtures/trace_211_cuda.tgz") as tar:
        tar.extractall(tmp_path / "trace", filter="data")
    with pytest.raises(SystemExit) as refused:
        main(
            ["replay", str(tmp_path / "trace"), "--run", "r", "--spool-dir", str(tmp_path / "bad"), "--meta", "driver"]
        )
    assert refused.value.code == 2 and not (tmp_path / "bad").exists()
    assert (
        main(
            [
                "replay",
                str(tmp_path / "trace"),
                "--run",
                "r",
                "--spool-dir",
                str(tmp_path / "spool"),
                "--meta",
                "driver=580.1",
                "--meta",
                "settings.inductor.fallback_random=True",
            ]
        )
        == 0
    )

    def starts(body: bytes) -> list[dict]:
        raw = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
        return [e for e in json.loads(raw)["events"] if e["t"] == "rank_start"]

    bodies = [open(p, "rb").read() for p in list_batches(str(tmp_path / "spool"))]
    start = next(s for b in bodies for s in starts(b))
    assert start["versions"] == {
        "torch": "2.11.0+cu130",
        "python": "3.12.3",
        "cuda": "13.0",
        "triton": "3.6.0",
        "gpu": "NVIDIA H200",
        "driver": "580.1",
    }
    assert start["settings"] == {"inductor.fallback_random": "True"}
    # upload --meta: added to rank_start, the same bytes every time (a resend stays a duplicate)
    first = next(b for b in bodies if starts(b))
    added = with_meta(first, {"nccl": "2.21.5"})
    assert starts(added)[0]["versions"]["nccl"] == "2.21.5" and with_meta(added, {"nccl": "2.21.5"}) == added
    assert with_meta(first, {"nccl": "2.21.5"}) == added
