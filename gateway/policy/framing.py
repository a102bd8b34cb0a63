"""HTTP/1.1 framing for the policy client: the request as written, the answer as read.

:class:`AnswerReader` reads one answer from a :class:`Source` (a connection's
received bytes and a way to wait for more), and :func:`encode_request` writes one
request as one buffer. The transport (:mod:`capgate.gateway.policy.wire`) owns the
socket, the deadline and the pool; this module owns where an answer's head and body
begin and end, which is a security property: two readers that place an answer's end
differently can be made to take the tail of one answer for the next (response
splitting).

OPA answers the policy client with a short head and a body framed by its length, so
the parser here finds the end of the head in one search, checks each line with one
pattern, and takes the body from the same buffer. What an answer must be, or it is
refused with ``RemoteProtocolError`` (an answer whose end two readers could place
differently is no answer):

- a status line ``HTTP/1.1`` or ``HTTP/1.0``, a three-digit status and an optional
  reason; an interim ``100 Continue`` is skipped, as ``http.client`` did;
- a head of at most :data:`MAX_HEAD` bytes (stricter than ``http.client``'s
  65,536 bytes per line) and at most :data:`MAX_FIELDS` header lines, each
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

``tests/unit/test_opa_answer_parsing.py`` holds the parser to each rule byte by
byte, and ``tests/fuzz/test_answer_framing_properties.py`` to h11 as an oracle.

Why a parser of capgate's own, and not httptools (llhttp) or h11 under these rules
(issue 18; ``benchmarks/answer_readers.py`` measures it on every ``make bench``):
an answer reader on httptools with the rules above kept as checks around it passed
the same oracle properties and fault suites, but it read the decisions' answers
more slowly (about 1.5x this parser's CPU for an execute answer, 1.4x for compose,
where httptools with none of these checks costs about what this parser does, and
h11 with none of them about 8x), and it did not do the job: llhttp cannot be told
the request's method (HEAD), nor that the stream has ended (a body framed by the
close), and does not say where an answer ends, so capgate still had to find each
head's end, feed a Content-Length body exactly, and check that a chunked answer
ends the stream (llhttp skips empty lines after a message); it also lets a NUL
through in the reason phrase. The wrapper came out about as long as this parser,
with a subtler end-of-stream rule, so this parser stays, with the benchmark to say
when that changes.
"""

from __future__ import annotations

import re
from typing import Final, Protocol

import httpx

__all__ = ["CHUNK", "MAX_FIELDS", "MAX_HEAD", "AnswerReader", "Source", "encode_request"]

#: The most bytes received from the socket at once.
CHUNK: Final = 64 * 1024
#: The most bytes of an answer's head (status line, header lines and the empty line),
#: of a chunked body's trailer section, and of one chunk-size line.
MAX_HEAD: Final = 64 * 1024
#: The most header lines in a head, or trailer lines after a chunked body.
MAX_FIELDS: Final = 100
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


def _malformed(problem: str) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(f"malformed answer from OPA: {problem}")


class Source(Protocol):
    """Where an answer's bytes come from: one connection's."""

    #: Bytes received and not yet taken by a reader; what is left after an answer
    #: arrived beyond it.
    buffer: bytearray

    def receive(self) -> bool:
        """Append what the socket has (waiting for it) to the buffer; False at its end."""
        ...


# -- reading from the buffer ------------------------------------------------------


def _take(source: Source, most: int) -> bytes:
    """At most ``most`` bytes: those buffered, else one receive's; b"" at the end."""
    buffer = source.buffer
    if not buffer and not source.receive():
        return b""
    if len(buffer) <= most:
        piece = bytes(buffer)
        buffer.clear()
    else:
        piece = bytes(buffer[:most])
        del buffer[:most]
    return piece


def _find(source: Source, end: bytes, what: str) -> int:
    """Where the first ``end`` starts, received within :data:`MAX_HEAD` bytes."""
    buffer = source.buffer
    start = 0
    while (found := buffer.find(end, start, MAX_HEAD)) < 0:
        if len(buffer) >= MAX_HEAD:
            raise _malformed(f"{what} over {MAX_HEAD} bytes")
        start = max(0, len(buffer) - len(end) + 1)
        if not source.receive():
            raise _malformed(f"the connection closed within {what}")
    return found


