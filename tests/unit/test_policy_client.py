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

from capgate.gateway.errors import InvalidInput, PolicyUnavailable
from capgate.gateway.model.decisions import (
    MAX_PARAMS_DEPTH,
    ComposeDecision,
    ExecuteDecision,
    ReviewDecision,
)
from capgate.gateway.model.facts import ComposeInput, ExecuteInput, ReviewInput
from capgate.gateway.policy.client import (
    CATALOGUE_DIGEST_PATH,
    COMPOSE_PATH,
    EXECUTE_PATH,
    EXPLAIN_COMPOSE_PATH,
    EXPLAIN_EXECUTE_PATH,
    REVIEW_PATH,
    PolicyClient,
)
from capgate.gateway.policy.timeouts import (
    DEFAULT_TIMEOUT,
    PER_TOOL_TIMEOUT,
    whole_catalogue_timeout,
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
        "used": False,
    },
    "stage": "dispatch",
    "proposal": {"id": "pr-17", "status": "approved"},
    "budget": {"remaining": 40, "cost": 1},
    "evidence": ["current_quote_revision"],
}
REVIEW_FACTS: dict[str, Any] = {
    "reviewer": {
        "id": "maria",
        "role": "sales_manager",
        "tenant": SECRET,
        "authenticated_by": "test:fixture",
    },
    "proposal": {
        "id": "pr-17",
        "tenant": SECRET,
        "tool": "quote.prepare_send",
        "status": "pending",
        "proposer": {"agent": "sales-bot", "role": "sales", "tenant": SECRET},
    },
    "verdict": "approved",
}

CATALOGUE = "sha256:" + "cd" * 32
OTHER_CATALOGUE = "sha256:" + "ef" * 32
REVISION = "sha256:" + "12" * 32
OTHER_REVISION = "sha256:" + "34" * 32

COMPOSE_RESULT: dict[str, Any] = {
    "visible": ["contact.read"],
    "excluded": {"quote.prepare_send": [{"code": "connection_revoked", "message": "m"}]},
    "catalogue_digest": CATALOGUE,
}
EXECUTE_RESULT: dict[str, Any] = {
    "allow": True,
    "reasons": [],
    "obligations": [{"code": "pass_idempotency_key", "params": {"key": "send-017"}}],
    "catalogue_digest": CATALOGUE,
}
REVIEW_RESULT: dict[str, Any] = {"allow": True, "reasons": [], "catalogue_digest": CATALOGUE}
#: OPA 1.22.4's provenance for an embedded OPA: our bundle, and the generated one
#: that drops decision logs, which has no revision.
PROVENANCE: dict[str, Any] = {
    "version": "1.22.4",
    "build_commit": "",
    "build_timestamp": "",
    "build_hostname": "",
    "bundles": {"/tmp/b": {"revision": REVISION}, "/tmp/no-log": {"revision": ""}},
}


def answer(document: Any, status: int = 200) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=document)

    return handler


