"""Webhook notices without a network or a store: signing, checking, settings, events.

- A notice signed by :func:`signature_header` passes :func:`verify_notice`; a changed
  body, a changed timestamp, another secret, a missing or malformed header, a time
  outside the window and a second copy of an id are each refused with their own code.
- The settings refuse what they must, naming the field: a URL that is not http(s),
  carries credentials or a fragment, a secret in place of a variable's name, an
  event named twice or unknown, a backoff that shrinks; a secret that is unset or
  short fails at start, naming the variable and never a value.
- Which ledger rows become which events, and what a body holds (never content).
- How an answer is judged (2xx delivered; 5xx, 408, 429 and network errors retried;
  3xx and other 4xx failed for good), through httpx's MockTransport.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from capgate import NoticeRejected, NoticeSettings, Notifier, verify_notice
from capgate.adapters.fronts.mcp.config import parse_config
from capgate.gateway.errors import (
    ConfigError,
    NoticeOutsideWindow,
    NoticeReplayed,
    NoticeSignatureInvalid,
)
from capgate.gateway.model.facts import Principal
from capgate.gateway.service.notices.events import event_id, event_type, notice_body
from capgate.gateway.service.notices.settings import EVENT_TYPES, TenantWebhook
from capgate.gateway.service.notices.signing import sign_notice, signature_header
from capgate.gateway.state.records import LedgerRow, ProposalRecord, ProposalStatus

SECRET = "s" * 40
NOW = 1_900_000_000
BODY = b'{"id":"evt_1","type":"proposal.created"}'


def _headers(body: bytes = BODY, *, at: int = NOW, secret: str = SECRET) -> dict[str, str]:
    return {
        "Capgate-Signature": signature_header(secret, at, body),
        "Capgate-Event-Id": "evt_1",
    }


# -- signing and checking --------------------------------------------------------------


def test_a_signed_notice_passes_and_its_event_comes_back() -> None:
    seen: set[str] = set()
    event = verify_notice(SECRET, _headers(), BODY, now=NOW + 10, seen=seen)
    assert event == {"id": "evt_1", "type": "proposal.created"}
    assert seen == {"evt_1"}


def test_the_signed_bytes_are_the_timestamp_a_dot_and_the_body() -> None:
    import hashlib
    import hmac

    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign_notice(SECRET, NOW, BODY) == expected
    assert signature_header(SECRET, NOW, BODY) == f"t={NOW},v1={expected}"


@pytest.mark.parametrize(
    ("headers", "body", "match"),
    [
        (_headers(), BODY.replace(b"created", b"approved"), "no v1 signature matches"),
        (
            {"capgate-signature": _headers()["Capgate-Signature"].replace(f"{NOW}", f"{NOW + 1}")},
            BODY,
            "no v1 signature matches",
        ),
        (_headers(secret="t" * 40), BODY, "no v1 signature matches"),
        ({}, BODY, "no capgate-signature header"),
        ({"capgate-signature": "v1=abc"}, BODY, "no t="),
        ({"capgate-signature": f"t={NOW}"}, BODY, "no v1="),
        ({"capgate-signature": f"t=soon,v1={'0' * 64}"}, BODY, "t is not unix seconds"),
        ({"capgate-signature": f"t={NOW},t={NOW},v1=0"}, BODY, "t is given twice"),
        ({"capgate-signature": "garbage"}, BODY, "is not key=value"),
        ({**_headers(), "Capgate-Event-Id": "evt_2"}, BODY, "not the signed body's id"),
    ],
    ids=[
        "tampered-body", "tampered-timestamp", "wrong-secret", "missing-header", "no-t",
        "no-v1", "t-not-a-number", "t-twice", "malformed", "event-id-header-changed",
    ],
)  # fmt: skip
def test_a_changed_or_unsigned_notice_is_refused(
    headers: dict[str, str], body: bytes, match: str
) -> None:
    seen: set[str] = set()
    with pytest.raises(NoticeSignatureInvalid, match=match) as refused:
        verify_notice(SECRET, headers, body, now=NOW, seen=seen)
    assert refused.value.code == "notice_signature_invalid"
    assert isinstance(refused.value, NoticeRejected)
    assert seen == set()  # nothing unauthenticated is remembered
    assert SECRET not in str(refused.value)


def test_a_signed_body_that_is_not_an_event_is_refused() -> None:
    for body in (b"not json", b"[1, 2]", b'{"type": "x"}'):
        with pytest.raises(NoticeSignatureInvalid, match=r"not JSON|not an event"):
            verify_notice(SECRET, _headers(body), body, now=NOW)


@pytest.mark.parametrize("offset", [-301, 301, -86_400])
def test_a_notice_signed_outside_the_window_is_refused(offset: int) -> None:
    with pytest.raises(NoticeOutsideWindow, match="outside the 300 s window") as refused:
        verify_notice(SECRET, _headers(at=NOW + offset), BODY, now=NOW)
    assert refused.value.code == "notice_outside_window"
    # ... and a wider window takes it.
    assert verify_notice(SECRET, _headers(at=NOW + offset), BODY, now=NOW, window_seconds=90_000)


def test_a_second_copy_of_an_id_is_a_replay() -> None:
    seen: set[str] = set()
    verify_notice(SECRET, _headers(), BODY, now=NOW, seen=seen)
    # The same request again, or re-signed later (the gateway delivering again).
    for headers in (_headers(), _headers(at=NOW + 5)):
        with pytest.raises(NoticeReplayed, match="received already") as replayed:
            verify_notice(SECRET, headers, BODY, now=NOW + 5, seen=seen)
        assert replayed.value.code == "notice_replayed"


def test_a_rotating_receiver_accepts_either_signature_and_any_header_case() -> None:
    old, new = "o" * 40, "n" * 40
    header = f"t={NOW},v1={sign_notice(old, NOW, BODY)},v1={sign_notice(new, NOW, BODY)}"
    for secret in (old, new):
        assert verify_notice(secret, {"CAPGATE-SIGNATURE": header}, BODY, now=NOW)["id"] == "evt_1"


def test_the_body_must_be_the_bytes_received() -> None:
    with pytest.raises(TypeError, match="bytes as received"):
        verify_notice(SECRET, _headers(), json.loads(BODY), now=NOW)


# -- settings ---------------------------------------------------------------------------


def _config(notices: str) -> str:
    return f"tools: capgate.demo.tools:SalesDesk\nnotices:\n{notices}"


HOOK = "https://hooks.acme.example/capgate"
GOOD = """  inbox_url: https://capgate.example/inbox/
  tenants:
    acme:
      url: https://hooks.acme.example/capgate
      secret_env: CAPGATE_NOTICE_SECRET_ACME
