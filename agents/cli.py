"""Command line: `python -m agents run|upload|replay|relay ...` (docs/design.md, The agent)."""

from __future__ import annotations

import argparse
import os
import re
import runpy
import sys
import time
import traceback
from typing import TextIO

import msgspec

from agents.relay import MAX_BATCHES, WINDOW_S
from agents.spool import Spool, list_batches, split_body
from agents.transport import Outcome, post

UPLOAD_ATTEMPTS = 5


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m agents", description="Lockstep per-rank agent.")
    verbs = p.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser(
        "run",
        help="attach the agent, then run a script as __main__",
        description="Attach the agent (settings from LOCKSTEP_* env), run SCRIPT with ARGS "
        "as __main__, report its exit status in rank_end. Works under "
        "`torchrun ... -m agents run script.py`.",
    )
    run.add_argument("script", help="path of the Python script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    up = verbs.add_parser(
        "upload",
        help="send a spool directory to the server",
        description="Send spooled batches in order; delivered files are deleted, so a "
        "rerun is idempotent (the server also deduplicates). A batch the server "
        "proves malformed moves to quarantine/ with its answer; any other failure "
        "keeps it and those after it, and says why. Exit 1 unless all were sent.",
    )
    up.add_argument("spool_dir")
    up.add_argument("--url", default=os.environ.get("LOCKSTEP_URL"), help="server URL (default $LOCKSTEP_URL)")
    up.add_argument("--token", default=os.environ.get("LOCKSTEP_TOKEN"), help="token (default $LOCKSTEP_TOKEN)")
    up.add_argument(
        "--meta",
        action="append",
        default=[],
        type=_meta_item,
        metavar="KEY=VALUE",
        help="a version the spool lacks (driver=570.86, nccl=2.21.5, gpu=...) or a compiler setting "
        "(settings.inductor.fallback_random=True), added to every rank's rank_start; repeatable",
    )
    rp = verbs.add_parser(
        "replay",
        help="ingest existing TORCH_TRACE logs (one *rank_N*.log per rank)",
        description="Parse TORCH_TRACE files (the format tlparse reads: "
        "dedicated_log_torch_trace_rank_<r>_*.log) through the agent's capture code "
        "and send the Compile/GraphBreak events of every rank as run KEY. Idempotent: "
        "the same files give the same sessions, which the server deduplicates.",
    )
    rp.add_argument("trace_dir")
    rp.add_argument("--run", required=True, help="run key to store the ranks under")
    rp.add_argument("--world-size", type=int, default=None, help="default: highest rank found + 1")
    rp.add_argument("--url", default=os.environ.get("LOCKSTEP_URL"), help="server URL (default $LOCKSTEP_URL)")
    rp.add_argument("--token", default=os.environ.get("LOCKSTEP_TOKEN"), help="token (default $LOCKSTEP_TOKEN)")
    rp.add_argument("--spool-dir", default=None, help="write the batches here (for `upload`) instead of sending")
    rp.add_argument(
        "--meta",
        action="append",
        default=[],
        type=_meta_item,
        metavar="KEY=VALUE",
        help="a version the trace does not hold (driver=570.86, nccl=2.21.5, cudnn=91002, ...; it "
        "overrides the trace's own) or a compiler setting (settings.inductor.fallback_random=True); "
        "repeatable",
    )
    rl = verbs.add_parser(
        "relay",
        help="forward the batches of a node's ranks to the server in bulk",
        description="Listen for the agents of this node (point their LOCKSTEP_URL here) and "
        "forward what they send within WINDOW seconds as one bulk request. It keeps "
        "nothing: each agent gets the server's answer to its own batch.",
    )
    rl.add_argument("--listen", default="127.0.0.1:7070", help="HOST:PORT to listen on (default 127.0.0.1:7070)")
    rl.add_argument("--url", default=os.environ.get("LOCKSTEP_URL"), help="server URL (default $LOCKSTEP_URL)")
    rl.add_argument("--window", type=float, default=WINDOW_S, help=f"seconds to gather batches (default {WINDOW_S})")
    rl.add_argument("--max-batches", type=int, default=MAX_BATCHES, help=f"per request (default {MAX_BATCHES})")
    return p