def raw(
    body: bytes,
    status: int = 200,
    headers: dict[str, str] | None = None,
    http_version: bytes = b"HTTP/1.1",
) -> Handler:
    """An answer of exactly these bytes, labelled as OPA labels JSON unless told."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status,
            content=body,
            headers={"Content-Type": "application/json", **(headers or {})},
            extensions={"http_version": http_version},
        )

    return handler


def raising(exc_type: type[httpx.TransportError]) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc_type("simulated", request=request)

    return handler


def client_for(handler: Handler, **pins: str) -> PolicyClient:
    return PolicyClient("http://127.0.0.1:8181", transport=httpx.MockTransport(handler), **pins)


def compose_facts() -> ComposeInput:
    return ComposeInput.model_validate(COMPOSE_FACTS)


def execute_facts() -> ExecuteInput:
    return ExecuteInput.model_validate(EXECUTE_FACTS)


def review_facts() -> ReviewInput:
    return ReviewInput.model_validate(REVIEW_FACTS)


#: A well-formed answer to each question.
RESULTS: dict[str, Any] = {
    "compose": COMPOSE_RESULT,
    "execute": EXECUTE_RESULT,
    "review": REVIEW_RESULT,
    "digest": CATALOGUE,
}


def ask(client: PolicyClient, question: str) -> object:
    if question == "compose":
        return client.compose(compose_facts())
    if question == "execute":
        return client.execute(execute_facts())
    if question == "review":
        return client.review(review_facts())
    if question == "digest":
        return client.catalogue_digest()
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
    "http_201_with_result": answer({"result": COMPOSE_RESULT}, 201),
    "http_1_0": raw(json.dumps({"result": COMPOSE_RESULT}).encode(), http_version=b"HTTP/1.0"),
    "content_type_html": raw(b'{"result": {}}', headers={"Content-Type": "text/html"}),
    "content_encoding_unknown": raw(b'{"result": {}}', headers={"Content-Encoding": "x-new"}),
    "content_length_over_cap": raw(b'{"result": {}}', headers={"Content-Length": str(1 << 40)}),
    "not_json": raw(b"<html>proxy error</html>"),
    "not_utf8": raw(b"\xff\xfe\x00"),
    # JSON text in OPA's answers is UTF-8: no other encoding, no byte-order mark, no
    # surrogate code point written as UTF-8 bytes.
    "utf16": raw(json.dumps({"result": COMPOSE_RESULT}).encode("utf-16")),
    "utf8_bom": raw(b"\xef\xbb\xbf" + json.dumps({"result": COMPOSE_RESULT}).encode()),
    "utf8_surrogate": raw(b'{"result": {}, "x": "\xed\xa0\x80"}'),
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
    "nan": raw(b'{"result": {"visible": [], "excluded": {}, "x": NaN}}'),
    "infinity": raw(b'{"result": {}, "n": -Infinity}'),
    "deeply_nested": raw(b'{"result": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "duplicate_result": raw(b'{"result": null, "result": {}}'),
    "provenance_not_object": answer({"result": COMPOSE_RESULT, "provenance": []}),
    "provenance_version_number": answer({"result": {}, "provenance": {"version": 1}}),
    "provenance_bundles_list": answer({"result": {}, "provenance": {"bundles": []}}),
    "provenance_bundle_string": answer({"result": {}, "provenance": {"bundles": {"b": "r"}}}),
    "provenance_revision_number": answer(
        {"result": {}, "provenance": {"bundles": {"b": {"revision": 1}}}}
    ),
}

COMPOSE_SHAPE_FAILURES: dict[str, Any] = {
    "visible_missing": {"excluded": {}},
    "excluded_missing": {"visible": []},
    "visible_string": {"visible": "contact.read", "excluded": {}},
    "visible_not_strings": {"visible": [1], "excluded": {}},
    "excluded_list": {"visible": [], "excluded": []},
    "reason_without_code": {"visible": [], "excluded": {"t": [{"message": "m"}]}},
    "reason_empty_code": {"visible": [], "excluded": {"t": [{"code": "", "message": "m"}]}},
    "extra_key": {**COMPOSE_RESULT, "allow": True},
    "sets_decision_id": {**COMPOSE_RESULT, "decision_id": "forged"},
    "sets_bundle_revisions": {**COMPOSE_RESULT, "bundle_revisions": {"b": REVISION}},
    "sets_opa_version": {**COMPOSE_RESULT, "opa_version": "9.9.9"},
    "catalogue_digest_missing": {"visible": [], "excluded": {}},
    "catalogue_digest_null": {**COMPOSE_RESULT, "catalogue_digest": None},
    "catalogue_digest_empty": {**COMPOSE_RESULT, "catalogue_digest": ""},
    "catalogue_digest_not_a_digest": {**COMPOSE_RESULT, "catalogue_digest": "v1"},
}


def _deep(depth: int) -> Any:
    """A value nested ``depth`` lists deep, built without recursion."""
    value: Any = "k"
    for _ in range(depth):
        value = [value]
    return value


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
    "sets_bundle_revisions": {**EXECUTE_RESULT, "bundle_revisions": {}},
    "sets_opa_version": {**EXECUTE_RESULT, "opa_version": "1.22.4"},
    "catalogue_digest_missing": {
        k: v for k, v in EXECUTE_RESULT.items() if k != "catalogue_digest"
    },
    "catalogue_digest_number": {**EXECUTE_RESULT, "catalogue_digest": 1},
    "catalogue_digest_empty": {**EXECUTE_RESULT, "catalogue_digest": ""},
    "params_too_deep": {
        **EXECUTE_RESULT,
        "obligations": [{"code": "pass_idempotency_key", "params": {"key": _deep(500)}}],
    },
}


@pytest.mark.parametrize(
    "handler",
    [*TRANSPORT_FAILURES.values(), *ANSWER_FAILURES.values()],
    ids=[*TRANSPORT_FAILURES, *ANSWER_FAILURES],
)
@pytest.mark.parametrize("question", ["compose", "execute", "review", "query"])
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


REVIEW_SHAPE_FAILURES: dict[str, Any] = {
    "allow_string_true": {**REVIEW_RESULT, "allow": "true"},
    "allow_int": {**REVIEW_RESULT, "allow": 1},
    "allow_missing": {"reasons": [], "catalogue_digest": CATALOGUE},
    "reasons_missing": {"allow": True, "catalogue_digest": CATALOGUE},
    "reasons_object": {**REVIEW_RESULT, "reasons": {"code": "x"}},
    "obligations_given": {**REVIEW_RESULT, "obligations": []},
    "extra_key": {**REVIEW_RESULT, "verdict": "approved"},
    "sets_decision_id": {**REVIEW_RESULT, "decision_id": "forged"},
    "sets_bundle_revisions": {**REVIEW_RESULT, "bundle_revisions": {}},
    "catalogue_digest_missing": {"allow": True, "reasons": []},
    "catalogue_digest_empty": {**REVIEW_RESULT, "catalogue_digest": ""},
}


@pytest.mark.parametrize("result", REVIEW_SHAPE_FAILURES.values(), ids=REVIEW_SHAPE_FAILURES)
def test_review_result_of_wrong_shape_fails_closed(result: dict[str, Any]) -> None:
    with (
        client_for(answer({"result": result, "decision_id": DECISION_ID})) as client,
        pytest.raises(PolicyUnavailable, match="capgate/review/decision") as info,
    ):
        client.review(review_facts())
    assert SECRET not in str(info.value)


# -- ambiguous answers: a repeated key anywhere -------------------------------------

# Each body is read by Python's json (last key wins) as an allow, or as the good
# answer; a reader keeping the first key would read something else. Before the fix
# the first of these ran the tool.
_ALLOW = json.dumps(EXECUTE_RESULT)[1:-1]
DUPLICATE_KEY_BODIES: dict[str, bytes] = {
    "allow_false_then_true": f'{{"result": {{"allow": false, {_ALLOW}}}}}'.encode(),
    "two_results": (
        f'{{"result": {{"allow": false, "reasons": [], "obligations": [], '
        f'"catalogue_digest": "{CATALOGUE}"}}, "result": {{{_ALLOW}}}}}'
    ).encode(),
    "escaped_duplicate": f'{{"result": {{"\\u0061llow": false, {_ALLOW}}}}}'.encode(),
    "in_obligation_params": (
        b'{"result": {"allow": true, "reasons": [], "catalogue_digest": "'
        + CATALOGUE.encode()
        + b'", "obligations": [{"code": "pass_idempotency_key",'
        b' "params": {"key": "other-op", "key": "send-017"}}]}}'
    ),
    "in_an_obligation": (
        b'{"result": {"allow": true, "reasons": [], "catalogue_digest": "'
        + CATALOGUE.encode()
        + b'", "obligations": [{"code": "notify_regulator", "code": "pass_idempotency_key",'
        b' "params": {"key": "send-017"}}]}}'
    ),
    "in_provenance": (
        f'{{"result": {{{_ALLOW}}}, "provenance": {{"bundles": '
        f'{{"b": {{"revision": "{OTHER_REVISION}", "revision": "{REVISION}"}}}}}}}}'
    ).encode(),
    "decision_id": f'{{"decision_id": "a", "decision_id": "b", "result": {{{_ALLOW}}}}}'.encode(),
}


@pytest.mark.parametrize("body", DUPLICATE_KEY_BODIES.values(), ids=DUPLICATE_KEY_BODIES)
def test_a_repeated_key_anywhere_fails_closed(body: bytes) -> None:
    with (
        client_for(raw(body), expected_catalogue=CATALOGUE) as client,
        pytest.raises(PolicyUnavailable, match="repeats a key") as info,
    ):
        client.execute(execute_facts())
    assert "capgate/execute/decision" in str(info.value)


@pytest.mark.parametrize("body", DUPLICATE_KEY_BODIES.values(), ids=DUPLICATE_KEY_BODIES)
def test_each_repeated_key_body_is_an_allow_to_a_last_key_wins_reader(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the test above guards against: with plain json.loads, each is obeyed."""
    monkeypatch.setattr("capgate.gateway.policy.answer._loads", json.loads)
    with client_for(raw(body), expected_catalogue=CATALOGUE) as client:
        assert client.execute(execute_facts()).allow is True