"""


def test_a_notices_section_is_read_with_its_defaults() -> None:
    config = parse_config(_config(GOOD))
    assert config.notices is not None
    hook = config.notices.tenants["acme"]
    assert hook.events == list(EVENT_TYPES)
    assert (hook.max_attempts, hook.timeout_seconds) == (8, 5.0)
    assert config.notices.link("prop-1") == "https://capgate.example/inbox/proposals/prop-1"
    assert parse_config("tools: capgate.demo.tools:SalesDesk\n").notices is None


@pytest.mark.parametrize(
    ("change", "field", "match"),
    [
        ((HOOK, "ftp://hooks.acme.example/"), "url", "http:// or https://"),
        ((HOOK, "file:///etc/passwd"), "url", "http:// or https://"),
        ((HOOK, "https://u:p@hooks.acme.example/"), "url", "user or password"),
        ((HOOK, "https://hooks.acme.example/#x"), "url", "fragment"),
        (("https://capgate.example/inbox/", "javascript:alert(1)"), "inbox_url", "http://"),
        (("CAPGATE_NOTICE_SECRET_ACME", "hunter2-the-secret"), "secret_env", "not the secret"),
    ],
    ids=["ftp", "file", "credentials", "fragment", "inbox-scheme", "secret-inline"],
)  # fmt: skip
def test_a_bad_setting_is_refused_naming_its_field(
    change: tuple[str, str], field: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=match) as refused:
        parse_config(_config(GOOD.replace(*change)), "serve.yaml")
    assert f"notices.{'tenants.acme.' if field != 'inbox_url' else ''}{field}" in str(refused.value)
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("      events: [proposal.created, proposal.created]\n", "named twice"),
        ("      events: [proposal.exploded]\n", "events"),
        ("      events: []\n", "events"),
        ("      first_backoff_seconds: 10\n      longest_backoff_seconds: 1\n", "below"),
        ("      max_attempts: 0\n", "max_attempts"),
        ("      secret: inline\n", "secret"),
    ],
    ids=["twice", "unknown-event", "no-events", "shrinking-backoff", "no-attempts", "unknown-key"],
)
def test_a_bad_webhook_is_refused(extra: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_config(_config(GOOD + extra))


def test_a_missing_or_short_secret_fails_at_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = TenantWebhook(url="http://127.0.0.1:9/", secret_env="CAPGATE_TEST_NOTICE_SECRET")
    monkeypatch.delenv("CAPGATE_TEST_NOTICE_SECRET", raising=False)
    with pytest.raises(ConfigError, match=r"\$CAPGATE_TEST_NOTICE_SECRET is not set"):
        hook.secret("acme")
    monkeypatch.setenv("CAPGATE_TEST_NOTICE_SECRET", "short-secret")
    with pytest.raises(ConfigError, match="fewer than 32 bytes") as refused:
        hook.secret("acme")
    assert "short-secret" not in str(refused.value)
    monkeypatch.setenv("CAPGATE_TEST_NOTICE_SECRET", SECRET)
    assert hook.secret("acme") == SECRET.encode()


# -- events -----------------------------------------------------------------------------

AT = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
PROPOSAL = ProposalRecord(
    id="prop-1",
    tenant="acme",
    task_id="task-1",
    proposer=Principal(agent="sales-bot", role="sales", tenant="acme"),
    environment="production",
    task={"type": "customer_quote", "id": "task-1"},
    tool="quote.prepare_send",
    contract_version=1,
    execution_action="quote.dispatch_reviewed",
    params={"recipient": "ada@example.test", "body": "Dear Ada, the secret price is 42"},
    params_digest="sha256:" + "ab" * 32,
    operation_id="op-1",
    decision_id=None,
    status=ProposalStatus.PENDING,
    created_at=AT,
    updated_at=AT,
)


def _row(
    kind: str, outcome: str | None, *, proposal: str | None = "prop-1", **more: Any
) -> LedgerRow:
    return LedgerRow(
        seq=7, at=AT, prev_hash="sha256:" + "0" * 64, hash="sha256:" + "12" * 32, kind=kind,
        tenant="acme", principal="maria/sales_manager", tool="quote.prepare_send",
        operation_id="op-1", proposal_id=proposal, outcome=outcome, **more,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "outcome", "event"),
    [
        ("proposal", "pending", "proposal.created"),
        ("review", "approved", "proposal.approved"),
        ("review", "rejected", "proposal.rejected"),
        ("review", "refused", None),
        ("dispatch", "dispatched", "proposal.dispatched"),
        ("dispatch", "blocked", "proposal.blocked"),
        ("outcome", "success", "proposal.outcome"),
        ("lookup", "success", "proposal.outcome"),
        ("lookup", "unknown", None),
        ("worker", "given_up", "proposal.given_up"),
        ("intent", "running", None),
        ("decision", "deny", None),
        ("notice", "failed", None),
    ],
)
def test_which_rows_are_notices(kind: str, outcome: str, event: str | None) -> None:
    assert event_type(_row(kind, outcome)) == event
    assert event_type(_row(kind, outcome, proposal=None)) is None


def test_a_body_carries_ids_and_a_link_never_content() -> None:
    settings = NoticeSettings.model_validate(
        {"inbox_url": "https://capgate.example/inbox",
         "tenants": {"acme": {"url": "https://h.example/", "secret_env": "X"}}}
    )  # fmt: skip
    row = _row("dispatch", "blocked", reason_codes=["connection_revoked"])
    body = notice_body(row, "proposal.blocked", PROPOSAL, settings)
    event = json.loads(body)
    assert event == {
        "version": 1,
        "id": event_id(row),
        "type": "proposal.blocked",
        "tenant": "acme",
        "occurred_at": "2030-01-02T03:04:05.000000Z",
        "ledger_seq": 7,
        "proposal_id": "prop-1",
        "tool": "quote.prepare_send",
        "contract_version": 1,
        "params_digest": PROPOSAL.params_digest,
        "operation_id": "op-1",
        "by": "maria/sales_manager",
        "decision_id": None,
        "reason_codes": ["connection_revoked"],
        "inbox_url": "https://capgate.example/inbox/proposals/prop-1",
    }
    assert event_id(row) == "evt_" + "12" * 16
    for content in ("ada@example.test", "Dear Ada", "42"):
        assert content.encode() not in body
    assert notice_body(row, "proposal.blocked", PROPOSAL, settings) == body  # same bytes again


# -- judging answers ----------------------------------------------------------------------


def _notifier(handler: Any, monkeypatch: pytest.MonkeyPatch) -> Notifier:
    monkeypatch.setenv("CAPGATE_TEST_NOTICE_SECRET", SECRET)
    settings = NoticeSettings.model_validate(
        {"inbox_url": "https://capgate.example/inbox",
         "tenants": {"acme": {"url": "https://hooks.example/x", "longest_backoff_seconds": 60,
                              "secret_env": "CAPGATE_TEST_NOTICE_SECRET"}}}
    )  # fmt: skip
    # The store is never touched by _send.
    return Notifier(None, settings, transport=httpx.MockTransport(handler), clock=lambda: NOW)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "headers", "verdict", "retry_after"),
    [
        (200, {}, "delivered", None),
        (204, {}, "delivered", None),
        (500, {}, "retry", None),
        (503, {"retry-after": "7"}, "retry", 7.0),
        (429, {"retry-after": "86400"}, "retry", 60.0),  # capped at the longest backoff
        (408, {}, "retry", None),
        (404, {}, "failed", None),
        (401, {}, "failed", None),
        (301, {"location": "https://elsewhere.example/"}, "failed", None),
    ],
)
def test_an_answer_is_delivered_retried_or_failed(
    status: int, headers: dict[str, str], verdict: str, retry_after: float | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return httpx.Response(status, headers=headers)

    notifier = _notifier(handler, monkeypatch)
    hook = notifier.settings.tenants["acme"]
    sent = notifier._send("acme", hook, "evt_1", "proposal.created", BODY)
    assert (sent.verdict, sent.result, sent.status_code, sent.retry_after) == (
        verdict, f"http_{status}", status, retry_after,
    )  # fmt: skip
    [request] = requests  # a redirect is never followed
    assert verify_notice(SECRET, dict(request.headers), request.content, now=NOW)["id"] == "evt_1"
    assert request.headers["capgate-event"] == "proposal.created"


def test_a_network_error_is_retried_and_named_by_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    notifier = _notifier(handler, monkeypatch)
    sent = notifier._send(
        "acme", notifier.settings.tenants["acme"], "evt_1", "proposal.created", BODY
    )
    assert (sent.verdict, sent.result, sent.status_code) == ("retry", "ConnectError", None)


def test_a_command_with_a_missing_secret_stops_before_anything_starts(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from capgate.cli.main import main
    from capgate.demo import demo_catalogue_dir

    config = tmp_path / "serve.yaml"
    config.write_text(_config(GOOD))
    config.chmod(0o600)
    monkeypatch.delenv("CAPGATE_NOTICE_SECRET_ACME", raising=False)
    store = tmp_path / "nothing-here.db"
    args = ["--catalogue", str(demo_catalogue_dir("sales")), "--config", str(config)]
    assert main(["worker", *args, "--store", str(store)]) == 2
    error = capsys.readouterr().err
    assert "[serve_config_invalid]" in error
    assert "$CAPGATE_NOTICE_SECRET_ACME is not set" in error
    assert not store.exists()  # the store was never opened, nor OPA started
