"""A fake OPA for fault tests: a small threaded HTTP server controlled byte by byte.

A real OPA answers well; the client must also survive everything else that can sit
at OPA's address (a wedged process, a proxy, an impostor, a half-written answer).
This server plays a scripted :class:`Reply` for each request path: bytes to send,
pauses between them, and how the connection ends (kept for the next request,
closed, reset, or held open without another byte). It never interprets what it
sends, so an answer can be malformed in any way a test can write down.

It listens only on 127.0.0.1 (an ephemeral port) or on a unix socket in a fresh
short folder under /tmp, and :meth:`FakeOPA.close` closes every socket and joins
every thread it started: the test suite turns ResourceWarnings and unhandled thread
exceptions into errors.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from tests.hang import HANG_SECONDS

Transport = Literal["tcp", "unix"]
TRANSPORTS: Final[tuple[Transport, ...]] = ("tcp", "unix")


class _Marker:
    """An action of a :class:`Reply` other than sending bytes or pausing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Hold the connection open, sending nothing more, until the server closes.
STALL: Final = _Marker("STALL")
#: Close the connection (a FIN): the client sees the answer end here.
CLOSE: Final = _Marker("CLOSE")
#: Abort the connection (an RST), as a crashed peer would.
RESET: Final = _Marker("RESET")

Action = bytes | float | _Marker


@dataclass(frozen=True)
class Reply:
    """What the fake does for one request, in order.

    ``bytes`` are sent, a ``float`` pauses that many seconds, and a marker ends the
    connection its way. A reply that ends without a marker keeps the connection
    for the client's next request (keep-alive), as OPA does.
    """

    actions: tuple[Action, ...]

    @classmethod
    def of(cls, *actions: Action) -> Reply:
        return cls(tuple(actions))