def test_a_repeated_key_fails_closed_for_every_question() -> None:
    digest = b'{"result": "sha256:bad", "result": "' + CATALOGUE.encode() + b'"}'
    compose = (
        b'{"result": {"visible": [], "visible": ["contact.read"], "excluded": {},'
        b' "catalogue_digest": "' + CATALOGUE.encode() + b'"}}'
    )
    with client_for(raw(digest)) as client, pytest.raises(PolicyUnavailable, match="repeats"):
        client.catalogue_digest()
    with client_for(raw(compose)) as client, pytest.raises(PolicyUnavailable, match="repeats"):
        client.compose(compose_facts())


def test_keys_that_differ_only_in_case_are_not_duplicates() -> None:
    body = json.dumps({"result": EXECUTE_RESULT, "Result": None, "RESULT": 1}).encode()
    with client_for(raw(body)) as client:
        assert client.execute(execute_facts()).allow is True


# -- nesting ---------------------------------------------------------------------


@pytest.mark.parametrize("question", ["compose", "execute", "digest"])
def test_deep_nesting_is_policy_unavailable_not_recursion_error(question: str) -> None:
    body = b'{"result": {"visible": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    with client_for(raw(body)) as client, pytest.raises(PolicyUnavailable, match="too deeply"):
        ask(client, question)


