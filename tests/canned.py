"""A local HTTP server with one canned answer to every GET and POST (a redirect elsewhere, a login
portal's page, a server that would accept anything), keeping each request's method, path and headers:
what the agent's and the CLI's redirect tests point them at, and where a redirect would lead."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Canned:
    def __init__(self, status: int = 200, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._answer()

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._answer()

            def _answer(self) -> None:
                canned.requests.append((self.command, self.path, dict(self.headers)))
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
