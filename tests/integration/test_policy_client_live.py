"""PolicyClient against a real OPA, over both transports it supports.

Every test runs twice: against an EmbeddedOPA on a unix socket, and against an
``opa run`` started here on a free 127.0.0.1 port (the "external OPA" path). The
bundle is a throwaway one written per test, so these tests check the client and
the wire format, not the project's policies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision, ReviewDecision
from capgate.gateway.model.facts import ComposeInput, ExecuteInput, ReviewInput
from capgate.gateway.opa.binary import find_opa
from capgate.gateway.opa.deploy import token_sha256
from capgate.gateway.opa.policies import default_policies_dir
from capgate.gateway.opa.process import EmbeddedOPA
from capgate.gateway.policy.client import PolicyClient
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS
from tests.integration.opa_servers import STARTUP_SECONDS, Server, external_opa, free_port

pytestmark = pytest.mark.integration

DIGEST = "sha256:" + "0" * 64
REVISION = "test-revision-7"
PARAMS_DIGEST = "sha256:" + "1" * 64

COMPOSE_FACTS = {
    "principal": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
    "task": {"type": "customer_quote", "linked_resources": [{"type": "opportunity", "id": "o-1"}]},
    "connections": {"crm": "active"},
    "environment": "production",
    "budget_class": "standard",
}
EXECUTE_FACTS = {
    **COMPOSE_FACTS,
    "call": {
        "tool": "quote.prepare_send",
        "version": 1,
        "operation_id": "send-1",
        "subject": {"type": "opportunity", "id": "o-1"},
        "params_digest": PARAMS_DIGEST,
    },
    "approval": {
        "kind": "exact_content_and_recipient",
        "tool": "quote.prepare_send",
        "operation_id": "send-1",
        "tenant": "acme",
        "digest": PARAMS_DIGEST,
        "expires_at": "2030-01-01T00:00:00Z",
        "approved_by": "founder",
        "used": False,
    },
    "stage": "dispatch",
    "proposal": {"id": "pr-1", "status": "approved"},
    "budget": {"remaining": None, "cost": 1},
    "evidence": [],
}
REVIEW_FACTS = {
    "reviewer": {
        "id": "maria",
        "role": "sales_manager",
        "tenant": "acme",
        "authenticated_by": "test:fixture",
    },
    "proposal": {
        "id": "pr-1",
        "tenant": "acme",
        "tool": "quote.prepare_send",
        "status": "pending",
        "proposer": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
    },
    "verdict": "approved",
}


def write_bundle(root: Path) -> Path:
    """Fixed decisions: compose shows nothing, execute and review deny, and a digest.

    The execute rule echoes the call's tool and stage in its message, and the review
    rule the reviewer and verdict, which proves the input arrived as the facts
    models serialise it. Both decisions carry the digest from
    data, as the real policies do, and the manifest a revision.
    """
    bundle = root / "bundle"
    for package in ("compose", "execute", "review", "catalogue/meta"):
        (bundle / "capgate" / package).mkdir(parents=True)
    (bundle / ".manifest").write_text(json.dumps({"revision": REVISION, "roots": ["capgate"]}))
    (bundle / "capgate" / "compose" / "compose.rego").write_text(
        textwrap.dedent("""\
            package capgate.compose

            decision := {
            \t"visible": [],
            \t"excluded": {},
            \t"catalogue_digest": data.capgate.catalogue.meta.digest,
            }
            """)
    )
    (bundle / "capgate" / "execute" / "execute.rego").write_text(
        textwrap.dedent("""\
            package capgate.execute

            decision := {
            \t"allow": false,
            \t"reasons": [{
            \t\t"code": "test_deny",
            \t\t"message": sprintf("no %s at %s", [input.call.tool, input.stage]),
            \t}],
            \t"obligations": [],
            \t"catalogue_digest": data.capgate.catalogue.meta.digest,
            }
            """)
    )
    (bundle / "capgate" / "review" / "review.rego").write_text(
        textwrap.dedent("""\
            package capgate.review

            decision := {
            \t"allow": false,
            \t"reasons": [{
            \t\t"code": "test_deny",
            \t\t"message": sprintf("no %s for %s", [input.verdict, input.reviewer.id]),
            \t}],
            \t"catalogue_digest": data.capgate.catalogue.meta.digest,
            }
            """)
    )
    (bundle / "capgate" / "catalogue" / "meta" / "data.json").write_text(
        json.dumps({"digest": DIGEST})
    )
    return bundle


@pytest.fixture(params=["embedded_unix", "external_tcp"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    bundle = write_bundle(tmp_path)
    if request.param == "embedded_unix":
        with EmbeddedOPA(bundle, startup_timeout=STARTUP_SECONDS) as opa:
            yield Server(opa.address, opa.pid)
    else:
        with external_opa(bundle, tmp_path / "opa.log") as external:
            yield external


@pytest.fixture
def client(server: Server) -> Iterator[PolicyClient]:
    # Where a test waits for OPA's answer, not for a timeout, the client's timeouts are
    # the hang bound: a loaded 2-core machine can stall for a long while.
    with PolicyClient(
        server.address, timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT
    ) as policy:
        yield policy


# -- answers ---------------------------------------------------------------------


def test_health(client: PolicyClient) -> None:
    assert client.health(bundles=True)
    assert client.health(bundles=False)


def test_compose_parses_with_a_decision_id(client: PolicyClient) -> None:
    decision = client.compose(ComposeInput.model_validate(COMPOSE_FACTS))
    assert isinstance(decision, ComposeDecision)
    assert decision.visible == []
    assert decision.excluded == {}
    assert decision.decision_id


def test_execute_parses_with_a_decision_id(client: PolicyClient) -> None:
    decision = client.execute(ExecuteInput.model_validate(EXECUTE_FACTS))
    assert isinstance(decision, ExecuteDecision)
    assert decision.allow is False
    assert decision.reason_codes == ["test_deny"]
    assert decision.reasons[0].message == "no quote.prepare_send at dispatch"
    assert decision.obligations == []
    assert decision.decision_id


def test_review_parses_with_a_decision_id(client: PolicyClient) -> None:
    decision = client.review(ReviewInput.model_validate(REVIEW_FACTS))
    assert isinstance(decision, ReviewDecision)
    assert decision.allow is False
    assert decision.reason_codes == ["test_deny"]
    assert decision.reasons[0].message == "no approved for maria"
    assert decision.decision_id


def test_decisions_carry_catalogue_digest_revision_and_opa_version(client: PolicyClient) -> None:
    composed = client.compose(ComposeInput.model_validate(COMPOSE_FACTS))
    executed = client.execute(ExecuteInput.model_validate(EXECUTE_FACTS))
    reviewed = client.review(ReviewInput.model_validate(REVIEW_FACTS))
    for decision in (composed, executed, reviewed):
        assert decision.catalogue_digest == DIGEST
        assert REVISION in decision.bundle_revisions.values()
        assert decision.opa_version == find_opa().version_text


def test_pinned_catalogue_and_revision_are_accepted(server: Server) -> None:
    with PolicyClient(
        server.address,
        timeout=ANSWER_TIMEOUT,
        connect_timeout=ANSWER_TIMEOUT,
        expected_catalogue=DIGEST,
        expected_revision=REVISION,
    ) as pinned:
        assert pinned.execute(ExecuteInput.model_validate(EXECUTE_FACTS)).catalogue_digest == DIGEST
        assert pinned.catalogue_digest() == DIGEST


@pytest.mark.parametrize(
    ("pins", "named"),
    [
        ({"expected_catalogue": "sha256:" + "9" * 64}, "sha256:" + "9" * 64),
        ({"expected_revision": "another-revision"}, "another-revision"),
    ],
    ids=["catalogue", "revision"],
)
def test_a_pin_that_opa_does_not_match_fails_closed(
    server: Server, pins: dict[str, str], named: str
) -> None:
    with (
        PolicyClient(
            server.address, timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT, **pins
        ) as pinned,
        pytest.raises(PolicyUnavailable) as info,
    ):
        pinned.execute(ExecuteInput.model_validate(EXECUTE_FACTS))
    assert named in str(info.value)


def test_each_decision_has_its_own_id(client: PolicyClient) -> None:
    facts = ComposeInput.model_validate(COMPOSE_FACTS)
    ids = {client.compose(facts).decision_id for _ in range(5)}
    assert len(ids) == 5


def test_catalogue_digest(client: PolicyClient) -> None:
    assert client.catalogue_digest() == DIGEST


def test_undefined_decision_fails_closed(client: PolicyClient) -> None:
    with pytest.raises(PolicyUnavailable, match="undefined"):
        client.query("capgate/nothing/here", {})


def test_non_object_result_fails_closed(client: PolicyClient) -> None:
    with pytest.raises(PolicyUnavailable, match="not an object"):
        client.query("capgate/catalogue/meta/digest", {})


# -- OPA dies --------------------------------------------------------------------


def test_opa_killed_mid_run_fails_closed_and_the_tool_never_runs(
    server: Server, client: PolicyClient
) -> None:
    entered: list[str] = []

    def send_quote() -> None:
        entered.append("send_quote")  # stands in for a tool with side effects

    def guarded_call() -> None:
        decision = client.execute(ExecuteInput.model_validate(EXECUTE_FACTS))
        if decision.allow:  # never, with this bundle; reaching here at all is the point
            send_quote()
        entered.append("decided")

    guarded_call()  # warm: a keep-alive connection to OPA is now pooled
    assert entered == ["decided"]

    os.kill(server.pid, signal.SIGKILL)
    wait_dead(server.pid)

    entered.clear()
    with pytest.raises(PolicyUnavailable):
        guarded_call()
    assert entered == []
    with pytest.raises(PolicyUnavailable):
        client.compose(ComposeInput.model_validate(COMPOSE_FACTS))
    with pytest.raises(PolicyUnavailable):
        client.catalogue_digest()
    assert client.health() is False


def wait_dead(pid: int) -> None:
    """Until ``pid`` is gone or a zombie; it is our child, so nobody reaps it yet."""
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return
        if "\nState:\tZ" in status:
            return
        time.sleep(0.02)
    pytest.fail(f"OPA {pid} survived SIGKILL")


# -- a stalled OPA ---------------------------------------------------------------


def test_a_server_that_never_answers_times_out_quickly() -> None:
    # A listening socket that never accepts: the kernel completes the handshake, so
    # the connect succeeds and the read is what has to time out.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(8)
        port = stalled.getsockname()[1]
        with PolicyClient(f"http://127.0.0.1:{port}", timeout=0.3) as slow:
            started = time.monotonic()
            with pytest.raises(PolicyUnavailable, match="in time"):
                slow.execute(ExecuteInput.model_validate(EXECUTE_FACTS))
            elapsed = time.monotonic() - started
    # Cut off by the timeout ("in time"), never by an answer: so not before it. No upper
    # bound: how late a loaded machine gets round to it is no behaviour (a hang is
    # pytest's timeout's to catch).
    assert elapsed >= 0.25


def test_nothing_listening_is_unreachable() -> None:
    port = free_port()
    with PolicyClient(f"http://127.0.0.1:{port}") as nowhere:
        with pytest.raises(PolicyUnavailable, match="unreachable"):
            nowhere.compose(ComposeInput.model_validate(COMPOSE_FACTS))
        assert nowhere.health() is False


def test_missing_socket_is_unreachable(tmp_path: Path) -> None:
    with (
        PolicyClient(f"unix://{tmp_path}/no.sock") as nowhere,
        pytest.raises(PolicyUnavailable, match="unreachable"),
    ):
        nowhere.compose(ComposeInput.model_validate(COMPOSE_FACTS))


def test_a_server_that_trickles_its_answer_hits_the_overall_deadline() -> None:
    # Each byte arrives well within the read timeout, so only a deadline on the whole
    # answer stops this; without one the call would take 60 s. (tests/integration/
    # test_fake_opa.py trickles the status line and headers too, over both transports.)
    body = b'{"result": {"visible": [], "excluded": {}}}' + b" " * 600
    stop = threading.Event()
    sent: list[int] = []

    def trickle(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            for byte in body:
                if stop.is_set():
                    return
                conn.sendall(bytes([byte]))
                sent.append(byte)
                time.sleep(0.1)

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        worker = threading.Thread(target=trickle, args=(listener,), daemon=True)
        worker.start()
        try:
            with PolicyClient(f"http://127.0.0.1:{port}", timeout=0.5) as client:
                with pytest.raises(PolicyUnavailable, match="in time"):
                    client.compose(ComposeInput.model_validate(COMPOSE_FACTS))
                cut_at = len(sent)
        finally:
            stop.set()
            worker.join(timeout=5)
    # Cut off by the deadline while the answer was still arriving, not after it: what
    # was sent by then, not how long it took (a loaded machine is late, never early).
    assert cut_at < len(body)


# -- a locked-down OPA: token authentication and the deployment's system.authz ---------


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_a_locked_down_opa_answers_the_token_only(transport: str, tmp_path: Path) -> None:
    """The client's bearer token against OPA's own authentication, over both
    transports: the test bundle plus the real ``system.authz`` and a token hash."""
    token = "live-token-0123456789"
    bundle = write_bundle(tmp_path)
    (bundle / ".manifest").write_text(
        json.dumps({"revision": REVISION, "roots": ["capgate", "system/authz", "system/gateway"]})
    )
    (bundle / "system" / "authz").mkdir(parents=True)
    (bundle / "system" / "authz" / "authz.rego").write_bytes(
        (default_policies_dir() / "system" / "authz" / "authz.rego").read_bytes()
    )
    (bundle / "system" / "gateway").mkdir()
    (bundle / "system" / "gateway" / "data.json").write_text(
        json.dumps({"tokens": {token_sha256(token): {}}})
    )
    folder = Path(tempfile.mkdtemp(prefix="capgate-live-", dir="/tmp"))  # short socket path
    address = f"unix://{folder}/opa.sock" if transport == "unix" else ""
    if transport == "tcp":
        address = f"http://127.0.0.1:{free_port()}"
    addr = address if transport == "unix" else address.removeprefix("http://")
    log = tmp_path / "opa.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(find_opa().path),
                "run",
                "--server",
                "--addr",
                addr,
                "--bundle",
                str(bundle),
                "--authentication=token",
                "--authorization=basic",
                "--skip-version-check",
                "--unix-socket-perm",
                "600",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={},
        )
    try:
        with PolicyClient(
            address, token=token, timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT
        ) as client:
            deadline = time.monotonic() + STARTUP_SECONDS
            while not client.ready():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            assert client.catalogue_digest() == DIGEST
            composed = client.compose(ComposeInput.model_validate(COMPOSE_FACTS))
            assert composed.catalogue_digest == DIGEST
        with PolicyClient(
            address, timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT
        ) as anonymous:
            assert anonymous.ready()  # health is anyone's
            with pytest.raises(PolicyUnavailable, match=r"401.*requires a token"):
                anonymous.catalogue_digest()
        impostor = PolicyClient(
            address, token="another-token", timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT
        )
        with impostor, pytest.raises(PolicyUnavailable, match=r"401.*refused this client's token"):
            impostor.compose(ComposeInput.model_validate(COMPOSE_FACTS))
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_SECONDS)  # no kill() after it: it must end
        shutil.rmtree(folder, ignore_errors=True)


# -- the transport (gateway.opa.transport) ---------------------------------------------


def _is_whole_request(data: bytes) -> bool:
    head, separator, body = data.partition(b"\r\n\r\n")
    if not separator:
        return False
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return len(body) >= length


def _recording_server(answer: bytes) -> tuple[socket.socket, list[bytes], threading.Thread]:
    """A one-connection server on 127.0.0.1 that records each recv and answers once."""
    listener = socket.create_server(("127.0.0.1", 0))
    chunks: list[bytes] = []

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            data = b""
            while not _is_whole_request(data):
                chunk = connection.recv(65536)
                if not chunk:
                    return
                chunks.append(chunk)
                data += chunk
                time.sleep(0.05)  # a second write, if any, lands in a second recv
            connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, chunks, thread


def _answer(headers: list[str], body: bytes) -> bytes:
    return ("HTTP/1.1 200 OK\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode() + body


def test_a_request_goes_out_in_one_write() -> None:
    body = json.dumps({"result": {"ok": True}}).encode()
    answer = _answer(["Content-Type: application/json", f"Content-Length: {len(body)}"], body)
    listener, chunks, thread = _recording_server(answer)
    with listener:
        address = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with PolicyClient(
            address, timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT
        ) as client:
            assert client.query("capgate/anything", {"pad": "x" * 2000}) == ({"ok": True}, None)
        thread.join(timeout=5)
    assert len(chunks) == 1, f"the request arrived in {len(chunks)} writes"
    assert chunks[0].startswith(b"POST /v1/data/capgate/anything?provenance=true HTTP/1.1\r\n")
    assert chunks[0].endswith(b'"' + b"x" * 2000 + b'"}}')


@pytest.mark.parametrize(
    "headers",
    [
        ["Content-Type: application/json", "Content-Length: 20", "Transfer-Encoding: chunked"],
        ["Content-Type: application/json", "Content-Length: twenty"],
        ["Content-Type: application/json", "Content-Length: 20", "Content-Length: 20"],
    ],
    ids=["length and chunked", "length not a number", "length twice, equal"],
)
def test_an_answer_whose_end_is_ambiguous_fails_closed(headers: list[str]) -> None:
    answer = _answer(headers, b'{"result": {"a": 1}}')
    listener, _, thread = _recording_server(answer)
    with listener:
        address = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with (
            PolicyClient(address, timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT) as client,
            pytest.raises(PolicyUnavailable, match="transport error"),
        ):
            client.query("capgate/anything", {})
        thread.join(timeout=5)
