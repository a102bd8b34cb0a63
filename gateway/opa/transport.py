"""The policy client's HTTP/1.1 transport: the standard library's, held to one deadline.

:class:`DeadlineTransport` is an ``httpx.BaseTransport`` (so tests can swap in
``httpx.MockTransport``, and failures stay in httpx's error tree), but the
exchange itself is ``http.client`` over a socket of our own, not httpcore and
h11. Measured on the
authorised-call path (docs/benchmarks.md), httpcore's pool and h11's state machine
cost about a third of a millisecond per decision, as much again as OPA's
evaluation; ``http.client`` sends a request's head and body in one write and parses
the answer's head in C-backed code. :meth:`DeadlineTransport.exchange` is the same
exchange without httpx's request and response objects, the body read whole under a
size cap and gzip-inflated under the same cap: the policy client's path for
decisions.

What is kept from the httpcore transport it replaces, and tested by the fault
suites (``tests/integration/test_fake_opa.py``, ``test_opa_faults.py``):

- one deadline for the whole exchange: every connect, send and receive is held to
  the time left before :data:`DEADLINE` (a context variable the client sets per
  request), so a server trickling bytes cannot hold a call past it;
- every failure is an httpx exception (``ConnectError``, ``ConnectTimeout``,
  ``ReadTimeout``, ``WriteTimeout``, ``ReadError``, ``WriteError``,
  ``RemoteProtocolError``), which the client turns into ``PolicyUnavailable``;
- keep-alive connections, reused only when the last answer was read to its end and
  the server did not close or write out of turn, and closed after
  ``keepalive_expiry`` idle seconds; a socket is closed whenever connecting fails.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

import httpx

__all__ = ["DEADLINE", "Answer", "AnswerTooLarge", "DeadlineTransport"]

#: The absolute time (``time.monotonic()``) by which the answer being read must be
#: complete, or None outside a request. Set per request by the policy client; a
#: context variable because one client, and so one pool, may serve several threads
#: at once, each with its own request and its own deadline.
DEADLINE: ContextVar[float | None] = ContextVar("capgate_opa_deadline", default=None)

# The most bytes read from the socket at once for a body.
_CHUNK: Final = 64 * 1024


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

    ``http.client`` reads through ``makefile()``, which calls ``recv_into`` on this
    object, and writes with ``sendall``: both are clamped here, per call, so the
    exchange shares one deadline whatever the server does. Writes are held until
    the first receive and then sent at once: ``http.client`` writes a request's head
    and body separately, and two sends cost OPA two wake-ups for one question. A
    client sends its whole request before it reads, so nothing waits on held bytes.
    """

    read_timeout: float | None = None
    write_timeout: float | None = None
    held: list[bytes]

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0, flags: int = 0) -> int:  # type: ignore[override]
        if self.held:
            self._send_held()
        self.settimeout(time_left(self.read_timeout, httpx.ReadTimeout))
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out reading OPA's answer") from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    def sendall(self, data: bytes | bytearray | memoryview, flags: int = 0) -> None:  # type: ignore[override]
        time_left(self.write_timeout, httpx.WriteTimeout)  # past the deadline: fail now
        self.held.append(bytes(data))

    def _send_held(self) -> None:
        view = memoryview(b"".join(self.held))
        self.held = []
        while view:
            self.settimeout(time_left(self.write_timeout, httpx.WriteTimeout))
            try:
                sent = self.send(view)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "timed out sending to OPA") from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc) or type(exc).__name__) from exc
            view = view[sent:]


class _Connection(http.client.HTTPConnection):
    """``http.client``'s connection over a :class:`_DeadlineSocket`, TCP or unix."""

    def __init__(
        self, host: str, port: int | None, uds: str | None, connect_timeout: float
    ) -> None:
        super().__init__(host, port)
        self._uds = uds
        self._connect_timeout = connect_timeout
        self.idle_since = time.monotonic()

    def connect(self) -> None:
        family = socket.AF_UNIX if self._uds is not None else socket.AF_INET
        if self._uds is None and ":" in self.host:
            family = socket.AF_INET6
        sock = _DeadlineSocket(family, socket.SOCK_STREAM)
        sock.held = []
        try:
            sock.settimeout(time_left(self._connect_timeout, httpx.ConnectTimeout))
            sock.connect(self._uds if self._uds is not None else (self.host, self.port))
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


