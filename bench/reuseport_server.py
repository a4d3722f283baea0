"""One ingest server process on a listening socket of its own, bound with SO_REUSEPORT beside its
siblings': the kernel spreads new connections over the processes evenly, by a hash of each
connection's addresses. `uvicorn --workers N` shares one socket instead, and a process whose loop
wakes first accepts every connection then waiting (asyncio accepts up to its backlog at once), so a
step's burst of rack requests lands unevenly: at 100,000 ranks one process did 3x another's work.

    python -m bench.reuseport_server HOST PORT     (the options of `processes.server_command`)
"""

from __future__ import annotations

import socket
import sys

import uvicorn

from dashboard.devstack.processes import GRACEFUL_SHUTDOWN_S


def listening(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def main(argv: list[str]) -> None:
    host, port = argv[0], int(argv[1])
    config = uvicorn.Config(
        "dashboard.asgi:application",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http="dashboard.web.header_deadline:HeaderDeadline",
        proxy_headers=False,
    )
    uvicorn.Server(config).run(sockets=[listening(host, port)])


if __name__ == "__main__":
    main(sys.argv[1:])