def test_status_error_with_a_deeply_nested_body_names_the_status() -> None:
    body = b'{"code": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with client_for(raw(body, 500)) as client, pytest.raises(PolicyUnavailable, match="HTTP 500"):
        client.query(EXECUTE_PATH, {})


def test_obligation_params_up_to_the_depth_limit_are_accepted() -> None:
    params = {"key": "send-017", "trace": _deep(MAX_PARAMS_DEPTH - 1)}
    result = {**EXECUTE_RESULT, "obligations": [{"code": "pass_idempotency_key", "params": params}]}
    with client_for(answer({"result": result})) as client:
        assert client.execute(execute_facts()).obligations[0].params == params
    too_deep = {**params, "trace": _deep(MAX_PARAMS_DEPTH)}
    result["obligations"] = [{"code": "pass_idempotency_key", "params": too_deep}]
    with (
        client_for(answer({"result": result})) as client,
        pytest.raises(PolicyUnavailable, match=r"obligations\.0\.params"),
    ):
        client.execute(execute_facts())


# -- provenance: the catalogue digest and bundle revision a decision was made under --


@pytest.mark.parametrize("question", ["compose", "execute", "review"])
def test_a_decision_under_another_catalogue_fails_closed_naming_both(question: str) -> None:
    result = RESULTS[question]
    handler = answer({"result": {**result, "catalogue_digest": OTHER_CATALOGUE}})
    with (
        client_for(handler, expected_catalogue=CATALOGUE) as client,
        pytest.raises(PolicyUnavailable) as info,
    ):
        ask(client, question)
    assert OTHER_CATALOGUE in str(info.value)
    assert CATALOGUE in str(info.value)
    assert f"capgate/{question}/decision" in str(info.value)