class _Body(httpx.SyncByteStream):
    """The answer's body as httpx reads it; gives the connection back once read whole."""

    def __init__(
        self,
        response: http.client.HTTPResponse,
        connection: _Connection,
        release: DeadlineTransport,
    ) -> None:
        self._response = response
        self._connection = connection
        self._release = release
        self._done = False

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                chunk = self._response.read1(_CHUNK)
                if not chunk:
                    break
                yield chunk
            if self._response.length:  # http.client ends a short body quietly
                raise http.client.IncompleteRead(b"", self._response.length)
        except httpx.TransportError:
            self._fail()
            raise
        except (http.client.HTTPException, ValueError) as exc:
            self._fail()
            raise httpx.RemoteProtocolError(f"malformed answer body: {type(exc).__name__}") from exc
        except OSError as exc:
            self._fail()
            raise httpx.ReadError(str(exc)) from exc
        self._finish()

    def _fail(self) -> None:
        self._done = True
        self._connection.close()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self._response.close()
        if self._response.will_close:
            self._connection.close()
        else:
            self._release.release(self._connection)

    def close(self) -> None:
        # Not read to its end (a size cap, an error): the connection is unusable.
        if not self._done:
            self._fail()


def _framing_problem(response: http.client.HTTPResponse) -> str | None:
    """What makes the answer's length ambiguous, as h11 would refuse it, or None.

    ``http.client`` reads the first of two Content-Length headers and ignores one it
    cannot parse; an answer whose end two readers could place differently is no
    answer.
    """
    lengths = response.headers.get_all("Content-Length") or []
    if len(lengths) > 1:
        return "more than one Content-Length"
    if lengths and not lengths[0].strip().isdigit():
        return "a Content-Length that is not a number"
    if lengths and response.headers.get("Transfer-Encoding") is not None:
        return "both Content-Length and Transfer-Encoding"
    return None


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


def _http_version(response: http.client.HTTPResponse) -> str:
    return {10: "HTTP/1.0", 11: "HTTP/1.1"}.get(response.version, "HTTP/0.9")


def _read_whole(
    response: http.client.HTTPResponse,
    connection: _Connection,
    transport: DeadlineTransport,
    max_bytes: int,
) -> bytes:
    """The body to its end, at most ``max_bytes``; gives the connection back after."""
    body = _Body(response, connection, transport)
    declared = response.getheader("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        body.close()
        raise AnswerTooLarge
    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in body:
            size += len(chunk)
            if size > max_bytes:
                raise AnswerTooLarge
            chunks.append(chunk)
    finally:
        body.close()  # a no-op once read to the end; else the connection is dropped
    return b"".join(chunks)


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

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        connection, response = self._begin(
            request.method,
            url.host,
            url.port,
            url.raw_path.decode("ascii"),
            request.headers.raw,
            request.read() or None,
            timeouts,
        )
        return httpx.Response(
            response.status,
            headers=response.getheaders(),
            stream=_Body(response, connection, self),
            extensions={"http_version": _http_version(response).encode()},
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
        connection, response = self._begin(
            method, url.host, url.port, url.raw_path.decode("ascii"), headers, body, timeouts
        )
        encoding = response.getheader("Content-Encoding")
        received = _read_whole(response, connection, self, max_bytes)
        if encoding is not None and encoding.strip().lower() == "gzip":
            received = _gunzip(received, max_bytes)
        return Answer(
            response.status,
            _http_version(response),
            response.getheader("Content-Type"),
            encoding,
            received,
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
    ) -> tuple[_Connection, http.client.HTTPResponse]:
        """Send one request and read the answer's head; the body is the caller's to read."""
        if self._closed:
            raise httpx.ConnectError("the policy client's transport is closed")
        connection = self._take(host, port, timeouts.get("connect") or 5.0)
        try:
            if connection.sock is None:
                connection.connect()
            sock = connection.sock
            assert isinstance(sock, _DeadlineSocket)
            sock.read_timeout = timeouts.get("read")
            sock.write_timeout = timeouts.get("write")
            connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                connection.putheader(name, value)
            connection.endheaders(body)
            response = connection.getresponse()
        except httpx.TransportError:
            connection.close()
            raise
        except (http.client.HTTPException, ValueError) as exc:
            connection.close()
            raise httpx.RemoteProtocolError(
                f"malformed answer from OPA: {type(exc).__name__}"
            ) from exc
        except OSError as exc:
            connection.close()
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            connection.close()
            raise
        problem = _framing_problem(response)
        if problem is not None:
            connection.close()
            raise httpx.RemoteProtocolError(f"malformed answer from OPA: {problem}")
        return connection, response

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
