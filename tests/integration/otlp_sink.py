"""A stand-in OTLP/HTTP collector on 127.0.0.1: it answers 200 to ``POST /v1/traces``
and keeps each body, so a test can look for a trace id in what OPA exported.

The bodies are OTLP protobuf (``ExportTraceServiceRequest``); a span's trace id and
parent span id are raw bytes fields in it, so the test looks for those bytes instead
of decoding the message (no protobuf package needed).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OTLPSink", "otlp_sink"]


class OTLPSink:
    """The bodies of the exports received so far, and the ``host:port`` to send them."""

    def __init__(self, server: ThreadingHTTPServer, bodies: list[bytes]) -> None:
        self._server = server
        self._bodies = bodies

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def received(self) -> bytes:
        """Every export body so far, joined."""
        return b"".join(list(self._bodies))  # appended by the server's threads


@contextmanager
def otlp_sink() -> Iterator[OTLPSink]:
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            bodies.append(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield OTLPSink(server, bodies)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
