"""The ASGI server (ingest, pages, websockets) in one or more processes:

    python -m dashboard.serve --host 0.0.0.0 --port 8000 --workers N [--log-level warning] [--no-access-log]

It is uvicorn with the options the server needs (`config` says why each), with one difference from `uvicorn --workers N`: each worker listens on a socket of
its own, bound to the same port with SO_REUSEPORT, so the kernel spreads new connections over the
workers evenly, by a hash of each connection's addresses. Workers that share one socket take
connections as each wakes first, and asyncio accepts every connection waiting at once: a step's
burst of rack relays' requests landed unevenly, one process doing three times another's work, and
the step waited for the busiest (docs/scale-out.md, "One socket per ingest process").

The supervisor restarts a worker that exits unasked (and exits 1 when workers fail as they start:
`Supervisor`), and on SIGTERM or SIGINT stops them all, each finishing its requests in flight for
up to GRACEFUL_SHUTDOWN_S. Before its workers bind, it checks
that nothing else listens on the port: SO_REUSEPORT would otherwise let a second server share it.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import signal
import socket
import sys
import time
from multiprocessing.process import BaseProcess

import uvicorn

GRACEFUL_SHUTDOWN_S = 3  # then open websockets (pages, `alerts -f`) are closed; their clients reconnect
BACKLOG = 2048  # uvicorn's default: a step's burst of connections waits here, not refused
log = logging.getLogger("lockstep.serve")


def config(args: argparse.Namespace) -> uvicorn.Config:
    """uvicorn's settings. A stop lets requests in flight finish for GRACEFUL_SHUTDOWN_S: without a
    bound, uvicorn waits for every open websocket to close, and a browser tab left open held a stop
    until it was killed. Headers have LOCKSTEP_HEADER_TIMEOUT (`dashboard.web.header_deadline`), and
    uvicorn's own proxy headers are off: it would believe X-Forwarded-For from 127.0.0.1 (or
    FORWARDED_ALLOW_IPS); the application believes it from LOCKSTEP_TRUSTED_PROXIES only
    (`dashboard.web.edge.ClientAddress`)."""
    return uvicorn.Config(
        "dashboard.asgi:application",
        log_level=args.log_level,
        access_log=not args.no_access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http="dashboard.web.header_deadline:HeaderDeadline",
        proxy_headers=False,
        backlog=BACKLOG,
    )


def listening(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other workers' sockets may share (SO_REUSEPORT)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    return sock


def port_free(host: str, port: int) -> bool:
    """Nothing is bound to the port (a bind without SO_REUSEPORT succeeds)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def worker(args: argparse.Namespace) -> None:
    """One worker: uvicorn on its own socket (it stops on SIGTERM or SIGINT, after its requests)."""
    uvicorn.Server(config(args)).run(sockets=[listening(args.host, args.port)])


class Supervisor:
    """N workers (spawned: a fresh interpreter each, as uvicorn's), restarted when one exits unasked.
    One that fails on its own (an exit status, not a signal) within STARTUP_S of its start is a
    server that cannot start (its settings, an application that does not load): the supervisor then
    stops them all and exits 1, rather than restarting it forever."""

    STARTUP_S = 10.0

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[tuple[BaseProcess, float]] = []  # each with the moment it started
        self.stopping = False
        self.failed = False

    def start(self) -> tuple[BaseProcess, float]:
        process = self.context.Process(target=worker, args=(self.args,), name="lockstep-serve-worker")
        process.start()
        return process, time.monotonic()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.stop)
        self.workers = [self.start() for _ in range(self.args.workers)]
        while not self.stopping:
            time.sleep(0.5)
            for i, (process, started) in enumerate(self.workers):
                if process.is_alive() or self.stopping:
                    continue
                if (process.exitcode or 0) > 0 and time.monotonic() - started < self.STARTUP_S:
                    log.error("worker %s exited with %s as it started: stopping", process.pid, process.exitcode)
                    self.stopping = self.failed = True
                    break
                log.warning("worker %s exited with %s: starting another", process.pid, process.exitcode)
                self.workers[i] = self.start()
        for process, _ in self.workers:
            process.terminate()  # SIGTERM: uvicorn finishes its requests in flight
        for process, _ in self.workers:
            process.join(GRACEFUL_SHUTDOWN_S + 5)
            if process.is_alive():
                process.kill()
                process.join()
        return 1 if self.failed else 0

    def stop(self, signum: int, frame: object) -> None:
        self.stopping = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="processes, each on a socket of its own")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--no-access-log", action="store_true")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if not port_free(args.host, args.port):
        parser.error(f"{args.host}:{args.port} is in use: another server listens there")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    if args.workers == 1:
        worker(args)
        return 0
    return Supervisor(args).run()


if __name__ == "__main__":
    sys.exit(main())
