"""The policy client's HTTP/1.1 transport: a small, strict exchange held to one deadline.

:class:`DeadlineTransport` is an ``httpx.BaseTransport`` (so tests can swap in
``httpx.MockTransport``, and failures stay in httpx's error tree), but the exchange
itself is capgate's own: a request written in one send over a socket of our own, and
the answer read by the small parser below, not by httpcore and h11 nor by
``http.client``. Measured on the authorised-call path (docs/benchmarks.md),
httpcore's pool and h11's state machine cost about a third of a millisecond per
decision, as much again as OPA's evaluation. ``http.client``, which replaced them,
still spent a large share of a decision's Python time building and parsing the
answer's head with the ``email`` package (a feed parser, a message object and a
header policy per answer), validating each request header in turn, and wrapping
the socket in a new file for every answer. OPA answers the policy client with a
short head and a body framed by its length, so the parser here finds the end of the
head in one search, checks each line with one pattern, and takes the body from the
same buffer. :meth:`DeadlineTransport.exchange` is an exchange without httpx's
request and response objects, the body read whole under a size cap and
gzip-inflated under the same cap: the policy client's path for decisions.
:meth:`DeadlineTransport.handle_request` reads through the same parser, so each
framing rule below is written once.

What an answer must be, or it is refused with ``RemoteProtocolError`` (an answer
whose end two readers could place differently is no answer):

- a status line ``HTTP/1.1`` or ``HTTP/1.0``, a three-digit status and an optional
  reason; an interim ``100 Continue`` is skipped, as ``http.client`` did;
- a head of at most :data:`_MAX_HEAD` bytes (stricter than ``http.client``'s
  65,536 bytes per line) and at most :data:`_MAX_FIELDS` header lines, each
  ``name: value`` with a token for a name, no space before the colon, no line
  folding, no control character but tab, every line ended by CRLF;
- no body for HEAD, 1xx, 204 and 304; otherwise a body framed by
  ``Transfer-Encoding: chunked`` (no other transfer coding; hex chunk sizes,
  extensions ignored, each chunk's data followed by CRLF, trailers bounded as a head
  is and ignored), or by one ``Content-Length`` of digits only (not beside a
  Transfer-Encoding), or, with neither, by the server closing the connection;
- a connection is kept for the next request only when the answer was read to its
  end, no byte beyond it has arrived, the body was not framed by the close, and
  the server did not ask to close (HTTP/1.1 without ``Connection: close``, or
  HTTP/1.0 with ``Connection: keep-alive``).

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
- keep-alive connections, reused only as above, and closed after
  ``keepalive_expiry`` idle seconds or once the server writes while one is idle (a
  closed connection, or bytes out of turn); a socket is closed whenever connecting
  fails.
"""

from __future__ import annotations

import re
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

# The most bytes received from the socket at once.
_CHUNK: Final = 64 * 1024
# The most bytes of an answer's head (status line, header lines and the empty line),
# of a chunked body's trailer section, and of one chunk-size line.
_MAX_HEAD: Final = 64 * 1024
# The most header lines in a head, or trailer lines after a chunked body.
_MAX_FIELDS: Final = 100
# The most digits of a Content-Length (h11's bound; far above any size cap).
_MAX_LENGTH_DIGITS: Final = 20

_TOKEN: Final = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
# Visible characters, spaces and tabs: no CR, LF, NUL or other control character.
_TEXT: Final = rb"[\t\x20-\x7e\x80-\xff]*"
_is_token = re.compile(_TOKEN).fullmatch
_is_text = re.compile(_TEXT).fullmatch
_is_target = re.compile(rb"[\x21-\x7e]+").fullmatch
_status_line = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: " + _TEXT + rb")?").fullmatch
# A name, a colon, then the value with its surrounding spaces (stripped after).
_field_line = re.compile(b"(" + _TOKEN + b"):(" + _TEXT + b")").fullmatch
# A chunk size in hex, then spaces and extensions, which change nothing here.
_chunk_line = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;" + _TEXT + rb")?").fullmatch


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


