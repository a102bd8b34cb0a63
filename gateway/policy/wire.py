"""The policy client's HTTP/1.1 transport: a small, strict exchange held to one deadline.

:class:`DeadlineTransport` is an ``httpx.BaseTransport`` (so tests can swap in
``httpx.MockTransport``, and failures stay in httpx's error tree), but the exchange
itself is capgate's own: a request written in one send over a socket of our own, and
the answer read by :class:`~capgate.gateway.policy.framing.AnswerReader`, not by
httpcore and h11 nor by ``http.client``. Measured on the authorised-call path
(docs/benchmarks.md), httpcore's pool and h11's state machine cost about a third of
a millisecond per decision, as much again as OPA's evaluation. ``http.client``,
which replaced them, still spent a large share of a decision's Python time building
and parsing the answer's head with the ``email`` package (a feed parser, a message
object and a header policy per answer), validating each request header in turn, and
wrapping the socket in a new file for every answer. :meth:`DeadlineTransport.exchange`
is an exchange without httpx's request and response objects, the body read whole
under a size cap and gzip-inflated under the same cap: the policy client's path for
decisions. :meth:`DeadlineTransport.handle_request` reads through the same reader,
so each framing rule (:mod:`capgate.gateway.policy.framing`, which also says why
that reader is not httptools) is written once.

What is kept from the httpcore transport this replaced, and tested by the fault
suites (``tests/integration/test_fake_opa.py``, ``test_opa_faults.py``):

- one deadline for the whole exchange: every connect, send and receive is held to
  the time left before :data:`DEADLINE` (a context variable the client sets per
  request), so a server trickling bytes cannot hold a call past it;
- every failure is an httpx exception (``ConnectError``, ``ConnectTimeout``,
  ``ReadTimeout``, ``WriteTimeout``, ``ReadError``, ``WriteError``,
  ``RemoteProtocolError``, and ``LocalProtocolError`` for a request that cannot be
  written, such as a header value with a line break), which the client turns into
  ``PolicyUnavailable``;
- keep-alive connections, reused only when the reader says the answer left the
  connection clean, and closed after ``keepalive_expiry`` idle seconds or once the
  server writes while one is idle (a closed connection, or bytes out of turn); a
  socket is closed whenever connecting fails.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

import httpx

from capgate.gateway.policy.framing import CHUNK, AnswerReader, encode_request

__all__ = ["DEADLINE", "Answer", "AnswerTooLarge", "DeadlineTransport"]

#: The absolute time (``time.monotonic()``) by which the answer being read must be
#: complete, or None outside a request. Set per request by the policy client; a
#: context variable because one client, and so one pool, may serve several threads
#: at once, each with its own request and its own deadline.
DEADLINE: ContextVar[float | None] = ContextVar("capgate_opa_deadline", default=None)


def time_left(timeout: float | None, expired: type[httpx.TimeoutException]) -> float | None:
    """``timeout`` clamped to what is left before the current request's deadline.

    Raises ``expired`` once the deadline has passed, so no further byte is waited for.
    """
    deadline = DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the deadline for this OPA answer has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineSocket(socket.socket):
    """A socket whose every receive and send waits at most until the deadline.

    :class:`_Connection` reads only through ``recv_into`` and writes only through
    ``sendall``: both are clamped here, per call, so the exchange shares one
    deadline whatever the server does, and socket errors leave as httpx's.
    """

    read_timeout: float | None = None
    write_timeout: float | None = None

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0, flags: int = 0) -> int:  # type: ignore[override]
        self.settimeout(time_left(self.read_timeout, httpx.ReadTimeout))
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out reading OPA's answer") from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    def sendall(self, data: bytes | bytearray | memoryview, flags: int = 0) -> None:  # type: ignore[override]
        view = memoryview(data)
        while view:
            self.settimeout(time_left(self.write_timeout, httpx.WriteTimeout))
            try:
                sent = self.send(view, flags)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "timed out sending to OPA") from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
            view = view[sent:]


class _Connection:
    """One connection to OPA, TCP or unix: a :class:`_DeadlineSocket` and the bytes
    received from it that the reader has not taken yet (a
    :class:`~capgate.gateway.policy.framing.Source`).

    Every byte is received through the socket's ``recv_into``, so the deadline holds
    for each read; the buffer lives as long as the connection, so a byte received
    beyond an answer is seen (and the connection dropped) rather than lost.
    """

    def __init__(
        self, host: str, port: int | None, uds: str | None, connect_timeout: float
    ) -> None:
        self.host = host
        self.port = port
        self._uds = uds
        self._connect_timeout = connect_timeout
        self.sock: _DeadlineSocket | None = None
        self.buffer = bytearray()
        self._space = memoryview(bytearray(0))
        self.idle_since = time.monotonic()

    def connect(self) -> None:
        family = socket.AF_UNIX if self._uds is not None else socket.AF_INET
        if self._uds is None and ":" in self.host:
            family = socket.AF_INET6
        sock = _DeadlineSocket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(time_left(self._connect_timeout, httpx.ConnectTimeout))
            port = 80 if self.port is None else self.port  # http://host: port 80
            sock.connect(self._uds if self._uds is not None else (self.host, port))
            if family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except TimeoutError as exc:
            sock.close()
            raise httpx.ConnectTimeout(str(exc) or "timed out connecting to OPA") from exc
        except OSError as exc:
            sock.close()
            raise httpx.ConnectError(str(exc)) from exc
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self._space = memoryview(bytearray(CHUNK))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buffer.clear()

    def is_reusable(self, expiry: float) -> bool:
        """Idle for less than ``expiry`` seconds, and the server has not written since
        (a readable idle socket is a closed one, or one holding bytes out of turn)."""
        if self.sock is None or time.monotonic() - self.idle_since > expiry:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def receive(self) -> bool:
        """Append what the socket has (waiting for it) to the buffer; False at its end."""
        if self.sock is None:
            return False
        received = self.sock.recv_into(self._space)
        self.buffer += self._space[:received]
        return received > 0


# -- the transport --------------------------------------------------------------


class _Body(httpx.SyncByteStream):
    """The answer's body as httpx reads it; gives the connection back once read whole."""

    def __init__(
        self, reader: AnswerReader, connection: _Connection, owner: DeadlineTransport
    ) -> None:
        self._reader = reader
        self._connection = connection
        self._owner = owner
        self._done = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            while piece := self._reader.read():
                yield piece
        except BaseException:  # an httpx error, or the reader stopping early
            self.close()
            raise
        if not self._done:
            self._done = True
            self._owner.finish(self._connection, self._reader)

    def close(self) -> None:
        # Not read to its end (a size cap, an error): the connection is unusable.
        if not self._done:
            self._done = True
            self._connection.close()


