"""`dashboard.serve`: each worker's socket is bound with SO_REUSEPORT, so the kernel spreads new
connections over the workers (tests/ingest/test_metrics_workers.py runs the workers themselves)."""

from __future__ import annotations

import socket

from dashboard.serve import listening, port_free
from tests.stack import free_port


def test_connections_to_one_port_are_spread_over_every_socket_bound_to_it():
    port = free_port()
    sockets = [listening("127.0.0.1", port) for _ in range(2)]  # a second bind without SO_REUSEPORT fails
    assert not port_free("127.0.0.1", port)  # what keeps a second server off the port
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]
    try:
        taken = []
        for sock in sockets:
            sock.setblocking(False)
            count = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                count += 1
            taken.append(count)
    finally:
        for sock in [*sockets, *clients]:
            sock.close()
    assert sum(taken) == 64 and min(taken) >= 16, taken  # by a hash of each connection's ports: about half each
    assert port_free("127.0.0.1", port)