def _malformed(problem: str) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(f"malformed answer from OPA: {problem}")


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
    received from it that the parser has not taken yet.

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
        self._space = memoryview(bytearray(_CHUNK))

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

    # -- reading ---------------------------------------------------------------

    def receive(self) -> bool:
        """Append what the socket has (waiting for it) to the buffer; False at its end."""
        if self.sock is None:
            return False
        received = self.sock.recv_into(self._space)
        self.buffer += self._space[:received]
        return received > 0

    def take(self, most: int) -> bytes:
        """At most ``most`` bytes: those buffered, else one receive's; b"" at the end."""
        buffer = self.buffer
        if not buffer and not self.receive():
            return b""
        if len(buffer) <= most:
            piece = bytes(buffer)
            buffer.clear()
        else:
            piece = bytes(buffer[:most])
            del buffer[:most]
        return piece

    def find(self, end: bytes, what: str) -> int:
        """Where the first ``end`` starts, received within :data:`_MAX_HEAD` bytes."""
        buffer = self.buffer
        start = 0
        while (found := buffer.find(end, start, _MAX_HEAD)) < 0:
            if len(buffer) >= _MAX_HEAD:
                raise _malformed(f"{what} over {_MAX_HEAD} bytes")
            start = max(0, len(buffer) - len(end) + 1)
            if not self.receive():
                raise _malformed(f"the connection closed within {what}")
        return found

    def line(self, what: str) -> bytes:
        """The next line, without its CRLF."""
        end = self.find(b"\r\n", what)
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 2]
        return line

    def block(self, what: str) -> list[bytes]:
        """The lines up to the next empty line (a head or trailers), without CRLFs."""
        end = self.find(b"\r\n\r\n", what)
        block = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        return block.split(b"\r\n")


# -- an answer's head -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Head:
    """An answer's status line and header lines, and how its body is framed."""

    status: int
    http_version: str
    #: The header lines in order, names as written and values without the spaces
    #: around them.
    fields: list[tuple[bytes, bytes]]
    #: The values of each header, by lowercased name.
    index: dict[bytes, list[bytes]]
    #: The body's length in bytes, or None when chunked or ended by the close.
    length: int | None
    chunked: bool
    #: Whether the server lets the connection serve another request after this one.
    keep_alive: bool

    def get(self, name: bytes) -> str | None:
        """The header's values joined by commas (as ``http.client`` gave them), or None."""
        values = self.index.get(name)
        return None if values is None else b", ".join(values).decode("latin-1")


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """``name: value`` lines as pairs, or RemoteProtocolError for a malformed one."""
    if len(lines) > _MAX_FIELDS:
        raise _malformed(f"more than {_MAX_FIELDS} header lines")
    fields: list[tuple[bytes, bytes]] = []
    for line in lines:
        match = _field_line(line)
        if match is None:  # a line folded, a space before the colon, a control byte
            raise _malformed("a malformed header line")
        fields.append((match[1], match[2].strip(b" \t")))
    return fields


def _framing(method: str, status: int, index: dict[bytes, list[bytes]]) -> int | None:
    """The body's length, 0 for none, or None when chunked or ended by the close.

    Refuses what two readers could frame differently: two Content-Lengths, one
    that is not a number, one beside a Transfer-Encoding, a transfer coding other
    than chunked (which we could not read). ``http.client`` took the first of two
    Content-Lengths and read the body of an unknown coding to the close.
    """
    lengths = index.get(b"content-length")
    codings = index.get(b"transfer-encoding")
    if lengths is not None:
        if len(lengths) > 1:
            raise _malformed("more than one Content-Length")
        if not lengths[0].isdigit() or len(lengths[0]) > _MAX_LENGTH_DIGITS:
            raise _malformed("a Content-Length that is not a number")
        if codings is not None:
            raise _malformed("both Content-Length and Transfer-Encoding")
    if codings is not None and (len(codings) > 1 or codings[0].lower() != b"chunked"):
        raise _malformed("a Transfer-Encoding other than chunked")
    if method == "HEAD" or status < 200 or status in (204, 304):
        return 0
    if lengths is not None:
        return int(lengths[0])
    return None


def _keeps_alive(http_version: str, index: dict[bytes, list[bytes]]) -> bool:
    """Whether the server lets the connection serve another request (RFC 9112 9.3)."""
    options = {
        option.strip().lower()
        for value in index.get(b"connection", ())
        for option in value.split(b",")
    }
    if b"close" in options:
        return False
    return http_version == "HTTP/1.1" or b"keep-alive" in options


def _read_head(connection: _Connection, method: str) -> _Head:
    """The answer's head, skipping an interim ``100 Continue``."""
    while True:
        lines = connection.block("the answer's head")
        status_line = _status_line(lines[0])
        if status_line is None:
            raise _malformed("a malformed status line")
        fields = _fields(lines[1:])
        status = int(status_line[2])
        if status != 100:
            break
    http_version = "HTTP/1.1" if status_line[1] == b"1" else "HTTP/1.0"
    index: dict[bytes, list[bytes]] = {}
    for name, value in fields:
        index.setdefault(name.lower(), []).append(value)
    length = _framing(method, status, index)
    chunked = length is None and b"transfer-encoding" in index
    keep_alive = (
        status >= 200 and (length is not None or chunked) and _keeps_alive(http_version, index)
    )
    return _Head(status, http_version, fields, index, length, chunked, keep_alive)


# -- an answer's body -----------------------------------------------------------