@dataclass(frozen=True)
class Answer:
    """A whole answer read by :meth:`DeadlineTransport.exchange`.

    ``body`` is decoded when ``content_encoding`` is gzip, else as received.
    """

    status: int
    http_version: str
    content_type: str | None
    content_encoding: str | None
    body: bytes


class AnswerTooLarge(Exception):
    """The answer's body, received or decoded, is over the caller's size cap."""


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    """``data`` inflated, refusing more than ``max_bytes`` of output (a gzip bomb)."""
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise httpx.DecodingError(f"malformed gzip answer: {exc}") from exc
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise AnswerTooLarge
    if not inflater.eof or inflater.unused_data:
        raise httpx.DecodingError("malformed gzip answer: truncated or trailing bytes")
    return out


class DeadlineTransport(httpx.BaseTransport):
    """HTTP/1.1 to one loopback OPA (TCP ``host:port`` or a unix socket ``uds``).

    Thread-safe: idle keep-alive connections wait in a list behind a lock; a request
    takes one (or opens one), and gives it back when its answer was read whole.
    Requests carry httpx's timeout extension (connect, read, write), clamped to
    :data:`DEADLINE`.
    """

    def __init__(
        self,
        *,
        uds: str | None = None,
        max_idle: int = 20,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self._uds = uds
        self._max_idle = max_idle
        self._expiry = keepalive_expiry
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _take(self, host: str, port: int | None, connect_timeout: float) -> _Connection:
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if connection.is_reusable(self._expiry):
                    return connection
                connection.close()
        return _Connection(host, port, self._uds, connect_timeout)

    def release(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(connection)
                return
        connection.close()

    def finish(self, connection: _Connection, reader: AnswerReader) -> None:
        """After a body read to its end: keep the connection, or close it (the server
        asked to, or a byte beyond the answer has already arrived)."""
        if reader.reusable:
            self.release(connection)
        else:
            connection.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        connection, reader = self._begin(
            request.method,
            url.host,
            url.port,
            url.raw_path.decode("ascii"),
            request.headers.raw,
            request.read() or None,
            timeouts,
        )
        return httpx.Response(
            reader.status,
            headers=reader.fields,
            stream=_Body(reader, connection, self),
            extensions={"http_version": reader.http_version.encode()},
        )

    def exchange(
        self,
        method: str,
        url: httpx.URL,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeouts: Mapping[str, float | None],
        max_bytes: int,
    ) -> Answer:
        """One whole exchange, without building httpx's request and response models.

        The policy client's hot path: the same connection handling, deadline and
        failures as :meth:`handle_request` (every failure an httpx exception), the
        body read whole and gzip-decoded here, and :class:`AnswerTooLarge` once more
        than ``max_bytes`` arrive, compressed or not. ``headers`` are sent as given,
        in order; Host and Content-Length are the caller's to include.
        """
        connection, reader = self._begin(
            method, url.host, url.port, url.raw_path.decode("ascii"), headers, body, timeouts
        )
        try:
            if reader.length is not None and reader.length > max_bytes:
                raise AnswerTooLarge
            pieces: list[bytes] = []
            size = 0
            while piece := reader.read():
                size += len(piece)
                if size > max_bytes:
                    raise AnswerTooLarge
                pieces.append(piece)
        except BaseException:  # not read to its end: the connection is unusable
            connection.close()
            raise
        self.finish(connection, reader)
        received = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        encoding = reader.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() == "gzip":
            received = _gunzip(received, max_bytes)
        return Answer(
            reader.status, reader.http_version, reader.get(b"content-type"), encoding, received
        )

    def _begin(
        self,
        method: str,
        host: str,
        port: int | None,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeouts: Mapping[str, float | None],
    ) -> tuple[_Connection, AnswerReader]:
        """Send one request and read the answer's head; the body is the caller's to read."""
        if self._closed:
            raise httpx.ConnectError("the policy client's transport is closed")
        sent = encode_request(method, target, headers, body)
        connection = self._take(host, port, timeouts.get("connect") or 5.0)
        try:
            if connection.sock is None:
                connection.connect()
            sock = connection.sock
            assert sock is not None
            sock.read_timeout = timeouts.get("read")
            sock.write_timeout = timeouts.get("write")
            sock.sendall(sent)
            reader = AnswerReader(connection, method)
        except OSError as exc:  # the socket maps its own; this is a last resort
            connection.close()
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            connection.close()
            raise
        return connection, reader

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
