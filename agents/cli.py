"""Command line: `python -m agents run|upload ...` (DESIGN 3.1)."""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
import traceback

import msgspec

from agents.spool import list_batches
from agents.transport import post

UPLOAD_ATTEMPTS = 5


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agents", description="Lockstep per-rank agent.")
    verbs = p.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="attach the agent, then run a script as __main__",
                           description="Attach the agent (settings from LOCKSTEP_* env), run SCRIPT with ARGS "
                                       "as __main__, report its exit status in rank_end. Works under "
                                       "`torchrun ... -m agents run script.py`.")
    run.add_argument("script", help="path of the Python script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    up = verbs.add_parser("upload", help="send a spool directory to the server",
                          description="Send spooled batches in order; delivered files are deleted, so a "
                                      "rerun is idempotent (the server also deduplicates). Exit 1 if any fail.")
    up.add_argument("spool_dir")
    up.add_argument("--url", default=os.environ.get("LOCKSTEP_URL"), help="server URL (default $LOCKSTEP_URL)")
    up.add_argument("--token", default=os.environ.get("LOCKSTEP_TOKEN"), help="token (default $LOCKSTEP_TOKEN)")
    return p


def run_script(script: str, args: list[str]) -> int:
    """Run `script` like `python script.py args`, with the agent attached; returns the exit code."""
    import agents

    if args[:1] == ["--"]:
        args = args[1:]
    agent = agents.attach()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code, status, reason = 0, "ok", None
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        status = "ok" if code == 0 else "error"
    except KeyboardInterrupt:
        code, status, reason = 130, "signal", "KeyboardInterrupt"
    except BaseException as e:
        traceback.print_exc()
        code, status, reason = 1, "error", f"{type(e).__name__}: {e}"
    agent.close(status=status, exit_code=code, reason=reason)
    return code


def _count_events(body: bytes) -> int:
    import gzip

    try:
        raw = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
        return len(msgspec.json.decode(raw).get("events", []))
    except Exception:
        return 0


def _send(url: str, token: str | None, body: bytes) -> str | None:
    """None on success, else the last error; retries transient failures with backoff."""
    delay = 0.5
    for attempt in range(UPLOAD_ATTEMPTS):
        outcome = post(url, token, body)
        if outcome.kind == "ok":
            return None
        if outcome.kind == "drop":
            return outcome.detail
        if attempt + 1 < UPLOAD_ATTEMPTS:
            time.sleep(outcome.delay if outcome.delay is not None else delay)
            delay = min(delay * 2, 10)
    return outcome.detail


def upload(spool_dir: str, url: str | None, token: str | None) -> int:
    if not url:
        print("upload: no --url and no LOCKSTEP_URL", file=sys.stderr)
        return 2
    url = url.rstrip("/")
    files = list_batches(spool_dir)
    tty = sys.stdout.isatty()
    sent = failed = events = 0
    start = time.monotonic()
    for i, path in enumerate(files):
        with open(path, "rb") as f:
            body = f.read()
        error = _send(url, token, body)
        if error is None:
            os.unlink(path)
            sent += 1
            events += _count_events(body)
        else:
            failed += 1
            print(f"upload: {os.path.basename(path)}: {error}", file=sys.stderr)
        if tty:
            rate = events / max(time.monotonic() - start, 1e-6)
            print(f"\r{i + 1}/{len(files)} batches, {events} events, {rate:.0f} ev/s, "
                  f"{len(files) - i - 1} remaining", end="", flush=True)
    if tty:
        print()
    print(f"uploaded {sent} batches ({events} events) in {time.monotonic() - start:.1f}s, {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.verb == "run":
        return run_script(ns.script, ns.args)
    return upload(ns.spool_dir, ns.url, ns.token)
