"""Ingest processes each on a socket of their own (`bench.reuseport_server`): the kernel spreads new
connections over them, where processes sharing one socket take them as each wakes first."""

from __future__ import annotations

import socket

from bench.common import free_port
from bench.reuseport_server import listening


def test_connections_to_one_port_are_spread_over_every_socket_bound_to_it():
    port = free_port()
    sockets = [listening("127.0.0.1", port) for _ in range(2)]  # a second bind without SO_REUSEPORT fails
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
    assert sum(taken) == 64 and min(taken) >= 16, taken  # a hash of each connection's ports: about half each