@pytest.mark.parametrize("question", ["compose", "execute", "review"])
def test_a_decision_under_the_expected_catalogue_carries_its_provenance(question: str) -> None:
    result = RESULTS[question]
    handler = answer({"result": result, "decision_id": DECISION_ID, "provenance": PROVENANCE})
    with client_for(handler, expected_catalogue=CATALOGUE, expected_revision=REVISION) as client:
        decision = ask(client, question)
    assert isinstance(decision, ComposeDecision | ExecuteDecision | ReviewDecision)
    assert decision.catalogue_digest == CATALOGUE
    assert decision.bundle_revisions == {"/tmp/b": REVISION, "/tmp/no-log": ""}
    assert decision.opa_version == "1.22.4"
    assert decision.decision_id == DECISION_ID


def test_without_pins_any_catalogue_and_revision_is_recorded() -> None:
    provenance = {"version": "1.22.4", "bundles": {"remote": {"revision": "git-4f2a"}}}
    result = {**EXECUTE_RESULT, "catalogue_digest": OTHER_CATALOGUE}
    with client_for(answer({"result": result, "provenance": provenance})) as client:
        decision = client.execute(execute_facts())
    assert decision.catalogue_digest == OTHER_CATALOGUE
    assert decision.bundle_revisions == {"remote": "git-4f2a"}


def test_an_answer_without_provenance_has_no_revisions() -> None:
    with client_for(answer({"result": EXECUTE_RESULT}), expected_catalogue=CATALOGUE) as client:
        decision = client.execute(execute_facts())
    assert decision.bundle_revisions == {}
    assert decision.opa_version is None


@pytest.mark.parametrize(
    "bundles",
    [
        {"/tmp/b": {"revision": OTHER_REVISION}},
        {"/tmp/b": {"revision": REVISION}, "/tmp/extra": {"revision": OTHER_REVISION}},
        {"/tmp/b": {"revision": ""}},
        {"/tmp/b": {}},
        {},
        None,
    ],
    ids=["other", "other_beside_pinned", "empty", "no_revision", "no_bundles", "no_provenance"],
)
@pytest.mark.parametrize("question", ["compose", "execute", "review", "digest"])
def test_a_pinned_revision_must_be_the_only_one_reported(
    bundles: dict[str, Any] | None, question: str
) -> None:
    result: Any = RESULTS[question]
    document: dict[str, Any] = {"result": result}
    if bundles is not None:
        document["provenance"] = {"version": "1.22.4", "bundles": bundles}
    with (
        client_for(answer(document), expected_revision=REVISION) as client,
        pytest.raises(PolicyUnavailable, match="revision") as info,
    ):
        ask(client, question)
    assert REVISION in str(info.value)
    if bundles and OTHER_REVISION in json.dumps(bundles):
        assert OTHER_REVISION in str(info.value)


def test_a_long_foreign_revision_is_cut_short_in_the_message() -> None:
    provenance = {"bundles": {"b": {"revision": "r" * 10_000}}}
    with (
        client_for(
            answer({"result": {}, "provenance": provenance}), expected_revision=REVISION
        ) as client,
        pytest.raises(PolicyUnavailable) as info,
    ):
        client.query(COMPOSE_PATH, {})
    assert len(str(info.value)) < 400


def test_every_query_asks_for_provenance() -> None:
    urls: list[httpx.URL] = []

    def handler(request: httpx.Request) -> httpx.Response:
        urls.append(request.url)
        result = CATALOGUE if "meta" in request.url.path else EXECUTE_RESULT
        return httpx.Response(200, json={"result": result})

    with client_for(handler) as client:
        client.execute(execute_facts())
        client.catalogue_digest()
        client.query("capgate/x", {})
    assert [url.params.get("provenance") for url in urls] == ["true"] * 3