def response_head(
    status: int = 200,
    *,
    headers: Iterable[tuple[str, str]] = (("Content-Type", "application/json"),),
    version: str = "HTTP/1.1",
    reason: str = "Whatever",
) -> bytes:
    """A status line and header block, exactly as given (no header is added)."""
    lines = [f"{version} {status} {reason}", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def framed(
    body: bytes,
    status: int = 200,
    *,
    content_type: str | None = "application/json",
    extra_headers: Iterable[tuple[str, str]] = (),
    version: str = "HTTP/1.1",
) -> bytes:
    """A complete response with a correct Content-Length."""
    headers = [("Content-Length", str(len(body))), *extra_headers]
    if content_type is not None:
        headers.insert(0, ("Content-Type", content_type))
    return response_head(status, headers=headers, version=version) + body


def json_reply(document: Any, status: int = 200) -> Reply:
    """A well-framed JSON answer, kept alive like OPA's."""
    return Reply.of(framed(json.dumps(document).encode(), status))


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def trickle(data: bytes, every: float) -> tuple[Action, ...]:
    """``data`` one byte at a time, ``every`` seconds apart."""
    actions: list[Action] = []
    for byte in data:
        actions += [bytes([byte]), every]
    return tuple(actions)


NOT_FOUND: Final = json_reply({"code": "resource_not_found", "message": "no route"}, 404)


@dataclass(frozen=True)
class Seen:
    """One request the fake received: method, path, query string and headers."""

    method: str
    path: str
    query: str
    #: The header lines as sent, in order: (name as written, value).
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class _State:
    routes: dict[str, Reply] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    played: list[str] = field(default_factory=list)


class FakeOPA:
    """Serves scripted replies by path over TCP (127.0.0.1) or a unix socket.

    Use as a context manager. ``address`` is what PolicyClient and PolicySidecar
    take. :meth:`route` sets the reply for a path (without the query string), and
    :attr:`seen` lists every request received, :attr:`played` the paths of those whose
    reply was acted out to its end (not cut off by the client, nor by
    :meth:`close`). With ``accept=False`` the server
    listens but never accepts, so clients connect (the kernel queues them) and then
    wait for an answer that never comes.
    """

    def __init__(self, transport: Transport, *, accept: bool = True) -> None:
        self.transport = transport
        self._accept = accept
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._state = _State()
        self._threads: list[threading.Thread] = []
        self._folder: str | None = None
        # Every wait also watches this pair; close() writes one byte, never read, so
        # that every thread wakes at once instead of at its next poll.
        self._wake_r, self._wake_w = socket.socketpair()
        if transport == "tcp":
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind(("127.0.0.1", 0))
            port = self._listener.getsockname()[1]
            self.address = f"http://127.0.0.1:{port}"
        else:
            self._folder = tempfile.mkdtemp(prefix="capgate-fake-", dir="/tmp")
            path = os.path.join(self._folder, "opa.sock")
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(path)
            self.address = f"unix://{path}"
        self._listener.listen(16)
        self._start(self._accept_loop)

    # -- control -------------------------------------------------------------

    def route(self, path: str, reply: Reply) -> None:
        with self._lock:
            self._state.routes[path] = reply

    @property
    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._state.seen)

    @property
    def played(self) -> list[str]:
        with self._lock:
            return list(self._state.played)

    def close(self) -> None:
        """Stop, join every thread and close every socket; safe to call twice."""
        if not self._stop.is_set():
            self._stop.set()
            self._wake_w.send(b"x")
        # Every thread wakes at once, and must end: a hang bound, not a pace.
        deadline = time.monotonic() + HANG_SECONDS
        for thread in list(self._threads):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        if alive:
            raise RuntimeError(f"fake OPA threads did not stop: {alive}")

    def __enter__(self) -> FakeOPA:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- serving ---------------------------------------------------------------

    def _start(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        watched = [self._listener, self._wake_r] if self._accept else [self._wake_r]
        while True:
            ready, _, _ = select.select(watched, [], [])
            if self._stop.is_set():
                return
            if self._listener in ready:
                conn, _ = self._listener.accept()
                self._start(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buffer = b""
            try:
                while True:
                    request, buffer = self._read_request(conn, buffer)
                    if request is None:
                        return
                    with self._lock:
                        self._state.seen.append(request)
                        reply = self._state.routes.get(request.path, NOT_FOUND)
                    if not self._play(conn, request.path, reply):
                        return
            except OSError:
                return  # the client went away; nothing to report

    def _read_request(self, conn: socket.socket, buffer: bytes) -> tuple[Seen | None, bytes]:
        """One request (head and Content-Length body), or None when the client left."""
        while b"\r\n\r\n" not in buffer:
            data = self._recv(conn)
            if not data:
                return None, buffer
            buffer += data
        head, buffer = buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        length = 0
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers.append((name, value.strip()))
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(buffer) < length:
            data = self._recv(conn)
            if not data:
                return None, buffer
            buffer += data
        buffer = buffer[length:]
        path, _, query = target.partition("?")
        return Seen(method, path, query, tuple(headers)), buffer

    def _recv(self, conn: socket.socket) -> bytes:
        """Bytes from the client; b"" when it closed or the server is stopping."""
        select.select([conn, self._wake_r], [], [])
        if self._stop.is_set():
            return b""
        return conn.recv(65536)

    def _play(self, conn: socket.socket, path: str, reply: Reply) -> bool:
        """Act out ``reply`` (to ``path``); True if the connection stays open for another
        request."""
        kept = True
        for action in reply.actions:
            if isinstance(action, bytes):
                if not self._send(conn, action):
                    return False
            elif isinstance(action, float):
                if self._stop.wait(action):
                    return False
            elif action is STALL:
                self._stop.wait()
                return False
            elif action is CLOSE:
                kept = False
                break
            elif action is RESET:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                kept = False
                break
        with self._lock:
            self._state.played.append(path)
        return kept

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        """Send all of ``data`` unless the client leaves or the server stops."""
        view = memoryview(data)
        while view:
            select.select([self._wake_r], [conn], [])
            if self._stop.is_set():
                return False
            try:
                sent = conn.send(view[:65536])
            except OSError:
                return False
            view = view[sent:]
        return True


@contextmanager
def fake_opa(transport: Transport, routes: Mapping[str, Reply] | None = None) -> Iterator[FakeOPA]:
    """A running :class:`FakeOPA` with ``routes`` set, closed on exit."""
    with FakeOPA(transport) as server:
        for path, reply in (routes or {}).items():
            server.route(path, reply)
        yield server
