"""The policy client's HTTP/1.1 answer parser frames every answer as h11 does.

``capgate.gateway.policy.framing`` reads OPA's answers with a parser of its own. Where an
answer's end is, is a security property: two readers that place it differently can
be made to take the tail of one answer for the next (response splitting). These
properties hold the parser to h11, the reader httpx itself uses, as an oracle:

- :func:`test_well_formed_answers_are_read_as_h11_reads_them`: any well-formed
  answer (HTTP/1.1 or 1.0, any status with a body, any extra header lines, a body
  of any bytes framed by Content-Length, chunked with extensions and trailers, or by
  the close) is accepted, with the status and body h11 reads;
- :func:`test_a_damaged_answer_is_refused_or_read_as_h11_reads_it`: the same
  answers with one part damaged (a byte changed, dropped or added, a chunk's data
  longer than its size, a line end made a bare LF, a folded line, a header line
  added that frames the body another way) are refused, or read exactly as h11 reads
  them; never read one way here and another there. Where h11 refuses an answer,
  this parser refuses it too, except for the one spelling RFC 9112 allows and h11
  does not: spaces before a chunk extension's ``;``. Where this parser is the
  stricter (bare LF, folded lines, versions other than 1.0 and 1.1), it refuses.

Each example goes through :meth:`DeadlineTransport.exchange` over a unix socket, the
decisions' own path, against a server that sends the bytes and closes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

import h11
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capgate.gateway.policy.wire import AnswerTooLarge, DeadlineTransport
from tests.fuzz.harness import Tally
from tests.fuzz.runs import examples, fuzz_settings, load_project_code
from tests.unit.test_opa_answer_parsing import URL, Scripted, ScriptedServer

pytestmark = [pytest.mark.timeout(max(900, examples()))]

#: The request every example answers (as the policy client writes one).
REQUEST_BODY: Final = b'{"input":{}}'
REQUEST_HEADERS: Final = [
    (b"Host", b"opa"),
    (b"Content-Type", b"application/json"),
    (b"Content-Length", str(len(REQUEST_BODY)).encode()),
]
TIMEOUTS: Final = {"connect": 5.0, "read": 5.0, "write": 5.0}
#: Headers that frame or encode the body: drawn on purpose, never at random.
_FRAMING: Final = {"content-length", "transfer-encoding", "connection", "content-encoding"}
_LINE_END: Final = re.compile(b"\r\n")
_TOKEN_CHARS: Final = (
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)


@pytest.fixture(scope="module")
def served() -> Iterator[ScriptedServer]:
    load_project_code()
    server = ScriptedServer()
    try:
        yield server
    finally:
        server.close()


# -- what is sent ------------------------------------------------------------------


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, str]:
    """A well-formed answer's bytes, and how its body is framed."""
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]))
    status = draw(st.integers(200, 599).filter(lambda code: code not in (204, 304)))
    reason = draw(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20))
    names = st.text(_TOKEN_CHARS, min_size=1, max_size=12).filter(
        lambda name: name.lower() not in _FRAMING
    )
    values = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30)
    extra = draw(st.lists(st.tuples(names, values), max_size=6))
    body = draw(st.binary(max_size=600))
    framing = draw(
        st.sampled_from(
            ["length", "chunked", "close"] if version == "HTTP/1.1" else ["length", "close"]
        )
    )
    lines = [f"{version} {status} {reason}".rstrip(" ").encode()]
    lines += [f"{name}: {value}".encode() for name, value in extra]
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}".encode())
        encoded = body
    elif framing == "chunked":
        lines.append(b"Transfer-Encoding: chunked")
        encoded = draw(chunked(body))
    else:
        encoded = body
    return b"\r\n".join(lines) + b"\r\n\r\n" + encoded, framing


