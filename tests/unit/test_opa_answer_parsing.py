"""The policy client's own HTTP/1.1 answer parser (gateway.policy.framing), byte by byte.

Each test scripts the exact bytes a server sends, over a unix socket in a fresh
folder, and reads them through :meth:`DeadlineTransport.exchange` (the decisions'
path) or, where said, through httpx (``handle_request``): what is read, what is
refused (always an httpx exception), and whether the connection serves the next
request. The fault suites (tests/integration/test_fake_opa.py) play the same kinds
of answer against the whole client; these pin the parser's rules one at a time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from capgate.gateway.policy.wire import DEADLINE, AnswerTooLarge, DeadlineTransport
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS

URL = httpx.URL("http://opa/v1/data/capgate/probe?provenance=true")
#: The scripted answers come: their waits are the hang bound's, not a pace.
TIMEOUTS = {"connect": ANSWER_TIMEOUT, "read": ANSWER_TIMEOUT, "write": ANSWER_TIMEOUT}
BODY = b'{"result": true}'


@dataclass(frozen=True)
class Scripted:
    """What the server sends for one request; ``close`` ends the connection after it."""

    data: bytes
    close: bool = False
    #: Seconds between bytes, each sent alone; 0 sends the whole at once.
    every: float = 0.0
    #: Send the first ``split`` bytes, pause, then the rest (0: no pause).
    split: int = 0


class ScriptedServer:
    """Answers each request with the next scripted bytes, one connection at a time."""

    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="capgate-parse-", dir="/tmp")
        self.path = os.path.join(self._folder, "opa.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(4)
        self._listener.settimeout(0.05)
        self._script: list[Scripted] = []
        self._stop = threading.Event()
        self.connections = 0
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def script(self, *answers: Scripted | bytes) -> None:
        self._script += [a if isinstance(a, Scripted) else Scripted(a) for a in answers]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HANG_SECONDS)  # asserted below: it must end
        self._listener.close()
        shutil.rmtree(self._folder, ignore_errors=True)
        assert not self._thread.is_alive()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                self.connections += 1
                with contextlib.suppress(OSError):  # the client left mid-answer
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        buffer = b""
        while self._script:
            while b"\r\n\r\n" not in buffer:
                data = conn.recv(65536)
                if not data:
                    return  # the client closed the connection
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buffer) < length:
                buffer += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + buffer[:length])
            buffer = buffer[length:]
            answer = self._script.pop(0)
            if answer.every:
                for i in range(len(answer.data)):
                    conn.sendall(answer.data[i : i + 1])
                    time.sleep(answer.every)
            elif answer.split:
                conn.sendall(answer.data[: answer.split])
                time.sleep(0.05)
                conn.sendall(answer.data[answer.split :])
            else:
                conn.sendall(answer.data)
            if answer.close:
                return
        # Nothing left to say: wait for the client to close (or the test to end).
        while not self._stop.is_set():
            try:
                if not conn.recv(65536):
                    return
            except TimeoutError:
                continue


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def transport(server: ScriptedServer) -> Iterator[DeadlineTransport]:
    transport = DeadlineTransport(uds=server.path)
    try:
        yield transport
    finally:
        transport.close()


def ask(transport: DeadlineTransport, max_bytes: int = 1 << 20) -> tuple[int, str, bytes]:
    body = b"{}"
    headers = [(b"Host", b"opa"), (b"Content-Length", str(len(body)).encode())]
    answer = transport.exchange("POST", URL, headers, body, TIMEOUTS, max_bytes)
    return answer.status, answer.http_version, answer.body


def head(*lines: str, status_line: str = "HTTP/1.1 200 OK") -> bytes:
    return ("\r\n".join([status_line, *lines]) + "\r\n\r\n").encode("latin-1")


def framed(body: bytes = BODY, *lines: str, status_line: str = "HTTP/1.1 200 OK") -> bytes:
    return head(f"Content-Length: {len(body)}", *lines, status_line=status_line) + body


CHUNKED = "Transfer-Encoding: chunked"


def refused(transport: DeadlineTransport, match: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match=match):
        ask(transport)


# -- well-formed answers ----------------------------------------------------------


def test_a_content_length_answer_is_read_and_its_connection_kept(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(framed(BODY, "Content-Type: application/json", "Date: today"), framed(b"second"))
    answer = transport.exchange(
        "POST", URL, [(b"Host", b"opa"), (b"Content-Length", b"0")], None, TIMEOUTS, 1024
    )
    assert (answer.status, answer.http_version, answer.body) == (200, "HTTP/1.1", BODY)
    assert answer.content_type == "application/json"
    assert answer.content_encoding is None
    assert ask(transport) == (200, "HTTP/1.1", b"second")
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/data/capgate/probe?provenance=true HTTP/1.1")


def test_a_chunked_answer_with_extensions_and_trailers_is_read(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    body = b"4;name=value\r\nWiki\r\n5 ; x\r\npedia\r\nA\r\n in chunks\r\n0\r\nX-Trailer: t\r\n\r\n"
    server.script(head(CHUNKED) + body, head("Transfer-Encoding: Chunked") + b"0\r\n\r\n")
    assert ask(transport) == (200, "HTTP/1.1", b"Wikipedia in chunks")
    assert ask(transport) == (200, "HTTP/1.1", b"")
    assert server.connections == 1  # both read to their end: one connection


def test_an_answer_trickled_byte_by_byte_is_read(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    """Every split of the lines and chunks meets the parser: one byte per write."""
    chunked = head(CHUNKED) + b"3\r\nabc\r\n2;e=1\r\nde\r\n0\r\nT: 1\r\n\r\n"
    server.script(Scripted(chunked, every=0.001), Scripted(framed(), every=0.001))
    assert ask(transport) == (200, "HTTP/1.1", b"abcde")
    assert ask(transport) == (200, "HTTP/1.1", BODY)
    assert server.connections == 1


def test_an_http_1_0_answer_without_keep_alive_is_not_reused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(framed(BODY, status_line="HTTP/1.0 200 OK"), framed(b"again"))
    assert ask(transport) == (200, "HTTP/1.0", BODY)
    assert ask(transport) == (200, "HTTP/1.1", b"again")
    assert server.connections == 2


def test_an_http_1_0_answer_with_keep_alive_is_reused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(
        framed(BODY, "Connection: Keep-Alive", status_line="HTTP/1.0 200 OK"), framed(b"again")
    )
    assert ask(transport) == (200, "HTTP/1.0", BODY)
    assert ask(transport) == (200, "HTTP/1.1", b"again")
    assert server.connections == 1


@pytest.mark.parametrize("connection", ["close", "Close", "keep-alive, close", "upgrade,close"])
def test_connection_close_is_obeyed(
    server: ScriptedServer, transport: DeadlineTransport, connection: str
) -> None:
    server.script(framed(BODY, f"Connection: {connection}"), framed(b"again"))
    assert ask(transport) == (200, "HTTP/1.1", BODY)
    assert ask(transport) == (200, "HTTP/1.1", b"again")
    assert server.connections == 2


def test_an_answer_without_length_is_read_to_the_close_and_not_reused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(Scripted(head() + b"until the end", close=True), framed(b"again"))
    assert ask(transport) == (200, "HTTP/1.1", b"until the end")
    assert ask(transport) == (200, "HTTP/1.1", b"again")
    assert server.connections == 2


def test_bytes_beyond_the_answer_are_not_taken_for_the_next_one(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(framed(BODY) + framed(b"forged"), framed(b"asked"))
    assert ask(transport) == (200, "HTTP/1.1", BODY)
    assert ask(transport) == (200, "HTTP/1.1", b"asked")
    assert server.connections == 2


def test_an_interim_100_continue_is_skipped(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(head(status_line="HTTP/1.1 100 Continue") + framed(BODY))
    assert ask(transport) == (200, "HTTP/1.1", BODY)


@pytest.mark.parametrize("status", [204, 304])
def test_an_answer_that_has_no_body_is_not_read_past(
    server: ScriptedServer, transport: DeadlineTransport, status: int
) -> None:
    server.script(head(status_line=f"HTTP/1.1 {status} X"), framed(b"next"))
    assert ask(transport) == (status, "HTTP/1.1", b"")
    assert ask(transport) == (200, "HTTP/1.1", b"next")
    assert server.connections == 1


def test_handle_request_reads_through_the_same_parser(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(
        head(CHUNKED, "Content-Type: application/json", "X-Seen: a", "X-Seen: b")
        + b"5\r\nhello\r\n0\r\n\r\n",
        framed(BODY, "Content-Length: 2"),
    )
    with httpx.Client(transport=transport, base_url="http://opa") as client:
        response = client.get("/v1/data/x")
        assert response.content == b"hello"
        assert response.http_version == "HTTP/1.1"
        assert response.headers["x-seen"] == "a, b"
        with pytest.raises(httpx.RemoteProtocolError, match="more than one Content-Length"):
            client.get("/v1/data/x")
    assert server.connections == 1


# -- refused heads ----------------------------------------------------------------


@pytest.mark.parametrize(
    "status_line",
    [
        "HTTP/1.1 20 OK",
        "HTTP/1.1 2000 OK",
        "HTTP/1.1 abc OK",
        "HTTP/1.1  200 OK",
        "HTTP/1.1 200OK",
        "HTTP/2 200 OK",
        "HTTP/1.2 200 OK",
        "http/1.1 200 OK",
        "ICY 200 OK",
        "HTTP/1.1 200 O\x00K",
        "SSH-2.0-OpenSSH_9.6",
        "",
    ],
)
def test_a_bad_status_line_is_refused(
    server: ScriptedServer, transport: DeadlineTransport, status_line: str
) -> None:
    server.script(framed(BODY, status_line=status_line))
    refused(transport, "malformed status line")


@pytest.mark.parametrize(
    "line",
    [
        " folded: onto the line before",
        "\tfolded",
        "Name : space before the colon",
        "No colon",
        ": no name",
        "Na(me: not a token",
        "X-Null: a\x00b",
        "X-Escape: a\x1bb",
        "X-Bare-LF: a\nX-Forged: b",
        "X-Bare-CR: a\rb",
    ],
)
def test_a_malformed_header_line_is_refused(
    server: ScriptedServer, transport: DeadlineTransport, line: str
) -> None:
    server.script(framed(BODY, line))
    refused(transport, "malformed header line")


def test_a_header_line_too_long_is_refused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(framed(BODY, "X-Padding: " + "a" * 70_000))
    refused(transport, "head over 65536 bytes")


def test_a_head_ending_past_the_bound_in_one_read_is_refused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    # 40,000 bytes first, then the rest: the end of the head (past 65,536 bytes)
    # arrives in the same read as the bound is crossed.
    server.script(Scripted(framed(BODY, "X-Padding: " + "a" * 70_000), split=40_000))
    refused(transport, "head over 65536 bytes")


def test_a_head_within_the_bound_is_read(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(framed(BODY, "X-Padding: " + "a" * 60_000))
    assert ask(transport) == (200, "HTTP/1.1", BODY)


def test_a_head_that_never_ends_is_refused_once_over_the_bound(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    # Sent, then held open: the refusal comes from the bound, not the close.
    server.script(b"HTTP/1.1 200 OK\r\n" + b"X-Padding: aaaaaaaa\r\n" * 4000)
    refused(transport, "head over 65536 bytes")


def test_too_many_headers_are_refused(server: ScriptedServer, transport: DeadlineTransport) -> None:
    server.script(framed(BODY, *[f"X-{i}: v" for i in range(100)]))
    refused(transport, "more than 100 header lines")


def test_a_hundred_headers_are_read(server: ScriptedServer, transport: DeadlineTransport) -> None:
    server.script(framed(BODY, *[f"X-{i}: v" for i in range(99)]))  # and Content-Length
    assert ask(transport) == (200, "HTTP/1.1", BODY)


def test_an_answer_closed_within_its_head_is_refused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(Scripted(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", close=True))
    refused(transport, "closed within the answer's head")


def test_a_connection_closed_without_an_answer_is_refused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(Scripted(b"", close=True))
    refused(transport, "closed within the answer's head")


# -- refused framing ----------------------------------------------------------------


@pytest.mark.parametrize("length", ["-1", "+16", "16a", "0x10", "1 6", "16, 16", "", "1" * 21])
def test_a_content_length_that_is_not_a_number_is_refused(
    server: ScriptedServer, transport: DeadlineTransport, length: str
) -> None:
    server.script(head(f"Content-Length: {length}") + BODY)
    refused(transport, "Content-Length that is not a number")


@pytest.mark.parametrize("second", ["2", "16"])
def test_a_duplicated_content_length_is_refused(
    server: ScriptedServer, transport: DeadlineTransport, second: str
) -> None:
    server.script(head("Content-Length: 16", f"content-length: {second}") + BODY)
    refused(transport, "more than one Content-Length")


def test_content_length_beside_transfer_encoding_is_refused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(head("Content-Length: 4", CHUNKED) + b"4\r\nWiki\r\n0\r\n\r\n")
    refused(transport, "both Content-Length and Transfer-Encoding")


@pytest.mark.parametrize(
    "codings",
    [
        ["Transfer-Encoding: gzip"],
        ["Transfer-Encoding: identity"],
        ["Transfer-Encoding: gzip, chunked"],
        ["Transfer-Encoding: chunked, chunked"],
        [CHUNKED, CHUNKED],
        ["Transfer-Encoding: xchunked"],
    ],
)
def test_a_transfer_encoding_other_than_chunked_is_refused(
    server: ScriptedServer, transport: DeadlineTransport, codings: list[str]
) -> None:
    server.script(Scripted(head(*codings) + b"4\r\nWiki\r\n0\r\n\r\n", close=True))
    refused(transport, "Transfer-Encoding other than chunked")


def test_a_body_shorter_than_its_content_length_is_refused(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(Scripted(head("Content-Length: 100") + BODY, close=True))
    refused(transport, "closed 84 bytes before the body's end")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"4\r\nWiki\r\n", "closed within a chunk-size line"),
        (b"4\r\nWi", "closed within a chunk"),
        (b"4\r\nWiki", "closed within the end of a chunk"),
        (b"4\r\nWiki\r\n0\r\n", "closed within the trailers"),
        (b"4\r\nWiki\r\n0\r\nX-Trailer: t\r\n", "closed within the trailers"),
    ],
)
def test_a_truncated_chunked_body_is_refused(
    server: ScriptedServer, transport: DeadlineTransport, body: bytes, match: str
) -> None:
    server.script(Scripted(head(CHUNKED) + body, close=True))
    refused(transport, match)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"zz\r\nWiki\r\n0\r\n\r\n", "malformed chunk-size line"),
        (b"-4\r\nWiki\r\n0\r\n\r\n", "malformed chunk-size line"),
        (b"0x4\r\nWiki\r\n0\r\n\r\n", "malformed chunk-size line"),
        (b"\r\nWiki\r\n0\r\n\r\n", "malformed chunk-size line"),
        (b"4\nWiki\r\n0\r\n\r\n", "malformed chunk-size line"),
        (b"11111111111111111\r\nWiki\r\n0\r\n\r\n", "malformed chunk-size line"),
        (b"4\r\nWikipedia\r\n0\r\n\r\n", "chunk longer than its size"),
        (b"4\r\nWiki\r\n0\r\n folded\r\n\r\n", "malformed header line"),
        (b"4\r\nWiki\r\n0\r\n" + b"T: 1\r\n" * 101 + b"\r\n", "more than 100 header lines"),
    ],
)
def test_a_malformed_chunked_body_is_refused(
    server: ScriptedServer, transport: DeadlineTransport, body: bytes, match: str
) -> None:
    server.script(Scripted(head(CHUNKED) + body, close=True))
    refused(transport, match)


# -- the cap, the deadline, the request -------------------------------------------


def test_an_answer_over_the_cap_is_refused_and_its_connection_dropped(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(
        head(CHUNKED) + b"10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n", framed(b"y" * 17), framed()
    )
    with pytest.raises(AnswerTooLarge):
        ask(transport, max_bytes=15)
    with pytest.raises(AnswerTooLarge):
        ask(transport, max_bytes=16)
    assert ask(transport) == (200, "HTTP/1.1", BODY)
    assert server.connections == 3


def test_the_deadline_holds_while_the_head_is_awaited(
    server: ScriptedServer, transport: DeadlineTransport
) -> None:
    server.script(b"HTTP/1.1 200 OK\r\nContent-")  # and nothing more
    # A read timeout of the hang bound: only the deadline can cut it short.
    read = {"read": HANG_SECONDS}
    token = DEADLINE.set(time.monotonic() + 0.2)
    started = time.monotonic()
    try:
        with pytest.raises(httpx.ReadTimeout):
            transport.exchange("POST", URL, [(b"Host", b"opa")], None, read, 1 << 20)
    finally:
        DEADLINE.reset(token)
    # Cut off by the deadline, not the read timeout: long before it, by a margin only
    # a hang could eat (not a pace: the deadline is 0.2 s).
    assert time.monotonic() - started < HANG_SECONDS / 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (b"X-Token", b"t0ken\r\nX-Forged: yes"),
        (b"X-Token", b"t0ken\nX-Forged: yes"),
        (b"X-Token", b"t0\x00ken"),
        (b"X Token", b"t0ken"),
        (b"X-Token:", b"t0ken"),
        (b"", b"t0ken"),
    ],
)
def test_a_request_header_that_would_forge_another_is_not_sent(
    server: ScriptedServer, transport: DeadlineTransport, name: bytes, value: bytes
) -> None:
    server.script(framed())
    with pytest.raises(httpx.LocalProtocolError, match="cannot be sent"):
        transport.exchange("GET", URL, [(b"Host", b"opa"), (name, value)], None, TIMEOUTS, 1024)
    assert server.connections == 0


@pytest.mark.parametrize("method", ["GET /forged HTTP/1.1\r\nX:", "GE T", "GÉT", ""])
def test_a_request_line_that_would_forge_another_is_not_sent(
    server: ScriptedServer, transport: DeadlineTransport, method: str
) -> None:
    server.script(framed())
    with pytest.raises(httpx.LocalProtocolError, match="cannot be sent"):
        transport.exchange(method, URL, [(b"Host", b"opa")], None, TIMEOUTS, 1024)
    assert server.connections == 0
