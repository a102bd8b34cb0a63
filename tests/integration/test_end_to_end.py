"""The whole path against a real OPA: facts -> policies -> dispatcher -> tool.

Two halves:

- **the dispatcher** with explicit facts, as the gateway gathers them (the stage,
  the approval, the proposal, the budget, the evidence): every execute reason code
  is reached here through the Python API, and every denial leaves the tool body
  untouched;
- **the gateway** over a real SQLite store: the facts that grant come from the
  store, never from the caller, so a payment runs only as a reviewed proposal
  (propose with ``Gateway.call``, review with ``Gateway.review`` by a permitted
  reviewer, run with ``Gateway.dispatch``), with evidence a tool produced.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from capgate.adapters.fronts.session import AgentSession
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.digest import params_digest
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import CapabilityViolation, InvalidInput, PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import (
    Approval,
    Budget,
    ComposeInput,
    ConnectionStatus,
    EvidencePiece,
    Principal,
    ProposalRef,
    Reviewer,
    Stage,
)
from capgate.gateway.model.outcomes import OutcomeStatus
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state import open_store
from capgate.gateway.state.records import ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import Secret
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS

pytestmark = pytest.mark.integration

PAYMENT = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}
#: payment.execute's contract: cost class high, no cost of its own.
PAYMENT_COST = 20


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
        "approved_by": "carl",
        "used": False,
    }
    fields.update(changes)
    return Approval.model_validate(fields)


INV_9_APPROVED = EvidencePiece(name="invoice_approved", subject={"type": "invoice", "id": "inv-9"})


def dispatch_facts(**changes: Any) -> dict[str, Any]:
    """What the gateway sends when it dispatches the approved payment proposal."""
    kwargs: dict[str, Any] = {
        "operation_id": "pay-inv-9",
        "stage": Stage.DISPATCH,
        "approval": approval(PAYMENT),
        "proposal": ProposalRef(id="prop-1", status="approved"),
        "budget": Budget(remaining=None, cost=PAYMENT_COST),
        # The invoice's approval as invoice.check_approval recorded it: about inv-9.
        "evidence_about": [INV_9_APPROVED],
    }
    kwargs.update(changes)
    return kwargs


def call_budget(cost: int = 0) -> Budget:
    """The budget of a direct call (every direct call of the sales catalogue is free)."""
    return Budget(remaining=None, cost=cost)


@pytest.fixture
def desk() -> SalesDesk:
    return SalesDesk()


@pytest.fixture
def dispatcher(sales_catalogue: Catalogue, sales_sidecar: PolicySidecar, desk: SalesDesk):
    return Dispatcher(sales_catalogue, sales_sidecar.client, ToolRegistry(desk.tools()))


# -- the dispatcher, with the facts the gateway would gather --------------------------


def test_an_approved_payment_dispatched_twice_is_paid_once(dispatcher, desk):
    # Dispatcher.call hands no credential to the tool, and the desk's writing tools
    # refuse without one: run the authorised grant with the connection's secret.
    def dispatch() -> Any:
        prepared = dispatcher.prepare("payment.execute", PAYMENT)
        request = dispatcher.execute_input(facts(), prepared, **dispatch_facts())
        authorised = dispatcher.authorise(prepared, request)
        assert authorised.action == "payment.execute"
        return dispatcher.run(authorised, account="treasury", credential=Secret("bank-secret"))

    first, second = dispatch(), dispatch()
    assert first.status is OutcomeStatus.SUCCESS
    assert first.decision_id
    assert first.operation_id == "pay-inv-9"  # the approval's operation
    assert first.provider_receipt == first.result["payment_id"]
    assert second.result == first.result
    assert desk.entered == ["payment.execute", "payment.execute"]
    assert list(desk.payments) == ["pay-inv-9"]  # one idempotency key: paid once


def test_an_operation_id_taken_from_the_approval(dispatcher):
    # Given no operation id, a call under an approval continues the approved operation.
    prepared = dispatcher.prepare("payment.execute", PAYMENT)
    request = dispatcher.execute_input(facts(), prepared, **dispatch_facts(operation_id=None))
    assert request.call.operation_id == "pay-inv-9"
    assert dispatcher.authorise(prepared, request).operation_id == "pay-inv-9"


@pytest.mark.parametrize(
    ("label", "fact_changes", "operation_id"),
    [
        ("new operation id", {}, "pay-inv-9-again"),
        (
            "other tenant",
            {"principal": {"agent": "b", "role": "finance", "tenant": "globex"}},
            "pay-inv-9",
        ),
    ],
)
def test_deny_approval_replay(dispatcher, desk, label, fact_changes, operation_id):
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(
            facts(**fact_changes),
            "payment.execute",
            PAYMENT,
            **dispatch_facts(operation_id=operation_id),
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
    agents = dispatcher.compose(sales)
    assert sorted(agents.visible) == ["contact.read", "quote.propose"]
    assert agents.excluded == {}  # an agent's compose carries no reasons
    decision = dispatcher.compose(sales, reasons=True)
    assert decision.visible == agents.visible
    assert decision.reasons_for("payment.execute") == ["role_not_granted"]
    # No sales_mailbox connection either: every failing check is reported, not just the first.
    assert decision.reasons_for("quote.prepare_send") == [
        "connection_missing",
        "not_needed_by_task",
    ]
    assert decision.decision_id


DENIALS: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    # (label, fact changes, dispatch fact changes, expected sole reason code)
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
    ("budget class", {"budget_class": "standard"}, {}, "budget_class_exceeded"),
    ("no approval", {}, {"approval": None}, "approval_required"),
    ("other content", {}, {"approval": "other"}, "approval_mismatch"),
    ("expired", {}, {"approval": "expired"}, "approval_expired"),
    ("used", {}, {"approval": "used"}, "approval_used"),
    ("proposal pending", {}, {"proposal": "pending"}, "proposal_not_approved"),
    ("proposal rejected", {}, {"proposal": "rejected"}, "proposal_not_approved"),
    ("no proposal", {}, {"proposal": None}, "proposal_not_approved"),
    ("budget spent", {}, {"budget": Budget(remaining=19, cost=PAYMENT_COST)}, "budget_exhausted"),
    ("overspent", {}, {"budget": Budget(remaining=-1, cost=PAYMENT_COST)}, "budget_exhausted"),
    ("cost understated", {}, {"budget": Budget(remaining=None, cost=1)}, "budget_exhausted"),
    ("no budget", {}, {"budget": None}, "budget_exhausted"),
    ("no evidence", {}, {"evidence_about": []}, "evidence_missing"),
    # The name alone, as before evidence had subjects: about anything is not enough.
    (
        "evidence by name",
        {},
        {"evidence_about": [], "evidence": ["invoice_approved"]},
        "evidence_missing",
    ),
    (
        "evidence about another invoice",
        {},
        {
            "evidence_about": [
                EvidencePiece(name="invoice_approved", subject={"type": "invoice", "id": "inv-10"})
            ]
        },
        "evidence_missing",
    ),
    (
        "evidence expired",
        {},
        {
            "evidence_about": [
                INV_9_APPROVED.model_copy(
                    update={"expires_at": datetime.now(UTC) - timedelta(seconds=1)}
                )
            ]
        },
        "evidence_missing",
    ),
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
    # A payment is never called directly: it needs a reviewed proposal.
    ("called directly", {}, {"stage": Stage.CALL}, "review_required"),
]


@pytest.mark.parametrize(
    ("label", "changes", "call_changes", "code"), DENIALS, ids=[d[0] for d in DENIALS]
)
def test_deny_reason_codes_through_the_dispatcher(
    dispatcher, desk, label, changes, call_changes, code
):
    chosen: dict[str, Any] = {
        "other": approval({**PAYMENT, "beneficiary": "FR7630006000011234567890189"}),
        "expired": approval(PAYMENT, minutes=-1),
        "used": approval(PAYMENT, used=True),
        "pending": ProposalRef(id="prop-1", status="pending"),
        "rejected": ProposalRef(id="prop-1", status="rejected"),
    }
    kwargs = dispatch_facts(
        **{key: chosen.get(value, value) if isinstance(value, str) else value
           for key, value in call_changes.items()}
    )  # fmt: skip
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(facts(**changes), "payment.execute", PAYMENT, **kwargs)
    assert caught.value.reason_codes == [code]
    assert caught.value.decision_id
    assert desk.entered == []


def test_a_tool_that_needs_no_review_is_never_proposed_or_dispatched(dispatcher, desk):
    sales = facts(
        principal={"agent": "s", "role": "sales", "tenant": "acme"},
        task={"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c-42"}]},
    )
    for stage in (Stage.PROPOSE, Stage.DISPATCH):
        with pytest.raises(CapabilityViolation) as caught:
            dispatcher.call(
                sales,
                "contact.read",
                {"contact_id": "c-42"},
                stage=stage,
                budget=call_budget(),
                proposal=ProposalRef(id="prop-1", status="approved"),
            )
        assert caught.value.reason_codes == ["stage_invalid"]
    assert desk.entered == []


def test_proposing_checks_neither_approval_nor_budget_and_runs_nothing(dispatcher, desk):
    prepared = dispatcher.prepare("payment.execute", PAYMENT)
    request = dispatcher.execute_input(
        facts(), prepared, operation_id="pay-inv-9", stage=Stage.PROPOSE,
        evidence_about=[INV_9_APPROVED],
    )  # fmt: skip
    authorised = dispatcher.authorise(prepared, request)
    assert authorised.adapter is None
    assert authorised.grant.idempotency_key is None  # OPA gives no obligation at propose
    assert desk.entered == []


def test_deny_unknown_tool(dispatcher):
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(facts(), "wire.transfer", {"to": "x"}, budget=call_budget())
    assert caught.value.reason_codes == ["unknown_tool"]


def test_approval_for_another_tool_is_a_mismatch(dispatcher, desk):
    wrong = approval(PAYMENT, tool="quote.prepare_send")
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(facts(), "payment.execute", PAYMENT, **dispatch_facts(approval=wrong))
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


def test_killed_opa_fails_closed_and_tool_is_never_entered(sales_catalogue, desk):
    with PolicySidecar(sales_catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
        dispatcher = Dispatcher(sales_catalogue, sidecar.client, ToolRegistry(desk.tools()))
        read = {"contact_id": "c-42"}
        dispatcher.call(sales_facts(), "contact.read", read, budget=call_budget())
        assert desk.entered == ["contact.read"]
        assert sidecar.process is not None
        os.kill(sidecar.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + HANG_SECONDS
        while sidecar.process.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not sidecar.process.running
        with pytest.raises(PolicyUnavailable):
            dispatcher.call(sales_facts(), "contact.read", read, budget=call_budget())
        assert desk.entered == ["contact.read"]


def test_denials_are_logged_by_python_with_codes_but_no_facts(dispatcher, sales_sidecar, caplog):
    caplog.set_level(logging.INFO, logger="capgate.dispatch")
    secret_subject = "inv-SECRET-77"
    with pytest.raises(CapabilityViolation) as caught:
        dispatcher.call(
            facts(), "payment.execute", {**PAYMENT, "invoice_id": secret_subject},
            **dispatch_facts(),
        )  # fmt: skip
    line = next(r.getMessage() for r in caplog.records if "deny" in r.getMessage())
    assert caught.value.decision_id in line
    assert "subject_out_of_scope" in line
    assert "stage=dispatch" in line
    assert secret_subject not in caplog.text
    assert sales_sidecar.process is not None
    assert secret_subject not in sales_sidecar.process.log_path.read_text()


# -- fail closed on malformed input, with the real policies behind -----------------------


def test_deep_params_are_invalid_input_not_a_recursion_error(dispatcher, desk):
    deep: Any = "x"
    for _ in range(1000):
        deep = {"a": deep}
    with pytest.raises(InvalidInput, match="limit of 64 levels"):
        dispatcher.call(facts(), "payment.execute", {**PAYMENT, "memo": deep}, **dispatch_facts())
    assert desk.entered == []


def test_a_currency_with_a_trailing_newline_never_reaches_the_bank(dispatcher, desk):
    sneaky = {**PAYMENT, "currency": "EUR\n"}
    with pytest.raises(InvalidInput, match="currency"):
        dispatcher.call(
            facts(), "payment.execute", sneaky, **dispatch_facts(approval=approval(sneaky))
        )
    assert desk.entered == []


# -- the gateway: every fact that grants comes from its store ---------------------------

SECRETS = {
    ("acme", "crm"): "e2e-secret-crm",
    ("acme", "bank"): "e2e-secret-bank",
    ("acme", "sales_mailbox"): "e2e-secret-mailbox",
}
FINANCE = Principal(agent="finance-bot", role="finance", tenant="acme")
SALES = Principal(agent="sales-bot", role="sales", tenant="acme")


def _reviewer(name: str, role: str, tenant: str) -> Reviewer:
    return Reviewer(id=name, role=role, tenant=tenant, authenticated_by="test:fixture")


CONTROLLER = Reviewer(id="carl", role="controller", tenant="acme", authenticated_by="test:fixture")
MANAGER = Reviewer(id="maria", role="sales_manager", tenant="acme", authenticated_by="test:fixture")
PAY_TASK = {
    "type": "invoice_payment",
    "id": "task-pay-9",
    "linked_resources": [{"type": "invoice", "id": "inv-9"}],
}
QUOTE_TASK = {
    "type": "customer_quote",
    "id": "task-quote-17",
    "needs": ["contact.read"],
    "linked_resources": [{"type": "contact", "id": "c-42"}],
}


def agent(principal: Principal, task: dict[str, Any]) -> AgentRequest:
    return AgentRequest.model_validate(
        {"principal": principal, "task": task, "environment": "production"}
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = open_store(str(tmp_path / "state.db"))
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="unlimited", budget_limit=1000)
        for alias in ("crm", "bank"):
            tx.put_connection(
                "acme", alias, status=ConnectionStatus.ACTIVE, account=f"{alias}@acme"
            )
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def gateway(sales_catalogue, sales_sidecar, desk, store) -> Gateway:
    return Gateway(
        sales_catalogue,
        sales_sidecar.client,
        ToolRegistry(desk.tools()),
        store,
        credentials=StaticCredentials(SECRETS),
    )


def check_invoice(gateway: Gateway) -> None:
    """The finance agent checks the invoice: the gateway records ``invoice_approved``."""
    checked = gateway.call(
        agent(FINANCE, PAY_TASK), "invoice.check_approval", {"invoice_id": "inv-9"}
    )
    assert not isinstance(checked, ProposalRecord)
    assert checked.status is OutcomeStatus.SUCCESS


def propose_payment(gateway: Gateway) -> ProposalRecord:
    """Check the invoice (evidence is checked at every stage), then propose the payment."""
    check_invoice(gateway)
    proposal = gateway.call(agent(FINANCE, PAY_TASK), "payment.execute", PAYMENT)
    assert isinstance(proposal, ProposalRecord)
    return proposal


def stored(store: Store, proposal_id: str) -> ProposalRecord:
    with store.transaction(read_only=True) as tx:
        found = tx.get_proposal(proposal_id)
    assert found is not None
    return found


def test_a_payment_runs_only_as_a_reviewed_proposal_and_only_once(gateway, desk, store):
    # The evidence comes from a tool that produced it, recorded by the gateway.
    proposal = propose_payment(gateway)
    with store.transaction(read_only=True) as tx:
        assert tx.evidence("acme", PAY_TASK["id"]) == {"invoice_approved"}
    assert proposal.status is ProposalStatus.PENDING
    assert proposal.execution_action == "payment.execute"
    assert "payment.execute" not in desk.entered  # proposing runs nothing

    review = gateway.review(proposal.id, CONTROLLER, "approved")
    assert review.digest == params_digest(PAYMENT)
    assert review.operation_id == proposal.operation_id
    assert stored(store, proposal.id).status is ProposalStatus.APPROVED
    assert "payment.execute" not in desk.entered  # approving runs nothing either

    first = gateway.dispatch(proposal.id)
    again = gateway.dispatch(proposal.id)
    assert first.status is OutcomeStatus.SUCCESS
    assert first.operation_id == proposal.operation_id
    assert again == first  # the operation's first outcome, not a second payment
    assert desk.entered.count("payment.execute") == 1
    assert list(desk.payments) == [proposal.operation_id]  # keyed by the operation id
    assert desk.accounts == ["bank@acme"]  # the secret resolved at dispatch, never logged
    assert stored(store, proposal.id).status is ProposalStatus.DISPATCHED
    ledger = [(row.kind, row.outcome) for row in store.ledger(proposal_id=proposal.id)]
    assert ("proposal", "pending") in ledger
    assert ("review", "approved") in ledger
    assert ("dispatch", "dispatched") in ledger
    assert store.verify_ledger().ok
    assert "e2e-secret" not in repr(store.ledger())


def test_a_direct_call_of_a_payment_becomes_a_proposal_never_a_payment(gateway, desk):
    check_invoice(gateway)
    session = AgentSession(gateway, agent(FINANCE, PAY_TASK))
    answer = session.call_tool("payment.execute", **PAYMENT)
    assert answer["status"] == "pending_review"
    assert session.last_proposal is not None
    assert desk.payments == {}


def test_dispatch_before_the_review_is_denied_and_sends_nothing(gateway, desk, store):
    proposal = propose_payment(gateway)
    with pytest.raises(CapabilityViolation) as caught:
        gateway.dispatch(proposal.id)
    assert caught.value.reason_codes == ["approval_required", "proposal_not_approved"]
    assert desk.payments == {}
    # Early, not overtaken by events: the proposal stays pending, for its review.
    assert stored(store, proposal.id).status is ProposalStatus.PENDING
    gateway.review(proposal.id, CONTROLLER, "approved")
    assert gateway.dispatch(proposal.id).status is OutcomeStatus.SUCCESS
    assert len(desk.payments) == 1


def test_without_the_evidence_a_tool_produces_a_payment_cannot_be_proposed(gateway, desk, store):
    # The finance agent never ran invoice.check_approval, and cannot say it did.
    with pytest.raises(CapabilityViolation) as caught:
        gateway.call(agent(FINANCE, PAY_TASK), "payment.execute", PAYMENT)
    assert caught.value.reason_codes == ["evidence_missing"]
    with store.transaction(read_only=True) as tx:
        assert tx.list_proposals(tenant="acme") == []
    assert desk.payments == {}


def test_evidence_a_tool_refused_to_produce_is_not_recorded(gateway, desk, store):
    refused = gateway.call(
        agent(FINANCE, {**PAY_TASK, "linked_resources": [{"type": "invoice", "id": "inv-10"}]}),
        "invoice.check_approval",
        {"invoice_id": "inv-10"},  # not approved in the books
    )
    assert not isinstance(refused, ProposalRecord)
    assert refused.status is OutcomeStatus.REFUSED
    with store.transaction(read_only=True) as tx:
        assert tx.evidence("acme", PAY_TASK["id"]) == set()


@pytest.mark.parametrize(
    ("reviewer", "codes"),
    [
        (MANAGER, ["reviewer_not_permitted"]),  # approves quotes, not payments
        (_reviewer("finance-bot", "controller", "acme"), ["self_review"]),
        (_reviewer("carl", "controller", "globex"), ["tenant_mismatch"]),
        (_reviewer("fin-2", "finance", "acme"), ["reviewer_not_permitted"]),
    ],
    ids=["a reviewer of another tool", "the proposer", "another tenant", "the caller's role"],
)
def test_only_a_permitted_reviewer_approves_a_payment(gateway, desk, store, reviewer, codes):
    proposal = propose_payment(gateway)
    with pytest.raises(CapabilityViolation) as caught:
        gateway.review(proposal.id, reviewer, "approved")
    assert caught.value.reason_codes == codes
    assert stored(store, proposal.id).status is ProposalStatus.PENDING
    with store.transaction(read_only=True) as tx:
        assert tx.reviews(proposal.id) == []
    # A refused reviewer's attempt leaves the proposal for a permitted one.
    gateway.review(proposal.id, CONTROLLER, "approved")
    assert stored(store, proposal.id).status is ProposalStatus.APPROVED


def test_a_proposal_is_reviewed_once(gateway, store):
    proposal = propose_payment(gateway)
    gateway.review(proposal.id, CONTROLLER, "rejected")
    assert stored(store, proposal.id).status is ProposalStatus.REJECTED
    with pytest.raises(CapabilityViolation) as caught:
        gateway.review(proposal.id, CONTROLLER, "approved")
    assert caught.value.reason_codes == ["proposal_not_pending"]
    with pytest.raises(CapabilityViolation) as caught:
        gateway.dispatch(proposal.id)
    assert "proposal_not_approved" in caught.value.reason_codes


def test_an_approval_expired_before_dispatch_sends_nothing(gateway, desk, store):
    proposal = propose_payment(gateway)
    gateway.review(proposal.id, CONTROLLER, "approved", ttl=timedelta(milliseconds=1))
    time.sleep(0.05)
    with pytest.raises(CapabilityViolation) as caught:
        gateway.dispatch(proposal.id)
    assert caught.value.reason_codes == ["approval_expired"]
    assert desk.payments == {}


def test_a_connection_revoked_after_the_review_sends_nothing(gateway, desk, store):
    proposal = propose_payment(gateway)
    gateway.review(proposal.id, CONTROLLER, "approved")
    # Straight in the store (as another gateway process would), not through revoke:
    # the dispatch itself must ask OPA with the connection as it is now.
    with store.transaction() as tx:
        tx.set_connection_status("acme", "bank", ConnectionStatus.REVOKED)
    with pytest.raises(CapabilityViolation) as caught:
        gateway.dispatch(proposal.id)
    assert caught.value.reason_codes == ["connection_revoked"]
    assert stored(store, proposal.id).status is ProposalStatus.BLOCKED
    assert desk.payments == {}


def test_the_tenants_budget_is_read_from_the_store(gateway, desk, store):
    proposal = propose_payment(gateway)
    gateway.review(proposal.id, CONTROLLER, "approved")
    with store.transaction() as tx:
        tx.set_budget_limit("acme", PAYMENT_COST - 1)
    with pytest.raises(CapabilityViolation) as caught:
        gateway.dispatch(proposal.id)
    assert caught.value.reason_codes == ["budget_exhausted"]
    assert desk.payments == {}


def test_agent_session_prompt_lists_only_visible_tools(gateway):
    session = AgentSession(gateway, agent(FINANCE, PAY_TASK))
    block = session.available_tools_block()
    assert block.startswith("AVAILABLE TOOLS:")
    assert "payment.execute" in block
    assert "invoice.check_approval" in block
    assert "contact.read" not in block  # finance holds no grant for it
    assert "quote.propose" not in block


def test_agent_session_calls_a_visible_tool(gateway, desk):
    session = AgentSession(gateway, agent(SALES, QUOTE_TASK))
    assert session.visible_tools == ["contact.read"]
    assert session.call_tool("contact.read", contact_id="c-42")["contact_id"] == "c-42"
    assert session.last_outcome is not None
    assert session.last_outcome.decision_id
    assert desk.entered == ["contact.read"]


def test_a_session_sees_a_revoked_connection_at_its_next_call(gateway, desk):
    session = AgentSession(gateway, agent(SALES, QUOTE_TASK))
    gateway.revoke_connection("acme", "crm", by="ops")
    with pytest.raises(CapabilityViolation) as caught:
        session.call_tool("contact.read", contact_id="c-42")
    assert caught.value.reason_codes == ["connection_revoked"]
    assert session.refresh().visible == []
    assert desk.entered == []