@st.composite
def chunked(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` in chunks of drawn sizes, with extensions and trailers at times."""
    pieces: list[bytes] = []
    rest = body
    while rest:
        size = draw(st.integers(1, max(1, len(rest))))
        size_text = format(size, draw(st.sampled_from(["x", "X"])))
        extension = draw(st.sampled_from(["", ";name", ";name=value", ';n="quoted"']))
        pieces.append(f"{size_text}{extension}\r\n".encode() + rest[:size] + b"\r\n")
        rest = rest[size:]
    trailers = draw(st.sampled_from([b"", b"Trailer-One: x\r\n", b"A: 1\r\nB: 2\r\n"]))
    return b"".join(pieces) + b"0\r\n" + trailers + b"\r\n"


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, str]:
    """A well-formed answer with one part damaged, and what was done to it."""
    data, framing = draw(answers())
    head_end = data.index(b"\r\n\r\n")
    if framing == "chunked" and draw(st.booleans()):
        # A chunk's data one byte longer (or a size line one character longer) than
        # its size line says: the body's own framing, where a reader that skips to
        # the next line end would read on.
        ends = [match.start() for match in _LINE_END.finditer(data, head_end + 4)]
        at = draw(st.sampled_from(ends))
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at:], "chunk overrun"
    how = draw(
        st.sampled_from(
            [
                "byte changed",
                "byte dropped",
                "byte added",
                "bare LF",
                "second Content-Length",
                "Content-Length and chunked",
                "another transfer coding",
                "folded line",
                "space before colon",
            ]
        )
    )
    if how in ("byte changed", "byte dropped", "byte added"):
        # In the head (where framing is declared) or anywhere in the body (where a
        # chunked body's framing goes on), each about as often.
        in_head = draw(st.booleans())
        at = draw(st.integers(0, head_end + 3 if in_head else len(data) - 1))
        byte = bytes([draw(st.integers(0, 255))])
        if how == "byte changed":
            return data[:at] + byte + data[at + 1 :], how
        if how == "byte dropped":
            return data[:at] + data[at + 1 :], how
        return data[:at] + byte + data[at:], how
    head, body = data[:head_end], data[head_end:]
    if how == "bare LF":
        ends = [match.start() for match in _LINE_END.finditer(head)]
        if not ends:
            return data, "unchanged"
        at = draw(st.sampled_from(ends))
        return head[:at] + head[at + 1 :] + body, how
    added = {
        "second Content-Length": f"Content-Length: {draw(st.integers(0, 700))}",
        "Content-Length and chunked": "Transfer-Encoding: chunked\r\nContent-Length: 3",
        "another transfer coding": draw(
            st.sampled_from(
                [
                    "Transfer-Encoding: gzip",
                    "Transfer-Encoding: gzip, chunked",
                    "Transfer-Encoding: chunked, identity",
                    "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
                ]
            )
        ),
        "folded line": "X-Folded: one\r\n two",
        "space before colon": "Content-Length : 0",
    }[how]
    return head + b"\r\n" + added.encode() + body, how


# -- the two readers ---------------------------------------------------------------


class Refused(Exception):
    """A reader would not read the answer."""


def read_here(server: ScriptedServer, data: bytes) -> tuple[int, bytes]:
    """Status and body as the transport reads them, or Refused.

    A transport of its own for each answer: the server closes after every answer, and
    a pooled connection could be taken again before its close arrives.
    """
    server.script(Scripted(data, close=True))
    transport = DeadlineTransport(uds=server.path)
    try:
        answer = transport.exchange(
            "POST", URL, REQUEST_HEADERS, REQUEST_BODY, TIMEOUTS, max_bytes=1 << 20
        )
    except (httpx.TransportError, httpx.DecodingError, AnswerTooLarge) as exc:
        raise Refused(type(exc).__name__) from exc
    finally:
        transport.close()
    return answer.status, answer.body


def read_by_h11(data: bytes) -> tuple[int, bytes]:
    """Status and body as h11 reads them, the connection closed after ``data``."""
    connection = h11.Connection(our_role=h11.CLIENT)
    connection.send(
        h11.Request(
            method="POST",
            target="/v1/data/capgate/probe",
            headers=[(name, value) for name, value in REQUEST_HEADERS],
        )
    )
    connection.send(h11.Data(data=REQUEST_BODY))
    connection.send(h11.EndOfMessage())
    connection.receive_data(data)
    connection.receive_data(b"")
    status: int | None = None
    body = b""
    try:
        while True:
            event: Any = connection.next_event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert status is not None
                return status, body
            else:  # NEED_DATA after the close, or the connection closed mid-answer
                raise Refused(repr(event))
    except h11.RemoteProtocolError as exc:
        raise Refused(str(exc)) from exc


def both(served: ScriptedServer, data: bytes) -> tuple[Any, Any]:
    """Each reader's (status, body), or the Refused it raised."""
    readings: list[Any] = []
    for read in (lambda: read_here(served, data), lambda: read_by_h11(data)):
        try:
            readings.append(read())
        except Refused as refused:
            readings.append(refused)
    return readings[0], readings[1]


# -- the properties ----------------------------------------------------------------


def test_well_formed_answers_are_read_as_h11_reads_them(
    served: ScriptedServer,
) -> None:
    tally = Tally("answer framing, well formed")

    @fuzz_settings()
    @given(answers())
    def run(drawn: tuple[bytes, str]) -> None:
        data, framing = drawn
        here, oracle = both(served, data)
        assert not isinstance(oracle, Refused), f"the generator made a bad answer: {oracle}"
        assert not isinstance(here, Refused), f"refused a well-formed answer: {here}"
        assert here == oracle
        tally.add(framing)

    run()
    tally.finish("length", "chunked", "close")


# h11 refuses these, though RFC 9112 allows them (BWS before a chunk extension).
_H11_STRICTER: Final = re.compile(rb"\r\n[0-9A-Fa-f]+[ \t]+;")


def test_a_damaged_answer_is_refused_or_read_as_h11_reads_it(
    served: ScriptedServer,
) -> None:
    tally = Tally("answer framing, damaged")

    @fuzz_settings()
    @given(damaged())
    def run(drawn: tuple[bytes, str]) -> None:
        data, how = drawn
        here, oracle = both(served, data)
        if isinstance(here, Refused):
            tally.add(f"{how}: refused" if isinstance(oracle, Refused) else f"{how}: stricter")
            return
        if isinstance(oracle, Refused):
            assert _H11_STRICTER.search(data), f"read an answer h11 refuses ({oracle}): {data!r}"
            tally.add(f"{how}: read (h11 stricter than RFC 9112)")
            return
        assert here == oracle, f"read another way than h11: {data!r}"
        tally.add(f"{how}: read alike")

    run()
    tally.finish(
        "Content-Length and chunked: refused",
        "another transfer coding: refused",
        "chunk overrun: refused",
    )