@pytest.mark.parametrize("pin", ["expected_catalogue", "expected_revision"])
def test_an_empty_pin_is_refused(pin: str) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        PolicyClient("http://127.0.0.1:8181", **{pin: ""})


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
    assert request.url.query == b"provenance=true"
    assert request.headers["accept-encoding"] == "gzip"
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
    assert sent["approval"]["used"] is False
    assert sent["stage"] == "dispatch"
    assert sent["budget"] == {"remaining": 40, "cost": 1}
    assert sent["proposal"] == {"id": "pr-17", "status": "approved"}


def test_review_parses_and_attaches_decision_id() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(200, json={"decision_id": DECISION_ID, "result": REVIEW_RESULT})

    with client_for(handler, expected_catalogue=CATALOGUE) as client:
        decision = client.review(review_facts())

    assert isinstance(decision, ReviewDecision)
    assert decision.allow is True
    assert decision.decision_id == DECISION_ID
    assert len(requests) == 1
    assert requests[0].url.path == "/v1/data/capgate/review/decision"
    assert requests[0].url.query == b"provenance=true"
    assert json.loads(requests[0].content) == {"input": review_facts().to_opa()}


def test_review_deny_parses() -> None:
    result = {
        "allow": False,
        "reasons": [
            {"code": "self_review", "message": "m"},
            {"code": "reviewer_not_permitted", "message": "m"},
        ],
        "catalogue_digest": CATALOGUE,
    }
    with client_for(answer({"result": result})) as client:
        decision = client.review(review_facts())
    assert decision.allow is False
    assert decision.reason_codes == ["reviewer_not_permitted", "self_review"]


def test_deny_parses() -> None:
    result = {
        "allow": False,
        "reasons": [{"code": "approval_expired", "message": "m"}],
        "catalogue_digest": CATALOGUE,
    }
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


def read_timeouts(catalogue_size: int | None, timeout: float = DEFAULT_TIMEOUT) -> dict[str, float]:
    """The read timeout each question of a client is sent with (every answer a timeout,
    so no question needs a well-formed answer to be asked)."""
    seen: dict[str, float] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen[request.url.path.removeprefix("/v1/data/")] = request.extensions["timeout"]["read"]
        raise httpx.ReadTimeout("simulated", request=request)

    client = PolicyClient(
        "http://127.0.0.1:8181",
        timeout=timeout,
        transport=httpx.MockTransport(handler),
        catalogue_size=catalogue_size,
    )
    with client:
        for question in (
            lambda: client.compose(compose_facts()),
            lambda: client.execute(execute_facts()),
            lambda: client.review(review_facts()),
            lambda: client.explain_compose(compose_facts()),
            lambda: client.explain_execute(execute_facts()),
        ):
            with pytest.raises(PolicyUnavailable, match="in time"):
                question()
    return seen


def test_a_question_about_every_tool_is_allowed_time_in_proportion_to_the_catalogue() -> None:
    small, large = read_timeouts(1_000), read_timeouts(10_000)
    allowance = {
        size: timeouts[EXPLAIN_COMPOSE_PATH] - DEFAULT_TIMEOUT
        for size, timeouts in ((1_000, small), (10_000, large))
    }
    assert allowance[1_000] >= 1_000 * PER_TOOL_TIMEOUT > 0
    assert allowance[10_000] == pytest.approx(10 * allowance[1_000])
    assert large[EXPLAIN_COMPOSE_PATH] == whole_catalogue_timeout(DEFAULT_TIMEOUT, 10_000)
    # --timeout (timeout=) raises the base of the scaled timeout too.
    raised = read_timeouts(1_000, timeout=3.0)
    assert raised[EXPLAIN_COMPOSE_PATH] == pytest.approx(3.0 + allowance[1_000])


def test_the_questions_an_agent_waits_on_keep_the_short_timeout_at_any_size() -> None:
    # A hung OPA must still fail an agent's call closed within about a second.
    for size in (None, 0, 10_000):
        timeouts = read_timeouts(size)
        for path in (COMPOSE_PATH, EXECUTE_PATH, REVIEW_PATH, EXPLAIN_EXECUTE_PATH):
            assert timeouts[path] == DEFAULT_TIMEOUT, (size, path)
    # Without the catalogue's size a whole-catalogue question gets no allowance.
    assert read_timeouts(None)[EXPLAIN_COMPOSE_PATH] == DEFAULT_TIMEOUT