META_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _meta_item(text: str) -> tuple[str, str]:
    """`--meta key=value`: a version name and its value (bad input is refused before anything is sent)."""
    key, sep, value = text.partition("=")
    if not sep or not META_KEY.match(key.strip()) or not value.strip() or len(value) > 512:
        raise argparse.ArgumentTypeError(
            f"--meta wants KEY=VALUE (key: letters, digits, _.-; value: 1-512 chars), got {text!r}"
        )
    return key.strip(), value.strip()


def _split_meta(meta: dict[str, str]) -> dict[str, dict[str, str]]:
    """`settings.<key>=...` entries are compiler settings, every other key a version."""
    return {
        "versions": {k: v for k, v in meta.items() if not k.startswith("settings.")},
        "settings": {k[len("settings.") :]: v for k, v in meta.items() if k.startswith("settings.")},
    }


def with_meta(body: bytes, meta: dict[str, str]) -> bytes:
    """A spooled batch with `meta` added to its rank_start events (unchanged bytes when it has none
    or when they are already there, so a repeated upload stays a duplicate)."""
    import gzip

    packed = body[:2] == b"\x1f\x8b"
    batch = msgspec.json.decode(gzip.decompress(body) if packed else body)
    starts = [e for e in batch.get("events", []) if isinstance(e, dict) and e.get("t") == "rank_start"]
    parts = _split_meta(meta)
    if all({**e.get(f, {}), **add} == e.get(f, {}) for e in starts for f, add in parts.items()):
        return body
    for event in starts:
        for field, add in parts.items():
            if add:
                event[field] = {**event.get(field, {}), **add}
    raw = msgspec.json.encode(batch)
    return gzip.compress(raw, mtime=0) if packed else raw


def run_script(script: str, args: list[str]) -> int:
    """Run `script` like `python script.py args`, with the agent attached; returns the exit code."""
    import agents

    if args[:1] == ["--"]:
        args = args[1:]
    from agents.crash import StderrTail

    agent = agents.attach()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    stderr = StderrTail(sys.stderr)
    sys.stderr = stderr  # a stand-in that writes through
    code, status, reason = 0, "ok", None
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        status = "ok" if code == 0 else "error"
        if code != 0:  # why it exited: argparse and config checks print it, then exit
            reason = f"SystemExit({code}): {stderr.last_words() or 'no message'}"
    except KeyboardInterrupt:
        code, status, reason = 130, "signal", "KeyboardInterrupt"
    except BaseException as e:
        traceback.print_exc()
        agent.mark_crash(e)
        agent.close()
        return 1
    agent.close(status=status, exit_code=code, reason=reason)
    return code


def _count_events(body: bytes) -> int:
    import gzip

    try:
        raw = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
        return len(msgspec.json.decode(raw).get("events", []))
    except Exception:
        return 0


def _send(url: str, token: str | None, body: bytes) -> Outcome:
    """The outcome of the last attempt; a retryable failure is tried UPLOAD_ATTEMPTS times with backoff."""
    delay = 0.5
    for attempt in range(UPLOAD_ATTEMPTS):
        outcome = post(url, token, body)
        if outcome.kind != "retry":
            return outcome
        if attempt + 1 < UPLOAD_ATTEMPTS:
            time.sleep(outcome.delay if outcome.delay is not None else delay)
            delay = min(delay * 2, 10)
    return outcome


class Progress:
    """Progress on a terminal (events, rate, what is left), one summary line otherwise."""

    def __init__(self, verb: str, total: int, stream: TextIO | None = None) -> None:
        self.verb, self.total = verb, total
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.done = self.failed = self.events = self.kept = self.quarantined = 0
        self.start = time.monotonic()
        self._last = 0.0

    def update(self, events: int, ok: bool) -> None:
        self.done += 1
        if ok:
            self.events += events
        else:
            self.failed += 1
        now = time.monotonic()
        if self.tty and (now - self._last > 0.1 or self.done == self.total):
            self._last = now
            rate = self.events / max(now - self.start, 1e-6)
            print(
                f"\r{self.verb}: {self.done}/{self.total} batches, {self.events} events, {rate:.0f} ev/s, "
                f"{self.total - self.done} batches left",
                end="",
                file=self.stream,
                flush=True,
            )

    def summary(self) -> None:
        if self.tty:
            print(file=self.stream)
        elapsed = time.monotonic() - self.start
        print(
            f"{self.verb}: {self.done - self.failed} batches ({self.events} events) in {elapsed:.1f}s, "
            f"{self.events / max(elapsed, 1e-6):.0f} ev/s, {self.failed} failed "
            f"({self.kept} kept in the spool, {self.quarantined} quarantined)",
            file=self.stream,
            flush=True,
        )


