"""The whole path against a real OPA: facts -> policies -> dispatcher -> tool.

Every reason code is reached here through the Python API as a user would reach it,
and every denial is checked to have left the tool body untouched.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from capgate.demo.tools.sales_desk import SalesDesk
from gateway.digest import params_digest
from gateway.dispatch.agent import AgentSession
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.registry import ToolRegistry
from gateway.errors import CapabilityViolation, InvalidInput, PolicyUnavailable
from gateway.model.contracts import Catalogue
from gateway.model.facts import Approval, ComposeInput
from gateway.model.outcomes import OutcomeStatus
from gateway.opa.sidecar import PolicySidecar

pytestmark = pytest.mark.integration

PAYMENT = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}


def facts(**changes: Any) -> ComposeInput:
    base: dict[str, Any] = {
        "principal": {"agent": "bot", "role": "finance", "tenant": "acme"},
        "task": {
            "type": "invoice_payment",
            "linked_resources": [
                {"type": "invoice", "id": "inv-9"},
                {"type": "contact", "id": "c-42"},
            ],
        },
        "connections": {"crm": "active", "bank": "active"},
        "environment": "production",
        "budget_class": "unlimited",
    }
    base.update(changes)
    return ComposeInput.model_validate(base)


def approval(params: dict[str, Any], *, minutes: float = 10, **changes: Any) -> Approval:
    fields: dict[str, Any] = {
        "kind": "exact_content_and_recipient",
        "tool": "payment.execute",
        "operation_id": "pay-inv-9",
        "tenant": "acme",
        "digest": params_digest(params),
        "expires_at": datetime.now(UTC) + timedelta(minutes=minutes),
        "approved_by": "founder",
    }
    fields.update(changes)
    return Approval.model_validate(fields)


@pytest.fixture
def desk() -> SalesDesk:
    return SalesDesk()


@pytest.fixture
def dispatcher(sales_catalogue: Catalogue, sales_sidecar: PolicySidecar, desk: SalesDesk):
    return Dispatcher(sales_catalogue, sales_sidecar.client, ToolRegistry(desk.tools()))


def test_allow_approved_payment_runs_once_however_often_it_is_called(dispatcher, desk):
    kwargs: dict[str, Any] = {"approval": approval(PAYMENT), "evidence": ["invoice_approved"]}
    first = dispatcher.call(facts(), "payment.execute", PAYMENT, **kwargs)
    second = dispatcher.call(facts(), "payment.execute", PAYMENT, **kwargs)
    assert first.status is OutcomeStatus.SUCCESS
    assert first.decision_id
    assert first.operation_id == "pay-inv-9"  # the approval's operation
    assert second.result == first.result
    assert desk.entered == ["payment.execute", "payment.execute"]
    assert list(desk.payments) == ["pay-inv-9"]  # one idempotency key: paid once


@pytest.mark.parametrize(
    ("label", "fact_changes", "operation_id"),
    [
        ("new operation id", {}, "pay-inv-9-again"),
        (
            "other tenant",
            {"principal": {"agent": "b", "role": "finance", "tenant": "globex"}},
            None,
        ),
    ],
)
def test_deny_approval_replay(dispatcher, desk, label, fact_changes, operation_id):
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(
            facts(**fact_changes),
            "payment.execute",
            PAYMENT,
            operation_id=operation_id,
            approval=approval(PAYMENT),
            evidence=["invoice_approved"],
        )
    assert caught.value.reason_codes == ["approval_mismatch"]
    assert desk.entered == []


def test_compose_is_the_intersection_for_sales(dispatcher):
    sales = facts(
        principal={"agent": "s", "role": "sales", "tenant": "acme"},
        task={
            "type": "customer_quote",
            "needs": ["contact.read", "quote.propose", "payment.execute"],
        },
    )
    decision = dispatcher.compose(sales)
    assert sorted(decision.visible) == ["contact.read", "quote.propose"]
    assert decision.reasons_for("payment.execute") == ["role_not_granted"]
    # No sales_mailbox connection either: every failing check is reported, not just the first.
    assert decision.reasons_for("quote.prepare_send") == [
        "connection_missing",
        "not_needed_by_task",
    ]
    assert decision.decision_id


DENIALS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    # (label, fact changes, call keyword changes, expected sole reason code)
    (
        "role",
        {"principal": {"agent": "s", "role": "sales", "tenant": "acme"}},
        {},
        "role_not_granted",
    ),
    (
        "task",
        {
            "task": {
                "type": "customer_quote",
                "needs": ["contact.read"],
                "linked_resources": [{"type": "invoice", "id": "inv-9"}],
            }
        },
        {},
        "not_needed_by_task",
    ),
    ("tenant", {"connections": {"bank": "disabled"}}, {}, "tool_not_enabled_for_tenant"),
    ("missing connection", {"connections": {}}, {}, "connection_missing"),
    ("revoked", {"connections": {"bank": "revoked"}}, {}, "connection_revoked"),
    ("environment", {"environment": "sandbox"}, {}, "environment_restricted"),
    ("budget", {"budget_class": "standard"}, {}, "budget_class_exceeded"),
    ("no approval", {}, {"approval": None}, "approval_required"),
    ("other content", {}, {"approval": "other"}, "approval_mismatch"),
    ("expired", {}, {"approval": "expired"}, "approval_expired"),
    ("no evidence", {}, {"evidence": []}, "evidence_missing"),
    (
        "out of scope",
        {
            "task": {
                "type": "invoice_payment",
                "linked_resources": [{"type": "invoice", "id": "inv-1"}],
            }
        },
        {},
        "subject_out_of_scope",
    ),
]


@pytest.mark.parametrize(
    ("label", "changes", "call_changes", "code"), DENIALS, ids=[d[0] for d in DENIALS]
)
def test_deny_reason_codes_through_the_dispatcher(
    dispatcher, desk, label, changes, call_changes, code
):
    chosen = {
        None: None,
        "other": approval({**PAYMENT, "beneficiary": "FR7630006000011234567890189"}),
        "expired": approval(PAYMENT, minutes=-1),
    }
    kwargs: dict[str, Any] = {"approval": approval(PAYMENT), "evidence": ["invoice_approved"]}
    for key, value in call_changes.items():
        kwargs[key] = chosen[value] if key == "approval" else value
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(facts(**changes), "payment.execute", PAYMENT, **kwargs)
    assert caught.value.reason_codes == [code]
    assert caught.value.decision_id
    assert desk.entered == []


def test_deny_unknown_tool(dispatcher):
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(facts(), "wire.transfer", {"to": "x"})
    assert "unknown_tool" in caught.value.reason_codes


def test_approval_for_another_tool_is_a_mismatch(dispatcher, desk):
    wrong = approval(PAYMENT, tool="quote.prepare_send")
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(
            facts(), "payment.execute", PAYMENT, approval=wrong, evidence=["invoice_approved"]
        )
    assert caught.value.reason_codes == ["approval_mismatch"]
    assert desk.entered == []


def sales_facts() -> ComposeInput:
    return facts(
        principal={"agent": "s", "role": "sales", "tenant": "acme"},
        task={
            "type": "customer_quote",
            "needs": ["contact.read"],
            "linked_resources": [{"type": "contact", "id": "c-42"}],
        },
    )


def test_agent_session_prompt_lists_only_visible_tools(dispatcher):
    session = AgentSession(dispatcher, facts(), evidence=["invoice_approved"])
    block = session.available_tools_block()
    assert block.startswith("AVAILABLE TOOLS:")
    assert "payment.execute" in block
    assert "contact.read" not in block  # finance holds no grant for it
    assert "quote.propose" not in block


def test_agent_session_calls_a_visible_tool(dispatcher, desk):
    session = AgentSession(dispatcher, sales_facts())
    assert session.visible_tools == ["contact.read"]
    assert session.call_tool("contact.read", contact_id="c-42")["contact_id"] == "c-42"
    assert session.last_outcome is not None
    assert session.last_outcome.decision_id
    assert desk.entered == ["contact.read"]


def test_killed_opa_fails_closed_and_tool_is_never_entered(sales_catalogue, desk):
    with PolicySidecar(sales_catalogue) as sidecar:
        dispatcher = Dispatcher(sales_catalogue, sidecar.client, ToolRegistry(desk.tools()))
        dispatcher.call(sales_facts(), "contact.read", {"contact_id": "c-42"})
        assert desk.entered == ["contact.read"]
        assert sidecar.process is not None
        os.kill(sidecar.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while sidecar.process.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not sidecar.process.running
        with pytest.raises(PolicyUnavailable):
            dispatcher.call(sales_facts(), "contact.read", {"contact_id": "c-42"})
        assert desk.entered == ["contact.read"]


def test_denials_are_logged_by_python_with_codes_but_no_facts(dispatcher, sales_sidecar, caplog):
    caplog.set_level(logging.INFO, logger="capgate.dispatch")
    secret_subject = "inv-SECRET-77"
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(facts(), "payment.execute", {**PAYMENT, "invoice_id": secret_subject})
    line = next(r.getMessage() for r in caplog.records if "deny" in r.getMessage())
    assert caught.value.decision_id in line
    assert "subject_out_of_scope" in line
    assert secret_subject not in caplog.text
    assert sales_sidecar.process is not None
    assert secret_subject not in sales_sidecar.process.log_path.read_text()


# -- fail closed on malformed input, with the real policies behind -----------------------


def test_deep_params_are_invalid_input_not_a_recursion_error(dispatcher, desk):
    deep: Any = "x"
    for _ in range(1000):
        deep = {"a": deep}
    with pytest.raises(InvalidInput, match="limit of 64 levels"):
        dispatcher.call(facts(), "payment.execute", {**PAYMENT, "memo": deep})
    assert desk.entered == []


def test_a_currency_with_a_trailing_newline_never_reaches_the_bank(dispatcher, desk):
    sneaky = {**PAYMENT, "currency": "EUR\n"}
    with pytest.raises(InvalidInput, match="currency"):
        dispatcher.call(
            facts(),
            "payment.execute",
            sneaky,
            approval=approval(sneaky),
            evidence=["invoice_approved"],
        )
    assert desk.entered == []