def test_a_timeout_names_the_question_its_limits_and_how_to_raise_them() -> None:
    client = PolicyClient(
        "http://127.0.0.1:8181",
        transport=httpx.MockTransport(raising(httpx.ReadTimeout)),
        catalogue_size=1_000,
    )
    with client:
        with pytest.raises(PolicyUnavailable) as composed:
            client.compose(compose_facts(), reasons=True)
        with pytest.raises(PolicyUnavailable) as explained:
            client.explain_compose(compose_facts())
    # compose itself timed out first, with the short limits of an agent's question.
    assert str(composed.value).startswith(
        f"OPA did not answer {COMPOSE_PATH} in time (ReadTimeout;"
    )
    assert "read timeout 0.5s, connect 0.25s, whole answer 1.25s" in str(composed.value)
    message = str(explained.value)
    assert EXPLAIN_COMPOSE_PATH in message
    assert "read timeout 2.5s (0.5s + 2 ms for each of 1000 tools)" in message
    assert "whole answer 5.25s" in message
    assert "--timeout" in message
    assert "timeout=" in message


def test_a_catalogue_size_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="catalogue_size"):
        PolicyClient("http://127.0.0.1:8181", catalogue_size=-1)
    with pytest.raises(ValueError, match="fewer than 0"):
        whole_catalogue_timeout(DEFAULT_TIMEOUT, -1)


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


# -- readiness and the bearer token (a locked-down OPA, docs/deployment.md) ------------


@pytest.mark.parametrize(
    ("handler", "ready"),
    [
        (answer({}), True),
        (answer({"code": "internal_error"}, status=500), False),  # a bundle not active yet
        (answer({"code": "unauthorized"}, status=401), False),
        (raising(httpx.ConnectError), False),
        (raising(httpx.ReadTimeout), False),
    ],
)
def test_ready_is_health_with_every_bundle_active(handler: Handler, ready: bool) -> None:
    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    with client_for(recording) as client:
        assert client.ready() is ready
    assert [(r.method, r.url.path, r.url.query) for r in seen] == [
        ("GET", "/health", b"bundles=true")
    ]


def test_the_bearer_token_goes_with_decisions_and_health_and_nowhere_else() -> None:
    token = "tok-" + "a" * 40
    seen: list[httpx.Request] = []

    def opa(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/health":
            return httpx.Response(200, json={})
        return httpx.Response(200, json={"decision_id": DECISION_ID, "result": DIGEST})

    transport = httpx.MockTransport(opa)
    with PolicyClient("http://127.0.0.1:8181", transport=transport, token=token) as client:
        assert client.ready()
        assert client.catalogue_digest() == DIGEST
        assert token not in repr(client)
    assert {r.headers.get("Authorization") for r in seen} == {f"Bearer {token}"}
    with PolicyClient("http://127.0.0.1:8181", transport=transport) as client:
        assert client.catalogue_digest() == DIGEST
    assert "Authorization" not in seen[-1].headers


def test_each_round_trip_is_told_to_the_exchange_observer_without_the_input() -> None:
    import dataclasses

    from capgate.gateway.policy.client import Exchange

    heard: list[Exchange] = []
    documents = iter(
        [
            {"result": EXECUTE_RESULT, "decision_id": "d-1", "provenance": PROVENANCE},
            None,  # then OPA fails: 500
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        document = next(documents)
        return httpx.Response(500 if document is None else 200, json=document or {})

    client = PolicyClient(
        "http://127.0.0.1:8181", transport=httpx.MockTransport(handler), on_exchange=heard.append
    )
    client.execute(execute_facts())
    with pytest.raises(PolicyUnavailable):
        client.compose(compose_facts())
    assert [(e.question, e.answered) for e in heard] == [("execute", True), ("compose", False)]
    assert all(e.seconds >= 0 for e in heard)
    # An observer hears which question, how long and whether OPA answered: no facts.
    assert [f.name for f in dataclasses.fields(Exchange)] == ["question", "seconds", "answered"]