def _line(source: Source, what: str) -> bytes:
    """The next line, without its CRLF."""
    end = _find(source, b"\r\n", what)
    line = bytes(source.buffer[:end])
    del source.buffer[: end + 2]
    return line


def _block(source: Source, what: str) -> list[bytes]:
    """The lines up to the next empty line (a head or trailers), without CRLFs."""
    end = _find(source, b"\r\n\r\n", what)
    block = bytes(source.buffer[:end])
    del source.buffer[: end + 4]
    return block.split(b"\r\n")


# -- an answer's head -----------------------------------------------------------


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """``name: value`` lines as pairs, or RemoteProtocolError for a malformed one."""
    if len(lines) > MAX_FIELDS:
        raise _malformed(f"more than {MAX_FIELDS} header lines")
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


# -- an answer ------------------------------------------------------------------


class AnswerReader:
    """One answer from ``source``, the answer to a ``method`` request.

    Reads the head when made (skipping an interim ``100 Continue``), then the body
    piece by piece under the head's framing through :meth:`read`. Every refusal is
    ``httpx.RemoteProtocolError``; socket errors and timeouts come from ``source``.
    """

    __slots__ = (
        "_chunked",
        "_left",
        "_source",
        "_until_close",
        "done",
        "fields",
        "http_version",
        "index",
        "keep_alive",
        "length",
        "status",
    )

    def __init__(self, source: Source, method: str) -> None:
        while True:
            lines = _block(source, "the answer's head")
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
        self._source = source
        self.status = status
        self.http_version = http_version
        #: The header lines in order, names as written and values without the spaces
        #: around them.
        self.fields = fields
        #: The values of each header, by lowercased name.
        self.index = index
        #: The body's length in bytes, or None when chunked or ended by the close.
        self.length = length
        self._chunked = chunked
        self._until_close = length is None and not chunked
        #: Whether the server lets the connection serve another request after this one.
        self.keep_alive = (
            status >= 200 and (length is not None or chunked) and _keeps_alive(http_version, index)
        )
        # Content-Length: bytes still to come; chunked: still to come in this chunk.
        self._left = length or 0
        #: The body has been read to its end.
        self.done = length == 0

    def get(self, name: bytes) -> str | None:
        """The header's values joined by commas (as ``http.client`` gave them), or None."""
        values = self.index.get(name)
        return None if values is None else b", ".join(values).decode("latin-1")

    @property
    def reusable(self) -> bool:
        """Read to its end, and the connection may serve the next request: the server
        lets it, and no byte beyond the answer has arrived."""
        return self.done and self.keep_alive and not self._source.buffer

    def read(self) -> bytes:
        """The next piece of the body, or b"" once it has been read to its end."""
        if self.done:
            return b""
        if self._chunked:
            return self._read_chunked()
        if self._until_close:
            piece = _take(self._source, CHUNK)
            self.done = not piece
            return piece
        piece = _take(self._source, self._left)
        if not piece:
            raise _malformed(f"the connection closed {self._left} bytes before the body's end")
        self._left -= len(piece)
        self.done = not self._left
        return piece

    def _read_chunked(self) -> bytes:
        source = self._source
        if not self._left:
            size_line = _chunk_line(_line(source, "a chunk-size line"))
            if size_line is None:
                raise _malformed("a malformed chunk-size line")
            self._left = int(size_line[1], 16)
            if not self._left:
                # Trailers: none (an empty line), or lines checked as a head's are.
                if _find(source, b"\r\n", "the trailers") == 0:
                    del source.buffer[:2]
                else:
                    _fields(_block(source, "the trailers"))
                self.done = True
                return b""
        piece = _take(source, self._left)
        if not piece:
            raise _malformed("the connection closed within a chunk")
        self._left -= len(piece)
        if not self._left and _line(source, "the end of a chunk"):
            raise _malformed("a chunk longer than its size")
        return piece


# -- a request ------------------------------------------------------------------


def encode_request(
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