def upload(spool_dir: str, url: str | None, token: str | None, meta: dict[str, str] | None = None) -> int:
    if not url:
        print("upload: no --url and no LOCKSTEP_URL", file=sys.stderr)
        return 2
    url = url.rstrip("/")
    pending = list_batches(spool_dir)
    spool = Spool(spool_dir, 1 << 62)  # halves of a split batch replace it: no new bytes to cap
    progress = Progress("uploaded", len(pending))
    while pending:
        path = pending.pop(0)
        with open(path, "rb") as f:
            body = with_meta(f.read(), meta or {})
        outcome = _send(url, token, body)
        if outcome.kind == "split" and (halves := split_body(body)) is not None:
            pending[:0] = [written for name, half in halves if (written := spool.write(name, half)) is not None]
            spool.remove(path)
            progress.total += 1
            continue
        if outcome.kind == "ok":
            spool.remove(path)
        elif outcome.kind == "quarantine":
            print(f"upload: {os.path.basename(path)} quarantined: {outcome.detail}", file=sys.stderr)
            spool.quarantine(os.path.basename(path), body, outcome.detail, spooled=path)
            progress.quarantined += 1
        else:
            _keep([path, *pending], outcome, progress)
            break
        progress.update(_count_events(body), outcome.kind == "ok")
    progress.summary()
    return 1 if progress.failed else 0


def _keep(paths: list[str], outcome: Outcome, progress: Progress) -> None:
    """A failure the server did not prove to be the batch's fault: this batch and every later one
    stay in the spool, in order, for the next `upload`."""
    print(
        f"upload: {len(paths)} batches stay in the spool, from {os.path.basename(paths[0])}: {outcome.detail}",
        file=sys.stderr,
    )
    progress.kept = len(paths)
    progress.failed += len(paths)
    progress.done += len(paths)


def replay(
    trace_dir: str,
    run: str,
    url: str | None,
    token: str | None,
    spool_dir: str | None,
    world_size: int | None,
    meta: dict[str, str] | None = None,
) -> int:
    """Read TORCH_TRACE logs, then send the batches (or write them to a spool for `upload`)."""
    from agents.replay import batches as replay_batches
    from agents.spool import Spool, file_name
    from agents.transport import encode_body

    if not url and not spool_dir:
        print("replay: give --url (or LOCKSTEP_URL) or --spool-dir", file=sys.stderr)
        return 2
    found = replay_batches(trace_dir, run, world_size, meta)
    if not found:
        print(f"replay: no *rank_<N>*.log files under {trace_dir}", file=sys.stderr)
        return 2
    progress = Progress("replayed", len(found))
    spool = Spool(spool_dir, 1 << 40) if spool_dir else None
    for batch in found:
        body = encode_body(batch)
        if spool is not None:
            spool.write(file_name(batch.rank, batch.session, batch.seq, body[:2] == b"\x1f\x8b"), body)
            error = None
        else:
            outcome = _send((url or "").rstrip("/"), token, body)  # a URL or a spool: checked above
            error = None if outcome.kind == "ok" else outcome.detail
            if error:
                print(f"replay: rank {batch.rank} seq {batch.seq}: {error}", file=sys.stderr)
        progress.update(len(batch.events), error is None)
    progress.summary()
    return 1 if progress.failed else 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.verb == "run":
        return run_script(ns.script, ns.args)
    if ns.verb == "replay":
        return replay(ns.trace_dir, ns.run, ns.url, ns.token, ns.spool_dir, ns.world_size, dict(ns.meta))
    if ns.verb == "relay":
        if not ns.url:
            print("relay: no server URL (--url or LOCKSTEP_URL)", file=sys.stderr)
            return 2
        from agents import relay

        relay.serve(ns.listen, ns.url, ns.window, ns.max_batches)
        return 0
    return upload(ns.spool_dir, ns.url, ns.token, dict(ns.meta))
