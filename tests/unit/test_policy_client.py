"""PolicyClient without OPA: every malformed answer must fail closed.

Each failure case is an ``httpx.MockTransport`` handler; the assertions are that the
error is PolicyUnavailable, that its message and the DEBUG log hold no input value,
and that a well-formed answer parses with OPA's decision id attached.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gateway.errors import InvalidInput, PolicyUnavailable
from gateway.model.decisions import ComposeDecision, ExecuteDecision
from gateway.model.facts import ComposeInput, ExecuteInput
from gateway.opa.client import (
    CATALOGUE_DIGEST_PATH,
    COMPOSE_PATH,
    EXECUTE_PATH,
    PolicyClient,
)

Handler = Callable[[httpx.Request], httpx.Response]

SECRET = "sk-live-DO-NOT-LOG-4f9a1c"
DECISION_ID = "5f1c2f0e-0d8a-4c8e-9f7a-1b2c3d4e5f60"
DIGEST = "sha256:" + "ab" * 32

COMPOSE_FACTS: dict[str, Any] = {
    "principal": {"agent": "sales-bot", "role": "sales", "tenant": SECRET},
    "task": {
        "type": "customer_quote",
        "linked_resources": [{"type": "opportunity", "id": "opp-17"}],
    },
    "connections": {"crm": "active"},
    "environment": "production",
    "budget_class": "standard",
}
EXECUTE_FACTS: dict[str, Any] = {
    **COMPOSE_FACTS,
    "call": {
        "tool": "quote.prepare_send",
        "version": 1,
        "operation_id": "send-017",
        "subject": {"type": "opportunity", "id": "opp-17"},
        "params_digest": DIGEST,
    },
    "approval": {
        "kind": "exact_content_and_recipient",
        "tool": "quote.prepare_send",
        "operation_id": "send-017",
        "tenant": "acme",
        "digest": DIGEST,
        "expires_at": "2026-11-30T12:00:00Z",
        "approved_by": "founder",
    },
    "evidence": ["current_quote_revision"],
}

COMPOSE_RESULT: dict[str, Any] = {
    "visible": ["contact.read"],
    "excluded": {"quote.prepare_send": [{"code": "connection_revoked", "message": "m"}]},
}
EXECUTE_RESULT: dict[str, Any] = {
    "allow": True,
    "reasons": [],
    "obligations": [{"code": "pass_idempotency_key", "params": {"key": "send-017"}}],
}


def answer(document: Any, status: int = 200) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=document)

    return handler


def raw(body: bytes, status: int = 200) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body)

    return handler


def raising(exc_type: type[httpx.TransportError]) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc_type("simulated", request=request)

    return handler


def client_for(handler: Handler) -> PolicyClient:
    return PolicyClient("http://127.0.0.1:8181", transport=httpx.MockTransport(handler))


def compose_facts() -> ComposeInput:
    return ComposeInput.model_validate(COMPOSE_FACTS)


def execute_facts() -> ExecuteInput:
    return ExecuteInput.model_validate(EXECUTE_FACTS)


def ask(client: PolicyClient, question: str) -> object:
    if question == "compose":
        return client.compose(compose_facts())
    if question == "execute":
        return client.execute(execute_facts())
    return client.query(COMPOSE_PATH, {"token": SECRET})


# -- fail closed -----------------------------------------------------------------

TRANSPORT_FAILURES: dict[str, Handler] = {
    "connect_error": raising(httpx.ConnectError),
    "connect_timeout": raising(httpx.ConnectTimeout),
    "read_timeout": raising(httpx.ReadTimeout),
    "pool_timeout": raising(httpx.PoolTimeout),
    "remote_protocol_error": raising(httpx.RemoteProtocolError),
    "read_error": raising(httpx.ReadError),
}

ANSWER_FAILURES: dict[str, Handler] = {
    "http_500": answer({"code": "internal_error", "message": f"eval failed on {SECRET}"}, 500),
    "http_404": answer({"code": "resource_not_found"}, 404),
    "http_400": answer({"code": "invalid_parameter"}, 400),
    "http_302": raw(b"", 302),
    "http_204": raw(b"", 204),
    "not_json": raw(b"<html>proxy error</html>"),
    "not_utf8": raw(b"\xff\xfe\x00"),
    "empty_body": raw(b""),
    "json_array": answer([COMPOSE_RESULT]),
    "json_string": answer("allow"),
    "json_null": answer(None),
    "missing_result": answer({"decision_id": DECISION_ID}),
    "result_null": answer({"result": None}),
    "result_list": answer({"result": [COMPOSE_RESULT]}),
    "result_true": answer({"result": True}),
    "result_string": answer({"result": "allow"}),
    "decision_id_not_string": answer({"result": COMPOSE_RESULT, "decision_id": 7}),
}

COMPOSE_SHAPE_FAILURES: dict[str, Any] = {
    "visible_missing": {"excluded": {}},
    "excluded_missing": {"visible": []},
    "visible_string": {"visible": "contact.read", "excluded": {}},
    "visible_not_strings": {"visible": [1], "excluded": {}},
    "excluded_list": {"visible": [], "excluded": []},
    "reason_without_code": {"visible": [], "excluded": {"t": [{"message": "m"}]}},
    "reason_empty_code": {"visible": [], "excluded": {"t": [{"code": "", "message": "m"}]}},
    "extra_key": {"visible": [], "excluded": {}, "allow": True},
    "sets_decision_id": {"visible": [], "excluded": {}, "decision_id": "forged"},
}

EXECUTE_SHAPE_FAILURES: dict[str, Any] = {
    "allow_string_true": {**EXECUTE_RESULT, "allow": "true"},
    "allow_int": {**EXECUTE_RESULT, "allow": 1},
    "allow_null": {**EXECUTE_RESULT, "allow": None},
    "allow_missing": {"reasons": [], "obligations": []},
    "reasons_missing": {"allow": False, "obligations": []},
    "reasons_object": {"allow": False, "reasons": {"code": "x"}, "obligations": []},
    "obligations_missing": {"allow": True, "reasons": []},
    "obligation_without_code": {"allow": True, "reasons": [], "obligations": [{"params": {}}]},
    "extra_key": {**EXECUTE_RESULT, "ttl": 60},
    "reason_extra_key": {
        "allow": False,
        "reasons": [{"code": "x", "message": "m", "input": SECRET}],
        "obligations": [],
    },
    "sets_decision_id": {**EXECUTE_RESULT, "decision_id": "forged"},
}


@pytest.mark.parametrize(
    "handler",
    [*TRANSPORT_FAILURES.values(), *ANSWER_FAILURES.values()],
    ids=[*TRANSPORT_FAILURES, *ANSWER_FAILURES],
)
@pytest.mark.parametrize("question", ["compose", "execute", "query"])
def test_failure_raises_policy_unavailable_without_input(
    handler: Handler, question: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with client_for(handler) as client, pytest.raises(PolicyUnavailable) as info:
        ask(client, question)
    assert type(info.value) is PolicyUnavailable
    assert SECRET not in str(info.value)
    assert "capgate/" in str(info.value), "the message names the policy path"
    assert SECRET not in caplog.text


@pytest.mark.parametrize("result", COMPOSE_SHAPE_FAILURES.values(), ids=COMPOSE_SHAPE_FAILURES)
def test_compose_result_of_wrong_shape_fails_closed(result: dict[str, Any]) -> None:
    with (
        client_for(answer({"result": result, "decision_id": DECISION_ID})) as client,
        pytest.raises(PolicyUnavailable, match="capgate/compose/decision") as info,
    ):
        client.compose(compose_facts())
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("result", EXECUTE_SHAPE_FAILURES.values(), ids=EXECUTE_SHAPE_FAILURES)
def test_execute_result_of_wrong_shape_fails_closed(result: dict[str, Any]) -> None:
    with (
        client_for(answer({"result": result, "decision_id": DECISION_ID})) as client,
        pytest.raises(PolicyUnavailable, match="capgate/execute/decision") as info,
    ):
        client.execute(execute_facts())
    assert SECRET not in str(info.value)


def test_undefined_decision_says_so() -> None:
    with (
        client_for(answer({"decision_id": DECISION_ID})) as client,
        pytest.raises(PolicyUnavailable, match="undefined"),
    ):
        client.query(EXECUTE_PATH, {})


def test_status_error_names_opa_code_but_not_its_message() -> None:
    handler = answer({"code": "internal_error", "message": f"builtin failed on {SECRET}"}, 500)
    with client_for(handler) as client, pytest.raises(PolicyUnavailable) as info:
        client.query(EXECUTE_PATH, {})
    assert "HTTP 500" in str(info.value)
    assert "internal_error" in str(info.value)
    assert SECRET not in str(info.value)


def test_timeout_error_says_timeout() -> None:
    with (
        client_for(raising(httpx.ReadTimeout)) as client,
        pytest.raises(PolicyUnavailable, match="in time"),
    ):
        client.query(COMPOSE_PATH, {})


def test_connect_error_names_the_address() -> None:
    with (
        client_for(raising(httpx.ConnectError)) as client,
        pytest.raises(PolicyUnavailable, match=r"unreachable.*capgate/compose/decision"),
    ):
        client.query(COMPOSE_PATH, {})


def test_closed_client_fails_closed() -> None:
    client = client_for(answer({"result": COMPOSE_RESULT}))
    client.close()
    with pytest.raises(PolicyUnavailable, match="closed"):
        client.compose(compose_facts())
    assert client.health() is False


def test_input_that_is_not_json_is_rejected_before_opa() -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, json={"result": {}})

    with client_for(handler) as client:
        with pytest.raises(InvalidInput) as info:
            client.query(COMPOSE_PATH, {"x": float("nan"), "token": SECRET})
        with pytest.raises(InvalidInput):
            client.query(COMPOSE_PATH, {"x": object()})
    assert calls == []
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("path", ["", "/capgate", "capgate/../x", "capgate/x?y=1", "a//b"])
def test_malformed_path_is_refused(path: str) -> None:
    with (
        client_for(answer({"result": {}})) as client,
        pytest.raises(ValueError, match="policy path"),
    ):
        client.query(path, {})


# -- well-formed answers ---------------------------------------------------------


def test_compose_parses_and_attaches_decision_id() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"decision_id": DECISION_ID, "result": COMPOSE_RESULT})

    with client_for(handler) as client:
        decision = client.compose(compose_facts())

    assert isinstance(decision, ComposeDecision)
    assert decision.visible == ["contact.read"]
    assert decision.reasons_for("quote.prepare_send") == ["connection_revoked"]
    assert decision.decision_id == DECISION_ID
    assert len(requests) == 1, "one compose is exactly one OPA query"
    request = requests[0]
    assert request.method == "POST"
    assert request.url.path == "/v1/data/capgate/compose/decision"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {"input": compose_facts().model_dump(mode="json")}


def test_execute_parses_and_attaches_decision_id() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"decision_id": DECISION_ID, "result": EXECUTE_RESULT})

    with client_for(handler) as client:
        decision = client.execute(execute_facts())

    assert isinstance(decision, ExecuteDecision)
    assert decision.allow is True
    assert decision.obligations[0].params == {"key": "send-017"}
    assert decision.decision_id == DECISION_ID
    assert len(requests) == 1
    assert requests[0].url.path == "/v1/data/capgate/execute/decision"
    sent = json.loads(requests[0].content)["input"]
    assert sent == execute_facts().to_opa()
    assert sent["approval"]["expires_at"] == "2026-11-30T12:00:00Z"


def test_deny_parses() -> None:
    result = {"allow": False, "reasons": [{"code": "approval_expired", "message": "m"}]}
    handler = answer({"result": {**result, "obligations": []}, "decision_id": DECISION_ID})
    with client_for(handler) as client:
        decision = client.execute(execute_facts())
    assert decision.allow is False
    assert decision.reason_codes == ["approval_expired"]


def test_missing_decision_id_is_none() -> None:
    with client_for(answer({"result": COMPOSE_RESULT})) as client:
        assert client.compose(compose_facts()).decision_id is None


def test_query_returns_result_and_decision_id() -> None:
    with client_for(answer({"result": {"a": 1}, "decision_id": DECISION_ID})) as client:
        assert client.query("capgate/x", {}) == ({"a": 1}, DECISION_ID)


def test_debug_log_has_path_latency_and_decision_id_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="capgate.opa.client")
    handler = answer({"result": EXECUTE_RESULT, "decision_id": DECISION_ID})
    with client_for(handler) as client:
        client.execute(execute_facts())
    (record,) = [r for r in caplog.records if r.name == "capgate.opa.client"]
    assert record.levelno == logging.DEBUG
    assert EXECUTE_PATH in record.getMessage()
    assert DECISION_ID in record.getMessage()
    assert " ms" in record.getMessage()
    for value in (SECRET, "send-017", DIGEST, "quote.prepare_send"):
        assert value not in caplog.text


def test_requests_carry_the_configured_timeouts() -> None:
    seen: list[dict[str, float]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, json={"result": {}})

    client = PolicyClient(
        "http://127.0.0.1:8181",
        timeout=0.3,
        connect_timeout=0.1,
        transport=httpx.MockTransport(handler),
    )
    with client:
        client.query("capgate/x", {})
    assert seen == [{"connect": 0.1, "read": 0.3, "write": 0.3, "pool": 0.3}]


@pytest.mark.parametrize(("timeout", "connect_timeout"), [(0, 0.1), (0.5, -1)])
def test_timeouts_must_be_positive(timeout: float, connect_timeout: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        PolicyClient("http://127.0.0.1:8181", timeout=timeout, connect_timeout=connect_timeout)


# -- health and catalogue digest -------------------------------------------------


def test_health_asks_for_bundles() -> None:
    urls: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(request.url)
        return httpx.Response(200, json={})

    with client_for(handler) as client:
        assert client.health() is True
        assert client.health(bundles=False) is True
    assert urls[0].path == "/health"
    assert urls[0].params["bundles"] == "true"
    assert "bundles" not in urls[1].params


@pytest.mark.parametrize(
    "handler",
    [answer({"error": "not ready"}, 500), raising(httpx.ConnectError), raising(httpx.ReadTimeout)],
    ids=["http_500", "connect_error", "timeout"],
)
def test_health_is_false_rather_than_raising(handler: Handler) -> None:
    with client_for(handler) as client:
        assert client.health() is False


def test_catalogue_digest() -> None:
    urls: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(request.url)
        return httpx.Response(200, json={"result": DIGEST, "decision_id": DECISION_ID})

    with client_for(handler) as client:
        assert client.catalogue_digest() == DIGEST
    assert urls[0].path == f"/v1/data/{CATALOGUE_DIGEST_PATH}"


@pytest.mark.parametrize(
    "handler",
    [
        answer({"decision_id": DECISION_ID}),
        answer({"result": 42}),
        answer({"result": ""}),
        answer({"result": {"digest": DIGEST}}),
        answer({}, 500),
        raising(httpx.ConnectError),
    ],
    ids=["undefined", "number", "empty", "object", "http_500", "connect_error"],
)
def test_catalogue_digest_fails_closed(handler: Handler) -> None:
    with client_for(handler) as client, pytest.raises(PolicyUnavailable):
        client.catalogue_digest()


# -- addresses -------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "http://127.0.0.1:8181",
        "http://127.0.0.1:8181/",
        "http://127.0.0.1",
        "http://127.0.0.2:9000",
        "http://[::1]:8181",
        "unix:///tmp/opa.sock",
        "unix:///run/capgate/opa.sock",
    ],
)
def test_loopback_and_unix_addresses_are_accepted(address: str) -> None:
    PolicyClient(address).close()


@pytest.mark.parametrize(
    "address",
    [
        "http://10.0.0.1:8181",
        "http://192.168.1.5:8181",
        "http://0.0.0.0:8181",
        "http://[::]:8181",
        "http://example.com:8181",
        "http://localhost:8181",
        "http://127.0.0.1.nip.io:8181",
        "https://127.0.0.1:8181",
        "ftp://127.0.0.1:8181",
        "tcp://127.0.0.1:8181",
        "127.0.0.1:8181",
        "",
        "http://user:pw@127.0.0.1:8181",
        "http://127.0.0.1:8181/v1/data",
        "http://127.0.0.1:8181?x=1",
        "http://127.0.0.1:notaport",
        "unix://relative/opa.sock",
        "unix:opa.sock",
    ],
)
def test_other_addresses_are_refused(address: str) -> None:
    with pytest.raises(ValueError, match="OPA address"):
        PolicyClient(address)