class _BodyReader:
    """One answer's body, piece by piece, under its head's framing."""

    def __init__(self, connection: _Connection, head: _Head) -> None:
        self._connection = connection
        self._chunked = head.chunked
        self._until_close = head.length is None and not head.chunked
        # Content-Length: bytes still to come; chunked: still to come in this chunk.
        self._left = head.length or 0
        #: The body has been read to its end.
        self.done = head.length == 0

    def read(self) -> bytes:
        """The next piece of the body, or b"" once it has been read to its end."""
        if self.done:
            return b""
        if self._chunked:
            return self._read_chunked()
        if self._until_close:
            piece = self._connection.take(_CHUNK)
            self.done = not piece
            return piece
        piece = self._connection.take(self._left)
        if not piece:
            raise _malformed(f"the connection closed {self._left} bytes before the body's end")
        self._left -= len(piece)
        self.done = not self._left
        return piece

    def _read_chunked(self) -> bytes:
        connection = self._connection
        if not self._left:
            size_line = _chunk_line(connection.line("a chunk-size line"))
            if size_line is None:
                raise _malformed("a malformed chunk-size line")
            self._left = int(size_line[1], 16)
            if not self._left:
                # Trailers: none (an empty line), or lines checked as a head's are.
                if connection.find(b"\r\n", "the trailers") == 0:
                    del connection.buffer[:2]
                else:
                    _fields(connection.block("the trailers"))
                self.done = True
                return b""
        piece = connection.take(self._left)
        if not piece:
            raise _malformed("the connection closed within a chunk")
        self._left -= len(piece)
        if not self._left and connection.line("the end of a chunk"):
            raise _malformed("a chunk longer than its size")
        return piece


# -- a request ------------------------------------------------------------------


def _request(
    method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes | None
) -> bytes:
    """The request as sent: one buffer, so one write (OPA wakes once per question).

    Refuses, as ``http.client`` did, what would not be one well-formed request: a
    line break in a header value would let a caller's value write headers of its own.
    """
    try:
        method_bytes, target_bytes = method.encode("ascii"), target.encode("ascii")
    except UnicodeEncodeError:
        method_bytes = target_bytes = b""
    if not (_is_token(method_bytes) and _is_target(target_bytes)):
        raise httpx.LocalProtocolError(f"a request that cannot be sent: {method} {target!r}")
    parts = [method_bytes, b" ", target_bytes, b" HTTP/1.1\r\n"]
    for name, value in headers:
        if not (_is_token(name) and _is_text(value)):
            raise httpx.LocalProtocolError(f"a request header that cannot be sent: {name!r}")
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    if body:
        parts.append(body)
    return b"".join(parts)


# -- the transport --------------------------------------------------------------


class _Body(httpx.SyncByteStream):
    """The answer's body as httpx reads it; gives the connection back once read whole."""

    def __init__(
        self, reader: _BodyReader, connection: _Connection, head: _Head, owner: DeadlineTransport
    ) -> None:
        self._reader = reader
        self._connection = connection
        self._head = head
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
            self._owner.finish(self._connection, self._head)

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

    def finish(self, connection: _Connection, head: _Head) -> None:
        """After a body read to its end: keep the connection, or close it (the server
        asked to, or a byte beyond the answer has already arrived)."""
        if head.keep_alive and not connection.buffer:
            self.release(connection)
        else:
            connection.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        connection, head = self._begin(
            request.method,
            url.host,
            url.port,
            url.raw_path.decode("ascii"),
            request.headers.raw,
            request.read() or None,
            timeouts,
        )
        return httpx.Response(
            head.status,
            headers=head.fields,
            stream=_Body(_BodyReader(connection, head), connection, head, self),
            extensions={"http_version": head.http_version.encode()},
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
        connection, head = self._begin(
            method, url.host, url.port, url.raw_path.decode("ascii"), headers, body, timeouts
        )
        try:
            if head.length is not None and head.length > max_bytes:
                raise AnswerTooLarge
            reader = _BodyReader(connection, head)
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
        self.finish(connection, head)
        received = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        encoding = head.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() == "gzip":
            received = _gunzip(received, max_bytes)
        return Answer(head.status, head.http_version, head.get(b"content-type"), encoding, received)

    def _begin(
        self,
        method: str,
        host: str,
        port: int | None,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        timeouts: Mapping[str, float | None],
    ) -> tuple[_Connection, _Head]:
        """Send one request and read the answer's head; the body is the caller's to read."""
        if self._closed:
            raise httpx.ConnectError("the policy client's transport is closed")
        request = _request(method, target, headers, body)
        connection = self._take(host, port, timeouts.get("connect") or 5.0)
        try:
            if connection.sock is None:
                connection.connect()
            sock = connection.sock
            assert sock is not None
            sock.read_timeout = timeouts.get("read")
            sock.write_timeout = timeouts.get("write")
            sock.sendall(request)
            head = _read_head(connection, method)
        except OSError as exc:  # the socket maps its own; this is a last resort
            connection.close()
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            connection.close()
            raise
        return connection, head

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
