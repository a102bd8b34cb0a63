"""An answer read by httptools (llhttp, strict by default), with capgate's own
strictness as checks around it: the same interface as
:class:`capgate.gateway.policy.framing.AnswerReader`, measured against it.

llhttp parses the status line, the header lines and the body's framing. Around it:

- the head is found first (the first CRLF CRLF, within :data:`MAX_HEAD` bytes) and
  exactly its bytes are fed, so llhttp and capgate must agree on where it ends;
- a Content-Length body is fed exactly its length, so a byte beyond the answer stays
  in the connection's buffer and the connection is dropped;
- a chunked body is fed as received; what llhttp would read past its end starts
  another message (refused) or is an empty line, which llhttp skips silently: the
  stream must then end exactly with the body's last line;
- refused as the hand-written parser refuses them, where llhttp accepts them: HTTP
  versions other than 1.0 and 1.1, a transfer coding other than one ``chunked``,
  a Content-Length of more than 20 digits, more than :data:`MAX_FIELDS` header or
  trailer lines, trailers over :data:`MAX_HEAD` bytes, an answer to HEAD (llhttp
  cannot be told the request's method);
- a body framed by the close ends at the close (httptools cannot tell llhttp).
"""

from __future__ import annotations

import re
from typing import Final

import httptools
import httpx

from capgate.gateway.policy.framing import CHUNK, MAX_FIELDS, MAX_HEAD, Source

__all__ = ["LlhttpAnswerReader"]

_MAX_LENGTH_DIGITS: Final = 20
_LINE_ENDS: Final = b"\r\n"
# Visible characters, spaces and tabs: no CR, LF, NUL or other control character.
_is_text = re.compile(rb"[\t\x20-\x7e\x80-\xff]*").fullmatch


def _malformed(problem: str) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(f"malformed answer from OPA: {problem}")


class _Beyond(Exception):
    """A message began after the answer: bytes beyond it, never the next answer."""


class LlhttpAnswerReader:
    """One answer from ``source``, read by llhttp, the answer to a ``method`` request."""

    def __init__(self, source: Source, method: str) -> None:
        if method == "HEAD":
            raise httpx.LocalProtocolError("llhttp cannot frame an answer to HEAD")
        self._source = source
        self._parser = httptools.HttpResponseParser(self)
        self._pieces: list[bytes] = []
        self._tail = b""
        self._beyond = False
        self._trailer_bytes = -1  # counting once the last chunk's trailers may have begun
        self._trailers = 0
        self._interim = False
        self._left = 0
        self.fields: list[tuple[bytes, bytes]] = []
        self.index: dict[bytes, list[bytes]] = {}
        self.status = 0
        self.http_version = "HTTP/1.1"
        self.length: int | None = None
        self.keep_alive = False
        self.chunked = False
        self.done = False
        self._head_done = False
        self._read_head()

    # -- llhttp's callbacks --------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            raise _Beyond

    def on_status(self, reason: bytes) -> None:
        if not _is_text(reason):  # llhttp lets a NUL or other control byte through
            raise _malformed("a malformed status line")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_done:  # a trailer line: counted, otherwise ignored
            self._trailers += 1
            if self._trailers > MAX_FIELDS:
                raise _malformed(f"more than {MAX_FIELDS} header lines")
            return
        if len(self.fields) >= MAX_FIELDS:
            raise _malformed(f"more than {MAX_FIELDS} header lines")
        self.fields.append((name, value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _malformed("a malformed status line")
        self.status = status = parser.get_status_code()
        self.http_version = f"HTTP/{version}"
        index: dict[bytes, list[bytes]] = {}
        for name, value in self.fields:
            index.setdefault(name.lower(), []).append(value)
        self.index = index
        lengths = index.get(b"content-length")
        codings = index.get(b"transfer-encoding")
        if lengths is not None and len(lengths[0]) > _MAX_LENGTH_DIGITS:
            raise _malformed("a Content-Length that is not a number")
        if codings is not None and (len(codings) > 1 or codings[0].lower() != b"chunked"):
            raise _malformed("a Transfer-Encoding other than chunked")
        self.length = None
        if status < 200 or status in (204, 304):
            self.length = 0
        elif lengths is not None:
            self.length = int(lengths[0])
        self.chunked = self.length is None and codings is not None
        self.keep_alive = status >= 200 and parser.should_keep_alive()
        self._head_done = True
        if status == 100:  # interim: the answer's own head follows
            self.fields = []

    def on_chunk_header(self) -> None:
        # Before each chunk's data; the last chunk has none, and its trailers follow.
        self._trailer_bytes = 0

    def on_body(self, body: bytes) -> None:
        self._trailer_bytes = -1
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self.status == 100:
            self._head_done = False
            self._interim = True
            self.status = 0
            return
        self.done = True

    # -- feeding -------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Beyond) or self.done:
                self._beyond = True  # the answer is whole; what follows is not ours
                return
            if isinstance(cause, httpx.RemoteProtocolError):
                raise cause from None
            raise _malformed(str(exc) or type(exc).__name__) from None
        except httptools.HttpParserUpgrade:
            raise _malformed("an upgrade") from None

    def _read_head(self) -> None:
        source = self._source
        while not self._head_done:
            self._interim = False
            buffer = source.buffer
            start = 0
            while (end := buffer.find(b"\r\n\r\n", start, MAX_HEAD)) < 0:
                if len(buffer) >= MAX_HEAD:
                    raise _malformed(f"the answer's head over {MAX_HEAD} bytes")
                start = max(0, len(buffer) - 3)
                if not source.receive():
                    raise _malformed("the connection closed within the answer's head")
            head = bytes(buffer[: end + 4])
            del buffer[: end + 4]
            self._feed(head)
            if not (self._head_done or self._interim):  # llhttp and the search disagree
                raise _malformed("a head llhttp did not end where it ends")
        self._left = self.length or 0

    # -- the body ------------------------------------------------------------------

    def get(self, name: bytes) -> str | None:
        """The header's values joined by commas, or None."""
        values = self.index.get(name)
        return None if values is None else b", ".join(values).decode("latin-1")

    @property
    def reusable(self) -> bool:
        """Read to its end, the server lets the connection serve another request, and
        no byte beyond the answer has arrived."""
        if not (self.done and self.keep_alive) or self._beyond or self._source.buffer:
            return False
        if self.chunked:
            # llhttp skips empty lines after a message: the stream must end with the
            # body's last line, not with more line ends.
            tail = self._tail
            return tail.endswith(b"\r\n\r\n") and len(tail) == 5 and tail[0] not in _LINE_ENDS
        return True

    def read(self) -> bytes:
        """The next piece of the body, or b"" once it has been read to its end."""
        source = self._source
        while not self._pieces:
            if self.done:
                return b""
            if not source.buffer and not source.receive():
                if self.length is None and not self.chunked:  # framed by the close
                    self.done = True
                    return b""
                raise _malformed("the connection closed before the answer's end")
            buffer = source.buffer
            if self.length is not None:
                take = min(len(buffer), self._left)
                data = bytes(buffer[:take])
                del buffer[:take]
                self._left -= take
            elif self.chunked:
                data = bytes(buffer)
                buffer.clear()
                if self._trailer_bytes >= 0:
                    self._trailer_bytes += len(data)
                    if self._trailer_bytes > MAX_HEAD + CHUNK:
                        raise _malformed(f"the trailers over {MAX_HEAD} bytes")
                self._tail = (self._tail + data)[-5:]
            else:
                data = bytes(buffer)
                buffer.clear()
            self._feed(data)
        pieces = self._pieces
        piece = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        return piece
