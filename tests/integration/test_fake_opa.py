"""Whatever answers at OPA's address, a bad answer ends in PolicyUnavailable.

A :class:`~tests.integration.fake_opa.FakeOPA` plays each answer kind in ``KINDS``,
over TCP and over a unix socket, at each of the three moments capgate asks OPA:

- ``startup``: ``PolicySidecar(catalogue, opa_url=...)`` reads the catalogue digest;
- ``compose``: ``Dispatcher.compose``;
- ``call``: ``Dispatcher.call`` of an in-process tool that records being entered.

Every kind is built from the answer a good OPA would give at that moment (at the
call, an allow), so a client that accepted it would show the agent every tool or
run the tool. For every case the test asserts PolicyUnavailable (or its subclass)
and nothing else, that the tool was never entered, that a redirect target was never
asked, and that the failure came from the deadline only where nothing else could
end the answer: an answer that stalls or trickles was cut off before its end, and
any other was refused for what it said, not timed out (never how long either took:
a loaded machine is only ever later).
``test_a_good_answer_is_obeyed`` is the control: the same harness, answering well,
does get an allow through and the tool entered, so these tests can fail.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest

from capgate.adapters.tools.in_process import InProcessTools
from capgate.cli.main import EXIT_ERROR, main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import Budget, ComposeInput
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.policy.answer import MAX_ANSWER_BYTES
from capgate.gateway.policy.client import (
    CATALOGUE_DIGEST_PATH,
    COMPOSE_PATH,
    EXECUTE_PATH,
    PolicyClient,
)
from capgate.gateway.policy.timeouts import DEFAULT_TIMEOUT
from capgate.gateway.policy.wire import DeadlineTransport
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import ANSWER_TIMEOUT
from tests.integration.fake_opa import (
    CLOSE,
    RESET,
    STALL,
    TRANSPORTS,
    FakeOPA,
    Reply,
    Transport,
    chunk,
    fake_opa,
    framed,
    json_reply,
    response_head,
    trickle,
)

pytestmark = pytest.mark.integration

SALES = demo_catalogue_dir("sales")
DIGEST: str = compile_catalogue(load_catalogue(SALES))["meta"]["digest"]
OTHER_DIGEST = "sha256:" + "e" * 64
REVISION = "sha256:" + "7" * 64

#: The client's read timeout where the deadline is under test: the default, which
#: with the connect timeout gives the deadline of a whole answer (PolicyClient:
#: connect_timeout + 2 * timeout). The slow answers below take 15 s or more (a byte
#: every 50 ms) unless the deadline cuts them off, and the others never end.
TIMEOUT = DEFAULT_TIMEOUT
#: Time between trickled bytes: each arrives well inside the read timeout.
EVERY = 0.05

FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
        "task": {"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c-42"}]},
        "connections": {"crm": "active"},
        "environment": "production",
        "budget_class": "standard",
    }
)


def envelope(result: Any) -> dict[str, Any]:
    """An answer as OPA 1.22 gives it to ``?provenance=true``."""
    return {
        "decision_id": "0b7c1c4e-7a65-4c4a-9d1b-5e1f0c0ffee0",
        "provenance": {
            "version": "1.22.4",
            "build_commit": "",
            "bundles": {"capgate": {"revision": REVISION}},
        },
        "result": result,
    }


@dataclass(frozen=True)
class Phase:
    """One moment capgate asks OPA: the path, the good answer, the key that decides."""

    path: str
    answer: dict[str, Any]
    #: Where in ``answer`` the decision sits (the value a duplicate key would fake).
    decisive: tuple[str, ...]


def _phases() -> dict[str, Phase]:
    tools = sorted(load_catalogue(SALES).tools)
    return {
        "startup": Phase(f"/v1/data/{CATALOGUE_DIGEST_PATH}", envelope(DIGEST), ("result",)),
        "compose": Phase(
            f"/v1/data/{COMPOSE_PATH}",
            envelope({"visible": tools, "excluded": {}, "catalogue_digest": DIGEST}),
            ("result", "visible"),
        ),
        "call": Phase(
            f"/v1/data/{EXECUTE_PATH}",
            envelope({"allow": True, "reasons": [], "obligations": [], "catalogue_digest": DIGEST}),
            ("result", "allow"),
        ),
    }


PHASES = _phases()


def serve_well(server: FakeOPA) -> None:
    """Answer every question as a good OPA would: the digest, everything visible, allow."""
    for phase in PHASES.values():
        server.route(phase.path, json_reply(phase.answer))


# -- building bad answers -------------------------------------------------------

_MARK = "\x00twice\x00"


def duplicated(
    document: dict[str, Any], path: tuple[str, ...], first: Any = None, escape: bool = False
) -> bytes:
    """``document`` as JSON with the key at ``path`` written twice: ``first``, then
    the real value. Python's json keeps the last, so it reads the real (good) value;
    a parser keeping the first reads ``first``. With ``escape`` the second key is
    spelled with a ``\\u`` escape, which decodes to the same key.
    """
    copied = copy.deepcopy(document)
    parent = copied
    for key in path[:-1]:
        parent = parent[key]
    real = parent[path[-1]]
    parent[path[-1]] = _MARK
    text = json.dumps(copied)
    key = json.dumps(path[-1])
    pair = f"{key}: {json.dumps(_MARK)}"
    assert text.count(pair) == 1
    second = f'"\\u{ord(path[-1][0]):04x}{path[-1][1:]}"' if escape else key
    return text.replace(pair, f"{key}: {json.dumps(first)}, {second}: {json.dumps(real)}").encode()


def body_of(phase: Phase) -> bytes:
    return json.dumps(phase.answer).encode()


def with_result(phase: Phase, change: Callable[[Any], Any]) -> Reply:
    return json_reply({**phase.answer, "result": change(phase.answer["result"])})


def result_field(phase: Phase, name: str, value: Any) -> Reply:
    """The result with ``name`` set to ``value`` (for the digest, the result itself)."""

    def change(result: Any) -> Any:
        return {**result, name: value} if isinstance(result, dict) else value

    return with_result(phase, change)


def without(phase: Phase, name: str) -> Reply:
    def change(result: Any) -> Any:
        return {k: v for k, v in result.items() if k != name} if isinstance(result, dict) else ""

    return with_result(phase, change)


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@cache
def gzip_bomb() -> bytes:
    """Over MAX_ANSWER_BYTES of JSON once inflated, about 64 KB on the wire."""
    size = MAX_ANSWER_BYTES + 1024
    return gzip.compress(b'{"result": "' + b" " * size + b'"}', compresslevel=9)


def status(code: int, body: bytes = b"", **kw: Any) -> Reply:
    return Reply.of(framed(body, code, **kw))


def redirect(code: int, phase: Phase, elsewhere: str) -> Reply:
    location = ("Location", f"{elsewhere}{phase.path}?provenance=true")
    return Reply.of(framed(b"", code, content_type=None, extra_headers=[location]))


Kind = Callable[[Phase, str], Reply]

KINDS: dict[str, Kind] = {
    # Ambiguous: a repeated key, read last-wins, would be the good answer.
    "duplicate_result": lambda p, _: Reply.of(framed(duplicated(p.answer, ("result",)))),
    "duplicate_decisive_key": lambda p, _: Reply.of(framed(duplicated(p.answer, p.decisive))),
    "duplicate_decisive_key_escaped": lambda p, _: Reply.of(
        framed(duplicated(p.answer, p.decisive, escape=True))
    ),
    "duplicate_nested_revision": lambda p, _: Reply.of(
        framed(duplicated(p.answer, ("provenance", "bundles", "capgate", "revision"), REVISION))
    ),
    "duplicate_decision_id": lambda p, _: Reply.of(
        framed(duplicated(p.answer, ("decision_id",), "forged"))
    ),
    # Not the answer: undefined, wrapped, of the wrong type or shape.
    "undefined": lambda p, _: json_reply({k: v for k, v in p.answer.items() if k != "result"}),
    "result_null": lambda p, _: with_result(p, lambda r: None),
    "result_wrapped_twice": lambda p, _: with_result(p, lambda r: {"result": r}),
    "result_in_a_list": lambda p, _: with_result(p, lambda r: [r]),
    "result_true": lambda p, _: with_result(p, lambda r: True),
    "result_string_allow": lambda p, _: with_result(p, lambda r: "allow"),
    "decisive_value_as_string": lambda p, _: result_field(p, p.decisive[-1], "true"),
    "result_sets_decision_id": lambda p, _: result_field(p, "decision_id", "forged"),
    "result_sets_bundle_revisions": lambda p, _: result_field(p, "bundle_revisions", {}),
    "result_extra_key": lambda p, _: result_field(p, "ttl", 60),
    "decision_id_not_a_string": lambda p, _: json_reply({**p.answer, "decision_id": 7}),
    "provenance_not_an_object": lambda p, _: json_reply({**p.answer, "provenance": "1.22.4"}),
    "provenance_bundles_a_list": lambda p, _: json_reply(
        {**p.answer, "provenance": {"version": "1.22.4", "bundles": [REVISION]}}
    ),
    "provenance_revision_a_number": lambda p, _: json_reply(
        {**p.answer, "provenance": {"bundles": {"capgate": {"revision": 7}}}}
    ),
    # Made under another catalogue.
    "wrong_catalogue_digest": lambda p, _: result_field(p, "catalogue_digest", OTHER_DIGEST),
    "catalogue_digest_missing": lambda p, _: without(p, "catalogue_digest"),
    "catalogue_digest_malformed": lambda p, _: result_field(p, "catalogue_digest", "sha256:x"),
    # Not JSON, or not strict JSON.
    "not_json": lambda p, _: Reply.of(framed(b"<html>502 Bad Gateway</html>")),
    "empty_body": lambda p, _: Reply.of(framed(b"")),
    "truncated_json": lambda p, _: Reply.of(framed(body_of(p)[: len(body_of(p)) // 2])),
    "trailing_garbage": lambda p, _: Reply.of(framed(body_of(p) + b"x")),
    "two_documents": lambda p, _: Reply.of(framed(body_of(p) + body_of(p))),
    "not_utf8": lambda p, _: Reply.of(framed(b'{"result": "\xff\xfe"}')),
    "nan_constant": lambda p, _: Reply.of(framed(body_of(p)[:-1] + b', "x": NaN}')),
    "json_array": lambda p, _: json_reply([p.answer]),
    "json_null": lambda p, _: json_reply(None),
    "nested_100000_deep": lambda p, _: Reply.of(
        framed(f'{{"result": {nested(100_000)}}}'.encode())
    ),
    "result_nested_500_deep": lambda p, _: Reply.of(
        framed(body_of(p).replace(b'"result": ', f'"result": {nested(500)}, "x": '.encode(), 1))
    ),
    # The wrong status, whatever the body says.
    "status_201": lambda p, _: status(201, body_of(p)),
    "status_204": lambda p, _: Reply.of(response_head(204, headers=[])),
    "status_404": lambda p, _: status(404, b'{"code": "resource_not_found"}'),
    "status_500_with_a_result": lambda p, _: status(500, body_of(p)),
    "status_503": lambda p, _: status(503, b"unavailable", content_type="text/plain"),
    # Redirected to a server that would say yes (it must never be asked).
    "redirect_301": lambda p, e: redirect(301, p, e),
    "redirect_302": lambda p, e: redirect(302, p, e),
    "redirect_307": lambda p, e: redirect(307, p, e),
    "redirect_308": lambda p, e: redirect(308, p, e),
    # Not OPA's framing or labels.
    "http_1_0": lambda p, _: Reply.of(framed(body_of(p), version="HTTP/1.0"), CLOSE),
    "not_http": lambda p, _: Reply.of(b"SSH-2.0-OpenSSH_9.6\r\n", CLOSE),
    "content_type_html": lambda p, _: Reply.of(framed(body_of(p), content_type="text/html")),
    "content_type_missing": lambda p, _: Reply.of(framed(body_of(p), content_type=None)),
    "content_encoding_unknown": lambda p, _: Reply.of(
        framed(body_of(p), extra_headers=[("Content-Encoding", "x-capgate-none")])
    ),
    "gzip_that_is_not": lambda p, _: Reply.of(
        framed(body_of(p), extra_headers=[("Content-Encoding", "gzip")])
    ),
    "gzip_bomb": lambda p, _: Reply.of(
        framed(gzip_bomb(), extra_headers=[("Content-Encoding", "gzip")])
    ),
    "content_length_beyond_body_then_close": lambda p, _: Reply.of(
        response_head(
            headers=[
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body_of(p)) + 100)),
            ]
        ),
        body_of(p),
        CLOSE,
    ),
    "closed_mid_body": lambda p, _: Reply.of(framed(body_of(p))[:-10], CLOSE),
    "reset_mid_body": lambda p, _: Reply.of(framed(body_of(p))[:-10], RESET),
    "closed_without_answer": lambda p, _: Reply.of(CLOSE),
    "reset_without_answer": lambda p, _: Reply.of(RESET),
    "conflicting_content_lengths": lambda p, _: Reply.of(
        response_head(
            headers=[
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body_of(p)))),
                ("Content-Length", "2"),
            ]
        ),
        body_of(p),
    ),
    "chunked_then_garbage": lambda p, _: Reply.of(
        response_head(
            headers=[("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")]
        ),
        chunk(body_of(p)[:20]),
        b"zz-not-a-chunk-size\r\n\r\n",
    ),
    "chunked_never_finished": lambda p, _: Reply.of(
        response_head(
            headers=[("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")]
        ),
        chunk(body_of(p)),
        CLOSE,
    ),
    "oversized_chunked": lambda p, _: Reply.of(
        response_head(
            headers=[("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")]
        ),
        *[chunk(b" " * (1 << 20))] * (MAX_ANSWER_BYTES // (1 << 20) + 1),
        chunk(body_of(p)),
        b"0\r\n\r\n",
    ),
    "oversized_declared": lambda p, _: Reply.of(
        response_head(
            headers=[("Content-Type", "application/json"), ("Content-Length", str(1 << 40))]
        ),
        body_of(p),
        STALL,
    ),
    "endless_headers": lambda p, _: Reply.of(
        b"HTTP/1.1 200 OK\r\n", *[b"X-Padding: " + b"a" * 1000 + b"\r\n"] * 200, STALL
    ),
    # Slow: each byte on time, the whole answer never.
    "headers_trickled": lambda p, _: Reply.of(*trickle(framed(body_of(p)), EVERY)),
    "body_trickled": lambda p, _: Reply.of(
        response_head(
            headers=[
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body_of(p)))),
            ]
        ),
        *trickle(body_of(p), EVERY),
    ),
    "headers_then_stall": lambda p, _: Reply.of(
        response_head(
            headers=[
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body_of(p)))),
            ]
        ),
        STALL,
    ),
    "never_answers": lambda p, _: Reply.of(STALL),
}


# -- the matrix -----------------------------------------------------------------


@dataclass
class Rig:
    """A fake OPA answering well, a redirect target that would allow, and a tool."""

    fake: FakeOPA
    elsewhere: FakeOPA
    catalogue: Catalogue
    entered: list[str]

    def sidecar(self, timeout: float = ANSWER_TIMEOUT) -> PolicySidecar:
        return PolicySidecar(self.catalogue, opa_url=self.fake.address, timeout=timeout)

    def dispatcher(self, client: PolicyClient) -> Dispatcher:
        tools = InProcessTools()

        def read_contact(contact_id: str) -> dict[str, str]:
            self.entered.append(contact_id)  # stands in for a tool with side effects
            return {"contact_id": contact_id, "name": "Ada", "email": "ada@example.test"}

        tools.register("contact.read", "Read one CRM contact.", read_contact)
        return Dispatcher(self.catalogue, client, ToolRegistry(tools))


def timed(reply: Reply) -> bool:
    """Whether only a deadline may end ``reply``: it stalls, or trickles for longer."""
    return any(action is STALL or isinstance(action, float) for action in reply.actions)


@pytest.fixture(params=TRANSPORTS)
def rig(request: pytest.FixtureRequest, sales_catalogue: Catalogue) -> Iterator[Rig]:
    transport: Transport = request.param
    with FakeOPA(transport) as fake, FakeOPA("tcp") as elsewhere:
        serve_well(fake)
        serve_well(elsewhere)
        yield Rig(fake, elsewhere, sales_catalogue, [])


def read_contact(rig: Rig, dispatcher: Dispatcher) -> Outcome:
    """The call capgate makes at stage call, with the budget facts the gateway sends."""
    cost = rig.catalogue.tools["contact.read"].cost_units
    return dispatcher.call(
        FACTS, "contact.read", {"contact_id": "c-42"}, budget=Budget(remaining=None, cost=cost)
    )


def ask(rig: Rig, phase: str, reply: Reply) -> None:
    """Install ``reply`` for ``phase`` and ask at that moment, as capgate would: with
    the deadline under test (TIMEOUT) for a reply only a deadline may end, and for
    any other, and for the good answers before the question under test, the hang
    bound (ANSWER_TIMEOUT)."""
    path = PHASES[phase].path
    timeout = TIMEOUT if timed(reply) else ANSWER_TIMEOUT
    if phase == "startup":
        rig.fake.route(path, reply)
        with rig.sidecar(timeout):
            return
    with rig.sidecar() as sidecar, contextlib.ExitStack() as stack:
        client = sidecar.client
        if timeout != ANSWER_TIMEOUT:
            # The sidecar's start (a good answer) waited by the hang bound; the
            # question under test is asked by a client like its own, with the deadline.
            client = stack.enter_context(
                PolicyClient(
                    rig.fake.address,
                    timeout=timeout,
                    expected_catalogue=sidecar.expected_digest,
                    catalogue_size=len(rig.catalogue.tools),
                )
            )
        dispatcher = rig.dispatcher(client)
        rig.fake.route(path, reply)
        if phase == "compose":
            dispatcher.compose(FACTS)
        else:
            read_contact(rig, dispatcher)


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_bad_answer_fails_closed(rig: Rig, kind: str, phase: str) -> None:
    reply = KINDS[kind](PHASES[phase], rig.elsewhere.address)
    with pytest.raises(PolicyUnavailable) as refused:
        ask(rig, phase, reply)
    assert rig.entered == [], "the tool must never be entered"
    assert rig.elsewhere.seen == [], "a redirect must never be followed"
    asked = [seen for seen in rig.fake.seen if seen.path == PHASES[phase].path]
    assert asked, "the fake was asked the question under test"
    # What ended the question, not how long it took (a loaded machine is only later):
    # an answer only a deadline may end was cut off before its end (the fake stopped
    # first, so a reply it was still playing is not counted as played), and any other
    # was refused for what it said, with time to spare.
    rig.fake.close()
    if timed(reply):
        assert PHASES[phase].path not in rig.fake.played, "the whole answer was waited for"
    else:
        assert "in time" not in str(refused.value), str(refused.value)


@pytest.mark.parametrize("phase", PHASES)
def test_a_good_answer_is_obeyed(rig: Rig, phase: str) -> None:
    """The control: answering well, the harness gets everything through."""
    with rig.sidecar() as sidecar:
        dispatcher = rig.dispatcher(sidecar.client)
        composed = dispatcher.compose(FACTS)
        outcome = read_contact(rig, dispatcher)
    assert sorted(composed.visible) == sorted(rig.catalogue.tools)
    assert composed.bundle_revisions == {"capgate": REVISION}
    assert composed.opa_version == "1.22.4"
    assert outcome.status.value == "success"
    assert rig.entered == ["c-42"]
    queries = {seen.query for seen in rig.fake.seen}
    assert queries == {"provenance=true"}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_server_that_never_accepts_fails_closed_at_startup(
    transport: Transport, sales_catalogue: Catalogue
) -> None:
    # No answer ever comes, so the deadline ("in time") is all that can end this; how
    # soon a loaded machine gets round to it is no behaviour.
    with (
        FakeOPA(transport, accept=False) as fake,
        pytest.raises(PolicyUnavailable, match="in time"),
    ):
        PolicySidecar(sales_catalogue, opa_url=fake.address, timeout=TIMEOUT)


class _ThroughHttpx(httpx.BaseTransport):
    """capgate's transport behind httpx's request and response models: the path a
    client takes with any transport but its own."""

    def __init__(self, inner: DeadlineTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_direct_path_sends_what_httpx_sends(transport: Transport) -> None:
    """The client's hot path skips httpx's models; OPA must see the same request.

    Same method, path, query and header lines (names, values and order, the token
    included), and the same answer read back, as the same client sends through
    httpx's machinery.
    """
    document = {"result": {"ok": True}, "decision_id": "d-1"}
    with fake_opa(transport, {"/v1/data/capgate/probe": json_reply(document)}) as fake:
        uds = fake.address.removeprefix("unix://") if transport == "unix" else None
        direct = PolicyClient(fake.address, token="t0ken", timeout=ANSWER_TIMEOUT)
        through = PolicyClient(
            fake.address,
            token="t0ken",
            timeout=ANSWER_TIMEOUT,
            transport=_ThroughHttpx(DeadlineTransport(uds=uds)),
        )
        with direct, through:
            assert direct._edge._direct is not None
            assert through._edge._direct is None
            answers = [
                client.query("capgate/probe", {"a": [1, "b"]}) for client in (direct, through)
            ]
        first, second = fake.seen
    assert answers[0] == answers[1] == ({"ok": True}, "d-1")
    assert first == second
    sent = {name.lower(): value for name, value in first.headers}
    assert sent["authorization"] == "Bearer t0ken"
    assert sent["accept-encoding"] == "gzip"
    assert sent["content-type"] == "application/json"
    assert first.query == "provenance=true"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_deadline_covers_a_trickled_status_line_and_headers(transport: Transport) -> None:
    """The regression of issue #6: a header byte every 50 ms used to hold a call for
    as long as the server liked, as httpx times each read, not the exchange."""
    with FakeOPA(transport) as fake:
        fake.route(PHASES["startup"].path, KINDS["headers_trickled"](PHASES["startup"], ""))
        with (
            PolicyClient(fake.address, timeout=TIMEOUT) as client,
            pytest.raises(PolicyUnavailable, match="in time"),
        ):
            client.catalogue_digest()
    # Cut off before the answer was whole (the fake, stopped first, never played it to
    # its end), not how soon: a loaded machine is only later, and one that holds a
    # trickled byte back past the read timeout only ends the call sooner, still closed.
    assert PHASES["startup"].path not in fake.played


def test_cli_eval_reports_a_nested_answer_as_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``capgate eval`` used to print a RecursionError traceback for a nested answer."""
    facts = tmp_path / "compose.json"
    facts.write_text(FACTS.model_dump_json(), encoding="utf-8")
    with FakeOPA("unix") as fake:
        serve_well(fake)
        fake.route(PHASES["compose"].path, KINDS["nested_100000_deep"](PHASES["compose"], ""))
        code = main(
            ["eval", "compose", str(facts), "--catalogue", str(SALES), "--opa", fake.address,
             "--timeout", str(ANSWER_TIMEOUT)]
        )  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert "policy_unavailable" in err
    assert "nested too deeply" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["explain", "eval"])
def test_a_wedged_opa_fails_an_explanation_closed_naming_its_deadline(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """explain and eval compose ask about every tool: past that question's deadline
    (--timeout plus its allowance a tool) they fail closed, saying which question,
    the deadline, and how to allow more."""
    facts = tmp_path / "compose.json"
    facts.write_text(FACTS.model_dump_json(), encoding="utf-8")
    with FakeOPA("unix") as fake:
        serve_well(fake)
        fake.route("/v1/data/capgate/explain/compose", Reply.of(STALL))
        where = ["--catalogue", str(SALES), "--opa", fake.address, "--timeout", "0.2"]
        code = main([command, "compose", str(facts), *where])
        asked = [seen.path for seen in fake.seen]
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert asked[-1] == "/v1/data/capgate/explain/compose"
    assert "OPA did not answer capgate/explain/compose in time" in err
    assert "read timeout 0.214s (0.2s + 2 ms for each of 7 tools)" in err
    assert "whole answer 0.678s" in err
    assert "--timeout of the capgate command" in err
