"""The gateway's life cycle against a real OPA and a real store (SQLite and PostgreSQL).

Issue #7's "Done means", one backend-parametrised suite: propose, review, dispatch
exactly once with the chain in the ledger; a connection revoked while a proposal
waits; approvals altered, expired, used, borrowed or self-given; unknown outcomes
retried by lookup; credentials resolved at dispatch only and never written
anywhere; facts that grant read from the store, never from the caller; bad input
refused with nothing partly written.

Every test asserts on what really happened: the store, the ledger and the
providers' own records (``SalesDesk.mailbox``, ``payments``, ``entered``, or a
:class:`~tests.integration.lifecycle_support.FileProvider`'s file), not only on
what the gateway returned. The store-level races and process crashes are in
``test_lifecycle_races.py`` and ``test_lifecycle_crash.py``.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from capgate.adapters.fronts.session import AgentSession
from capgate.adapters.tools.in_process import InProcessTools, current_call
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.digest import params_digest
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    InvalidInput,
    OperationConflict,
    ToolFailed,
    UnknownConnection,
    UnknownProposal,
    UnknownTenant,
)
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus, Principal, Reviewer
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import (
    OperationStatus,
    ProposalRecord,
    ProposalStatus,
    ReviewVerdict,
)
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import Secret
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration import lifecycle_support as lifecycle_fixtures
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_support import (
    CONTROLLER,
    EMAIL,
    FINANCE,
    MANAGER,
    METER_TASK,
    PAY_TASK,
    PAYMENT,
    QUOTE,
    QUOTE_TASK,
    SALES,
    SECRETS,
    TENANT,
    FileProvider,
    ShiftClock,
    agent_request,
    evidence_of,
    kinds,
    make_gateway,
    operation_of,
    proposal_of,
    raw_execute,
    raw_rows,
    row_counts,
    sqlite_file_bytes,
    table_dump,
    wait_until,
    write_lifecycle_catalogue,
)

pytestmark = pytest.mark.integration

# The shared fixtures, bound here so pytest finds them (one server per session).
postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url
clock = lifecycle_fixtures.clock
store = lifecycle_fixtures.store
desk = lifecycle_fixtures.desk
gateway = lifecycle_fixtures.gateway
provider = lifecycle_fixtures.provider
metered = lifecycle_fixtures.metered


SALES_REQUEST = agent_request(SALES, QUOTE_TASK)
FINANCE_REQUEST = agent_request(FINANCE, PAY_TASK)
METER_REQUEST = agent_request(SALES, METER_TASK)


# -- helpers --------------------------------------------------------------------------------


def gather_evidence(
    gateway: Gateway, request: AgentRequest = SALES_REQUEST, reviewer: Reviewer = MANAGER
) -> None:
    """The evidence quote.prepare_send requires, produced the way an agent would:
    a verified recipient, their consent, and a dispatched quote."""
    session = AgentSession(gateway, request)
    session.call_tool("contact.verify_email", contact_id="c-42", email=EMAIL["recipient"])
    session.call_tool("consent.check", contact_id="c-42")
    quote = session.call_tool("quote.propose", **QUOTE)
    assert quote["status"] == "pending_review"
    gateway.review(quote["proposal_id"], reviewer, "approved")
    assert gateway.dispatch(quote["proposal_id"]).ok


def propose(
    gateway: Gateway,
    request: AgentRequest = SALES_REQUEST,
    tool: str = "quote.prepare_send",
    params: dict[str, Any] | None = None,
    **options: Any,
) -> ProposalRecord:
    answer = gateway.call(request, tool, dict(EMAIL if params is None else params), **options)
    assert isinstance(answer, ProposalRecord), answer
    assert answer.status is ProposalStatus.PENDING
    return answer


def approved_email(gateway: Gateway, **changes: Any) -> ProposalRecord:
    gather_evidence(gateway)
    proposal = propose(gateway, params={**EMAIL, **changes})
    gateway.review(proposal.id, MANAGER, "approved")
    return proposal


def denied(call: Any) -> CapabilityViolation:
    with pytest.raises(CapabilityViolation) as caught:
        call()
    return caught.value


def sent_emails(desk: SalesDesk) -> int:
    return desk.entered.count("quote.dispatch_reviewed")


def assert_blocked(store: Store, proposal_id: str, *codes: str) -> None:
    blocked = proposal_of(store, proposal_id)
    assert blocked.status is ProposalStatus.BLOCKED
    assert sorted(blocked.reason_codes) == sorted(codes)


def assert_approval_unused(store: Store, proposal_id: str) -> None:
    with store.transaction(read_only=True) as tx:
        reviews = tx.reviews(proposal_id)
    assert [r.consumed_at for r in reviews if r.verdict is ReviewVerdict.APPROVED] == [None]


# -- 1. propose, review, dispatch exactly once ------------------------------------------------


def test_a_reviewed_email_is_sent_exactly_once_and_the_ledger_shows_the_chain(
    gateway: Gateway, store: Store, desk: SalesDesk, sales_sidecar: PolicySidecar
) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    assert desk.mailbox == {}  # proposing sends nothing
    stored = proposal_of(store, proposal.id)
    assert stored.params == EMAIL  # the exact content and recipient
    assert stored.execution_action == "quote.dispatch_reviewed"
    assert stored.proposer == SALES

    review = gateway.review(proposal.id, MANAGER, "approved")
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    assert (review.digest, review.operation_id, review.tenant) == (
        proposal.params_digest,
        proposal.operation_id,
        TENANT,
    )
    assert desk.mailbox == {}  # approving sends nothing either

    outcome = gateway.dispatch(proposal.id)
    assert outcome.status is OutcomeStatus.SUCCESS
    # The provider's record: one message, to exactly the approved recipient and subject,
    # sent under the operation id as its idempotency key.
    assert list(desk.mailbox) == [proposal.operation_id]
    message = desk.mailbox[proposal.operation_id]
    assert (message["to"], message["subject"]) == (EMAIL["recipient"], EMAIL["subject"])
    assert outcome.provider_receipt == message["message_id"]
    assert desk.accounts[-1] == "sales@acme.example"

    # Dispatching again returns the same outcome and sends nothing.
    assert gateway.dispatch(proposal.id) == outcome
    assert sent_emails(desk) == 1
    assert len(desk.mailbox) == 1

    assert proposal_of(store, proposal.id).status is ProposalStatus.DISPATCHED
    with store.transaction(read_only=True) as tx:
        [stored_review] = tx.reviews(proposal.id)
        operation = tx.get_operation(TENANT, proposal.operation_id)
    assert stored_review.consumed_at is not None
    assert operation is not None
    assert operation.status is OperationStatus.DONE
    assert Outcome.model_validate(operation.outcome) == outcome

    # The chain, by operation: proposal -> review -> dispatch -> intent -> outcome.
    rows = store.ledger(operation_id=proposal.operation_id)
    assert [(r.kind, r.outcome) for r in rows] == [
        ("proposal", "pending"),
        ("review", "approved"),
        ("dispatch", "dispatched"),
        ("intent", "running"),
        ("outcome", "success"),
    ]
    proposal_row, review_row, dispatch_row, intent_row, outcome_row = rows
    assert proposal_row.decision_id == proposal.decision_id
    assert review_row.decision_id == review.decision_id
    assert dispatch_row.decision_id == intent_row.decision_id == outcome_row.decision_id
    assert outcome_row.decision_id == outcome.decision_id
    decision_ids = {proposal.decision_id, review.decision_id, outcome.decision_id}
    assert None not in decision_ids
    assert len(decision_ids) == 3
    revision = sales_sidecar.client.expected_revision
    assert revision
    for row in rows:
        assert row.policy_revision is not None, row
        assert revision in row.policy_revision, row
        assert row.tool == "quote.prepare_send"
        assert row.contract_version == 1
        assert row.tenant == TENANT
    assert review_row.principal == "maria/sales_manager"
    assert proposal_row.principal == "sales-bot/sales"
    assert outcome_row.detail["receipt"] == outcome.provider_receipt
    # By proposal, the same chain.
    assert kinds(store, proposal_id=proposal.id) == [
        ("proposal", "pending"),
        ("review", "approved"),
        ("dispatch", "dispatched"),
        ("intent", "running"),
        ("outcome", "success"),
    ]
    report = store.verify_ledger()
    assert report.ok, report.problem

    # The quote (1 unit) and the email (1 unit) were spent; nothing stays reserved.
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    assert (budget.spent, budget.reserved) == (2, 0)


# -- 2. revoked while queued ------------------------------------------------------------------


def test_revoking_the_mailbox_after_approval_blocks_the_queued_email(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    gateway.revoke_connection(TENANT, "sales_mailbox", by="ops")
    # Revoking blocks the queued proposal at once, and says so under the proposal.
    assert_blocked(store, proposal.id, "connection_revoked")
    assert kinds(store, proposal_id=proposal.id)[-1] == ("dispatch", "blocked")

    denial = denied(lambda: gateway.dispatch(proposal.id))
    assert "connection_revoked" in denial.reason_codes
    assert denial.decision_id is not None
    assert desk.mailbox == {}
    assert sent_emails(desk) == 0
    assert_blocked(store, proposal.id, "connection_revoked")
    assert operation_of(store, proposal.operation_id) is None
    assert_approval_unused(store, proposal.id)

    ledger = store.ledger(tenant=TENANT)
    [revoked] = [row for row in ledger if row.kind == "connection"]
    assert revoked.outcome == "revoked"
    assert revoked.principal == "ops"
    assert revoked.detail == {
        "alias": "sales_mailbox",
        "account": "sales@acme.example",
        "blocked": [proposal.id],
    }
    deny = store.ledger(proposal_id=proposal.id)[-1]
    assert (deny.kind, deny.outcome, deny.decision_id) == ("decision", "deny", denial.decision_id)
    assert "connection_revoked" in deny.reason_codes
    assert store.verify_ledger().ok

    # The next compose hides the email tool; restoring the connection does not unblock.
    assert "quote.prepare_send" not in gateway.compose(SALES_REQUEST).visible
    gateway.restore_connection(TENANT, "sales_mailbox", by="ops")
    assert "quote.prepare_send" in gateway.compose(SALES_REQUEST).visible
    denied(lambda: gateway.dispatch(proposal.id))
    assert desk.mailbox == {}
    assert proposal_of(store, proposal.id).status is ProposalStatus.BLOCKED


def test_a_connection_revoked_in_the_store_alone_denies_the_dispatch(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    # Not through the gateway's revoke helper: the proposal is still approved, and
    # the dispatch decision alone, with the store's facts of this moment, must deny.
    with store.transaction() as tx:
        tx.set_connection_status(TENANT, "sales_mailbox", ConnectionStatus.REVOKED)
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED

    denial = denied(lambda: gateway.dispatch(proposal.id))
    assert denial.reason_codes == ["connection_revoked"]
    assert desk.mailbox == {}
    assert sent_emails(desk) == 0
    assert_blocked(store, proposal.id, "connection_revoked")
    assert operation_of(store, proposal.operation_id) is None
    assert_approval_unused(store, proposal.id)
    assert kinds(store, proposal_id=proposal.id)[-2:] == [
        ("decision", "deny"),
        ("dispatch", "blocked"),
    ]
    blocked_row = store.ledger(proposal_id=proposal.id)[-1]
    assert blocked_row.reason_codes == ["connection_revoked"]
    assert blocked_row.decision_id == denial.decision_id
    assert store.verify_ledger().ok


# -- 3. approvals altered, expired, used, borrowed, self-given ------------------------------------


def test_content_altered_in_the_database_after_approval_is_denied(
    gateway: Gateway, store: Store, store_url: str, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    altered = {**EMAIL, "recipient": "mallory@evil.test"}
    changed = raw_execute(
        store_url,
        "UPDATE proposals SET params = ? WHERE id = ?",
        (json.dumps(altered, sort_keys=True, separators=(",", ":")), proposal.id),
    )
    assert changed == 1
    assert proposal_of(store, proposal.id).params["recipient"] == "mallory@evil.test"

    denial = denied(lambda: gateway.dispatch(proposal.id))
    # The approval does not match, and nobody verified the new recipient either.
    assert denial.reason_codes == ["approval_mismatch", "evidence_missing"]
    assert desk.mailbox == {}
    assert sent_emails(desk) == 0
    assert_blocked(store, proposal.id, "approval_mismatch", "evidence_missing")
    assert operation_of(store, proposal.operation_id) is None
    assert_approval_unused(store, proposal.id)
    assert kinds(store, proposal_id=proposal.id)[-2:] == [
        ("decision", "deny"),
        ("dispatch", "blocked"),
    ]


def test_content_and_its_digest_altered_together_are_still_denied(
    gateway: Gateway, store: Store, store_url: str, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    altered = {**EMAIL, "body": "Please pay to IBAN XX00 instead."}
    raw_execute(
        store_url,
        "UPDATE proposals SET params = ?, params_digest = ? WHERE id = ?",
        (
            json.dumps(altered, sort_keys=True, separators=(",", ":")),
            params_digest(altered),
            proposal.id,
        ),
    )
    denial = denied(lambda: gateway.dispatch(proposal.id))
    assert denial.reason_codes == ["approval_mismatch"]
    assert desk.mailbox == {}
    assert_blocked(store, proposal.id, "approval_mismatch")


def test_an_expired_approval_is_denied(
    gateway: Gateway, store: Store, clock: ShiftClock, desk: SalesDesk
) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    clock.offset = -timedelta(hours=2)  # the review happens, by the store's clock, 2 h ago
    review = gateway.review(proposal.id, MANAGER, "approved", ttl=timedelta(hours=1))
    clock.offset = timedelta(0)
    assert review.expires_at < clock()

    denial = denied(lambda: gateway.dispatch(proposal.id))
    assert denial.reason_codes == ["approval_expired"]
    assert desk.mailbox == {}
    assert_blocked(store, proposal.id, "approval_expired")
    assert_approval_unused(store, proposal.id)


def test_an_approval_that_expires_while_queued_is_denied(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    gateway.review(proposal.id, MANAGER, "approved", ttl=timedelta(seconds=0.5))
    time.sleep(0.6)
    denial = denied(lambda: gateway.dispatch(proposal.id))
    assert denial.reason_codes == ["approval_expired"]
    assert desk.mailbox == {}
    assert_blocked(store, proposal.id, "approval_expired")


def test_two_concurrent_dispatches_send_once(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    start = threading.Barrier(2)

    def dispatch(_: int) -> Outcome | CapgateError:
        start.wait(timeout=HANG_SECONDS)
        try:
            return gateway.dispatch(proposal.id)
        except CapgateError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(dispatch, range(2)))
    assert sent_emails(desk) == 1
    assert len(desk.mailbox) == 1
    # Both callers learn the one outcome: the second waited for the first.
    assert all(isinstance(r, Outcome) for r in results), results
    assert results[0] == results[1]
    assert results[0].ok  # type: ignore[union-attr]
    intents = [r for r in store.ledger(operation_id=proposal.operation_id) if r.kind == "intent"]
    assert len(intents) == 1
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    assert (budget.spent, budget.reserved) == (2, 0)


def test_a_dispatch_overtaken_between_its_reads_joins_the_one_that_won(
    gateway: Gateway, store: Store, desk: SalesDesk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interleaving the concurrent test hits only sometimes, made certain: this
    # dispatch read the proposal while it was still approved, and its approval after
    # another dispatch had used it. It must join that dispatch, not deny and block.
    proposal = approved_email(gateway)
    stale = proposal_of(store, proposal.id)
    assert stale.status is ProposalStatus.APPROVED
    first = gateway.dispatch(proposal.id)
    reads = iter([stale])
    fresh = gateway._proposal
    monkeypatch.setattr(gateway, "_proposal", lambda pid: next(reads, None) or fresh(pid))
    assert gateway.dispatch(proposal.id) == first
    assert sent_emails(desk) == 1
    assert proposal_of(store, proposal.id).status is ProposalStatus.DISPATCHED


def test_an_approval_used_once_cannot_be_used_again(
    gateway: Gateway, store: Store, store_url: str, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    assert gateway.dispatch(proposal.id).ok
    # A tamperer puts the proposal back in the queue: the approval is used.
    raw_execute(store_url, "UPDATE proposals SET status = 'approved' WHERE id = ?", (proposal.id,))
    denial = denied(lambda: gateway.dispatch(proposal.id))
    assert denial.reason_codes == ["approval_used"]
    assert sent_emails(desk) == 1
    assert len(desk.mailbox) == 1
    assert_blocked(store, proposal.id, "approval_used")

    # Even with the approval made fresh again by hand, the operation has its outcome:
    # the same operation is never sent twice.
    raw_execute(
        store_url, "UPDATE reviews SET consumed_at = NULL WHERE proposal_id = ?", (proposal.id,)
    )
    raw_execute(store_url, "UPDATE proposals SET status = 'approved' WHERE id = ?", (proposal.id,))
    again = gateway.dispatch(proposal.id)
    assert again.ok
    assert sent_emails(desk) == 1
    assert len(desk.mailbox) == 1


def test_a_proposal_cannot_use_another_proposals_approval(
    gateway: Gateway, store: Store, store_url: str, desk: SalesDesk
) -> None:
    first = approved_email(gateway)
    # The same content again, as a second operation: it has no approval of its own.
    second = propose(gateway)
    assert second.operation_id != first.operation_id
    assert second.params_digest == first.params_digest
    denial = denied(lambda: gateway.dispatch(second.id))
    assert set(denial.reason_codes) == {"approval_required", "proposal_not_approved"}
    assert desk.mailbox == {}
    # Dispatching too early does not destroy the pending proposal: it can still be
    # reviewed and dispatched.
    assert proposal_of(store, second.id).status is ProposalStatus.PENDING

    # A tamperer moves the first approval over to the second proposal and marks it
    # approved: the approval is bound to the first operation.
    raw_execute(
        store_url, "UPDATE reviews SET proposal_id = ? WHERE proposal_id = ?", (second.id, first.id)
    )
    raw_execute(store_url, "UPDATE proposals SET status = 'approved' WHERE id = ?", (second.id,))
    denial = denied(lambda: gateway.dispatch(second.id))
    assert denial.reason_codes == ["approval_mismatch"]
    assert desk.mailbox == {}
    assert_blocked(store, second.id, "approval_mismatch")
    # And the first proposal, robbed of its approval, cannot be dispatched either.
    denied(lambda: gateway.dispatch(first.id))
    assert desk.mailbox == {}
    assert sent_emails(desk) == 0


def test_a_premature_dispatch_leaves_the_proposal_reviewable(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    denial = denied(lambda: gateway.dispatch(proposal.id))
    assert set(denial.reason_codes) == {"approval_required", "proposal_not_approved"}
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING
    gateway.review(proposal.id, MANAGER, "approved")
    assert gateway.dispatch(proposal.id).ok
    assert len(desk.mailbox) == 1


def test_a_person_cannot_approve_what_their_agent_proposed_under_any_name(
    gateway: Gateway, store: Store
) -> None:
    # maria's assistant proposes; maria, however she is shown or spelled, and any
    # agent acting for her, is refused as self_review. Someone else's verdict goes
    # through, and every row names the authenticated identity and how it was had.
    assistant = agent_request(
        Principal(agent="maria-assistant", role="sales", tenant=TENANT, acts_for="maria"),
        QUOTE_TASK,
    ).model_copy(update={"authenticated_by": "token:maria-laptop"})
    other = Reviewer(
        id="mike", role="sales_manager", tenant=TENANT, authenticated_by="oidc:https://idp.test"
    )
    gather_evidence(gateway, assistant, reviewer=other)
    proposal = propose(gateway, assistant)
    for reviewer in (
        MANAGER.model_copy(update={"display_name": "M. Rossi (second account)"}),
        MANAGER.model_copy(update={"id": "Maria"}),
        Reviewer(
            id="helper",
            role="sales_manager",
            tenant=TENANT,
            kind="agent",
            acts_for="MARIA",
            authenticated_by="token:helper",
        ),
    ):
        denial = denied(lambda r=reviewer: gateway.review(proposal.id, r, "approved"))
        assert denial.reason_codes == ["self_review"], reviewer
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING
    review = gateway.review(proposal.id, other, "approved")
    assert (review.reviewer.id, review.reviewer.authenticated_by) == (
        "mike",
        "oidc:https://idp.test",
    )
    rows = store.ledger(proposal_id=proposal.id)
    proposed = next(r for r in rows if r.kind == "proposal")
    assert proposed.principal == "maria-assistant/sales"
    assert proposed.detail["authenticated_by"] == "token:maria-laptop"
    reviews = [r for r in rows if r.kind == "review"]
    assert [(r.outcome, r.detail["reviewer"]) for r in reviews] == [
        ("refused", "maria"),
        ("refused", "Maria"),
        ("refused", "helper"),
        ("approved", "mike"),
    ]
    assert reviews[-1].detail["authenticated_by"] == "oidc:https://idp.test"
    assert reviews[2].detail["acts_for"] == "MARIA"


def test_the_proposer_cannot_approve_its_own_proposal(gateway: Gateway, store: Store) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    # An agent passed where an identity belongs is refused before OPA is asked.
    with pytest.raises(InvalidInput, match="reviewer must be a Reviewer"):
        gateway.review(proposal.id, SALES, "approved")  # type: ignore[arg-type]
    as_agent = Reviewer.of_agent(SALES, authenticated_by="token:sales-bot")
    denial = denied(lambda: gateway.review(proposal.id, as_agent, "approved"))
    assert "self_review" in denial.reason_codes
    # Even in a reviewer's role, the same agent is the proposer.
    same_agent = Reviewer(
        id=SALES.agent, role="sales_manager", tenant=TENANT, authenticated_by="test:fixture"
    )
    denial = denied(lambda: gateway.review(proposal.id, same_agent, "approved"))
    assert denial.reason_codes == ["self_review"]
    assert denial.decision_id is not None
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING
    with store.transaction(read_only=True) as tx:
        assert tx.reviews(proposal.id) == []
    refused = store.ledger(proposal_id=proposal.id)[-1]
    assert (refused.kind, refused.outcome, refused.reason_codes) == (
        "review",
        "refused",
        ["self_review"],
    )
    assert refused.decision_id == denial.decision_id


def test_a_reviewer_of_another_tenant_is_refused(gateway: Gateway, store: Store) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    outsider = Reviewer(
        id="mallory", role="sales_manager", tenant="globex", authenticated_by="test:fixture"
    )
    denial = denied(lambda: gateway.review(proposal.id, outsider, "approved"))
    assert denial.reason_codes == ["tenant_mismatch"]
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING


def test_a_reviewer_whose_role_is_not_listed_for_the_tool_is_refused(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    finance = AgentSession(gateway, FINANCE_REQUEST)
    finance.call_tool("invoice.check_approval", invoice_id="inv-9")
    payment = finance.call_tool("payment.execute", **PAYMENT)["proposal_id"]
    # A sales manager approves the same kind of approval, but not for payments.
    denial = denied(lambda: gateway.review(payment, MANAGER, "approved"))
    assert denial.reason_codes == ["reviewer_not_permitted"]
    # A rejection needs the same right.
    denial = denied(lambda: gateway.review(payment, MANAGER, "rejected"))
    assert denial.reason_codes == ["reviewer_not_permitted"]
    assert proposal_of(store, payment).status is ProposalStatus.PENDING
    # And the other way round: a controller may not approve an email.
    gather_evidence(gateway)
    email = propose(gateway)
    denial = denied(lambda: gateway.review(email.id, CONTROLLER, "approved"))
    assert denial.reason_codes == ["reviewer_not_permitted"]
    assert desk.payments == {}
    assert desk.mailbox == {}


def test_only_a_pending_proposal_is_reviewed(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    other_manager = Reviewer(
        id="mike", role="sales_manager", tenant=TENANT, authenticated_by="test:fixture"
    )
    for verdict in ("approved", "rejected"):
        denial = denied(lambda v=verdict: gateway.review(proposal.id, other_manager, v))
        assert denial.reason_codes == ["proposal_not_pending"]
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    with store.transaction(read_only=True) as tx:
        assert len(tx.reviews(proposal.id)) == 1

    rejected = propose(gateway, params={**EMAIL, "subject": "Another"})
    gateway.review(rejected.id, MANAGER, "rejected")
    denied(lambda: gateway.review(rejected.id, other_manager, "approved"))
    denial = denied(lambda: gateway.dispatch(rejected.id))
    assert "proposal_not_approved" in denial.reason_codes
    assert proposal_of(store, rejected.id).status is ProposalStatus.REJECTED
    assert sent_emails(desk) == 0


def test_concurrent_reviews_record_one_verdict(gateway: Gateway, store: Store) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    reviewers = [
        Reviewer(id=f"manager-{n}", role="sales_manager", tenant=TENANT, authenticated_by="test")
        for n in range(6)
    ]
    start = threading.Barrier(len(reviewers))

    def review(reviewer: Reviewer) -> str:
        start.wait(timeout=HANG_SECONDS)
        try:
            gateway.review(proposal.id, reviewer, "approved")
        except CapabilityViolation as exc:
            return ",".join(exc.reason_codes)
        return "approved"

    with ThreadPoolExecutor(max_workers=len(reviewers)) as pool:
        results = list(pool.map(review, reviewers))
    assert results.count("approved") == 1
    assert set(results) == {"approved", "proposal_not_pending"}
    with store.transaction(read_only=True) as tx:
        assert len(tx.reviews(proposal.id)) == 1
    # Every attempt is in the ledger, the ones refused after OPA's allow included.
    rows = [row for row in store.ledger(proposal_id=proposal.id) if row.kind == "review"]
    assert sorted((row.outcome, tuple(row.reason_codes)) for row in rows) == [
        ("approved", ()),
        *[("refused", ("proposal_not_pending",))] * (len(reviewers) - 1),
    ]


def test_a_contract_changed_since_the_approval_is_not_dispatched(
    gateway: Gateway,
    store: Store,
    store_url: str,
    desk: SalesDesk,
    tmp_path: Path,
) -> None:
    proposal = approved_email(gateway)
    # The catalogue is updated (a new version of the email tool) while the approved
    # proposal waits; a gateway serving the new catalogue dispatches it.
    folder = write_lifecycle_catalogue(
        tmp_path / "v2", tool_updates={"quote.prepare_send": {"version": 2}}
    )
    catalogue = load_catalogue(folder)
    with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
        updated = make_gateway(catalogue, sidecar.client, store, desk.tools())
        denial = denied(lambda: updated.dispatch(proposal.id))
    assert "version_mismatch" in denial.reason_codes
    assert desk.mailbox == {}
    assert_blocked(store, proposal.id, "version_mismatch")


# -- 4. unknown outcomes: look up before retrying --------------------------------------------


def test_a_lost_payment_answer_is_unknown_and_the_retry_finds_it(
    gateway: Gateway, store: Store, desk: SalesDesk, sales_catalogue: Catalogue
) -> None:
    finance = AgentSession(gateway, FINANCE_REQUEST)
    finance.call_tool("invoice.check_approval", invoice_id="inv-9")
    proposal_id = finance.call_tool("payment.execute", **PAYMENT)["proposal_id"]
    gateway.review(proposal_id, CONTROLLER, "approved")
    operation_id = proposal_of(store, proposal_id).operation_id
    desk.lose_answer_once.add("payment.execute")

    first = gateway.dispatch(proposal_id)
    assert first.status is OutcomeStatus.UNKNOWN
    assert first.recovery == sales_catalogue.tools["payment.execute"].recovery
    assert first.recovery == "lookup_before_retry"
    assert list(desk.payments) == [operation_id]  # the bank took it
    stored = operation_of(store, operation_id)
    assert stored is not None
    assert stored.outcome is not None
    assert stored.outcome["status"] == "unknown"

    second = gateway.dispatch(proposal_id)
    assert second.status is OutcomeStatus.SUCCESS
    assert second.provider_receipt == desk.payments[operation_id]["payment_id"]
    assert desk.entered.count("payment.execute") == 1  # looked up, not paid again
    assert len(desk.payments) == 1
    assert gateway.dispatch(proposal_id) == second
    assert desk.entered.count("payment.execute") == 1

    stored = operation_of(store, operation_id)
    assert stored is not None
    assert stored.attempts == 2
    assert Outcome.model_validate(stored.outcome) == second
    rows = store.ledger(operation_id=operation_id)
    assert [(r.kind, r.outcome) for r in rows] == [
        ("proposal", "pending"),
        ("review", "approved"),
        ("dispatch", "dispatched"),
        ("intent", "running"),
        ("outcome", "unknown"),
        ("intent", "running"),
        ("outcome", "success"),
    ]
    assert rows[-1].detail["receipt"] == second.provider_receipt
    assert store.verify_ledger().ok
    # One payment happened, and the budget was charged for one.
    cost = sales_catalogue.tools["payment.execute"].cost_units
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    assert (budget.spent, budget.reserved) == (cost, 0)


def test_a_lost_email_receipt_is_unknown_and_the_retry_finds_it(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    proposal = approved_email(gateway)
    desk.lose_answer_once.add("quote.dispatch_reviewed")
    first = gateway.dispatch(proposal.id)
    assert first.status is OutcomeStatus.UNKNOWN
    assert first.recovery == "reconcile_provider_receipt"
    second = gateway.dispatch(proposal.id)
    assert second.ok
    assert second.provider_receipt == desk.mailbox[proposal.operation_id]["message_id"]
    assert sent_emails(desk) == 1
    assert len(desk.mailbox) == 1


def test_an_unknown_not_idempotent_call_without_a_lookup_is_never_sent_again(
    metered: Gateway, store: Store, provider: FileProvider, lifecycle_catalogue: Catalogue
) -> None:
    provider.lose_answer_once.add("meter.tick")
    first = metered.call(METER_REQUEST, "meter.tick", {"label": "x"}, operation_id="op-tick-1")
    assert isinstance(first, Outcome)
    assert first.status is OutcomeStatus.UNKNOWN
    assert first.recovery == lifecycle_catalogue.tools["meter.tick"].recovery
    assert len(provider.entries("meter.tick")) == 1

    for _ in range(2):
        again = metered.call(METER_REQUEST, "meter.tick", {"label": "x"}, operation_id="op-tick-1")
        assert again == first  # the first outcome; nothing sent
    assert len(provider.entries("meter.tick")) == 1
    assert kinds(store, operation_id="op-tick-1") == [
        ("intent", "running"),
        ("outcome", "unknown"),
        ("duplicate", "unknown"),
        ("duplicate", "unknown"),
    ]
    # Another operation is another tick.
    other = metered.call(METER_REQUEST, "meter.tick", {"label": "x"}, operation_id="op-tick-2")
    assert isinstance(other, Outcome)
    assert other.ok
    assert len(provider.entries("meter.tick")) == 2


def test_an_unknown_call_with_a_lookup_is_found_not_sent_again(
    metered: Gateway, store: Store, provider: FileProvider
) -> None:
    params = {"parcel_id": "p-1", "address": "1 Main St"}
    provider.lose_answer_once.add("parcel.ship")
    first = metered.call(METER_REQUEST, "parcel.ship", params, operation_id="op-ship-1")
    assert isinstance(first, Outcome)
    assert first.status is OutcomeStatus.UNKNOWN
    assert first.recovery == "lookup_before_retry"
    second = metered.call(METER_REQUEST, "parcel.ship", params, operation_id="op-ship-1")
    assert isinstance(second, Outcome)
    assert second.ok
    [shipped] = provider.entries("parcel.ship")
    assert second.provider_receipt == shipped["receipt"]
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    assert (budget.spent, budget.reserved) == (1, 0)


# -- 7. credentials ---------------------------------------------------------------------------


class CountingCredentials(StaticCredentials):
    """Static secrets that remember who asked for them, and when."""

    def __init__(self) -> None:
        super().__init__(SECRETS)
        self.resolved: list[tuple[str, str]] = []

    def resolve(self, tenant: str, alias: str) -> Secret:
        self.resolved.append((tenant, alias))
        return super().resolve(tenant, alias)


def test_a_secret_reaches_the_adapter_at_dispatch_only_and_is_written_nowhere(
    sales_catalogue: Catalogue,
    sales_sidecar: PolicySidecar,
    store: Store,
    store_url: str,
    desk: SalesDesk,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level
    mailbox_secret = SECRETS[(TENANT, "sales_mailbox")]
    seen: list[tuple[str | None, str | None, str | None]] = []
    tools = InProcessTools()

    def send(opportunity_id: str, recipient: str, subject: str, body: str) -> dict[str, Any]:
        call = current_call()
        assert call.credential is not None
        seen.append((call.credential.reveal(), call.account, call.connection_alias))
        return desk.quote_dispatch_reviewed(opportunity_id, recipient, subject, body)

    def fail_loudly(invoice_id: str, amount_cents: int, currency: str, beneficiary: str) -> Any:
        # A careless adapter that puts its whole context into an error message.
        raise RuntimeError(
            f"bank said no; context was {current_call()!r} {current_call().credential}"
        )

    tools.register("quote.dispatch_reviewed", "Send.", send)
    tools.register("payment.execute", "Pay.", fail_loudly)
    credentials = CountingCredentials()
    gateway = make_gateway(
        sales_catalogue, sales_sidecar.client, store, tools, desk.tools(), credentials=credentials
    )
    errors: list[BaseException] = []
    outcomes: list[Outcome] = []

    gather_evidence(gateway)
    proposal = propose(gateway)
    gateway.review(proposal.id, MANAGER, "approved")
    before = list(credentials.resolved)
    assert (TENANT, "sales_mailbox") not in before  # proposing and reviewing resolve nothing
    assert seen == []
    outcomes.append(gateway.dispatch(proposal.id))
    assert credentials.resolved[len(before) :] == [(TENANT, "sales_mailbox")]
    assert seen == [(mailbox_secret, "sales@acme.example", "sales_mailbox")]
    assert outcomes[-1].ok

    # A tool that fails with its context in the message, a denial, and a tool failure.
    finance = AgentSession(gateway, FINANCE_REQUEST)
    finance.call_tool("invoice.check_approval", invoice_id="inv-9")
    payment = finance.call_tool("payment.execute", **PAYMENT)["proposal_id"]
    gateway.review(payment, CONTROLLER, "approved")
    outcomes.append(gateway.dispatch(payment))
    assert not outcomes[-1].ok
    assert "Secret(***)" in (outcomes[-1].error or "")  # the context printed itself safely
    second = approved_email(gateway, subject="Second")
    gateway.revoke_connection(TENANT, "sales_mailbox", by="ops")
    try:
        gateway.dispatch(second.id)
    except CapabilityViolation as exc:
        errors.append(exc)
    session = AgentSession(gateway, SALES_REQUEST)
    try:
        session.call_tool("contact.verify_email", contact_id="c-77", email="cb@example.test")
    except ToolFailed as exc:
        errors.append(exc)
        outcomes.append(exc.outcome)
    assert len(errors) == 2

    secrets = [value for value in SECRETS.values()]
    logged = "\n".join(
        f"{r.name} {r.levelname} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records
    )
    assert "sales@acme.example" in logged
    assert "sales_mailbox" in logged
    ledger = "\n".join(row.model_dump_json() for row in store.ledger())
    assert "sales@acme.example" in ledger  # the connection row names the account
    # Every row of every table, and for SQLite the file's bytes too (WAL included).
    stored = table_dump(store_url).encode()
    if store.backend == "sqlite":
        stored += sqlite_file_bytes(store_url)
    assert b"sales@acme.example" in stored  # the grep below can see rows at all
    assert sales_sidecar.process is not None
    opa_log = sales_sidecar.process.log_path.read_text(errors="replace")
    assert "capgate/execute/decision" in opa_log  # it logged the questions it was asked
    texts = {
        "logs": logged,
        "OPA's decision log": opa_log,
        "ledger": ledger,
        "errors": "\n".join(f"{e} {e!r}" for e in errors),
        "outcomes": "\n".join(o.model_dump_json() for o in outcomes),
        "store": stored.decode("latin-1"),
    }
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a secret leaked into the {where}"


# -- 8. facts come from the store ------------------------------------------------------------


@pytest.mark.parametrize("fact", ["approval", "connections", "evidence", "budget", "proposal"])
def test_a_caller_cannot_assert_a_fact_that_grants(fact: str) -> None:
    with pytest.raises(ValidationError):
        AgentRequest.model_validate(
            {"principal": SALES, "task": QUOTE_TASK, "environment": "production", fact: {}}
        )
    with pytest.raises(ValidationError):  # nor hide it in the task
        AgentRequest.model_validate(
            {"principal": SALES, "task": {**QUOTE_TASK, fact: {}}, "environment": "production"}
        )
    with pytest.raises(ValidationError):  # nor in the principal
        AgentRequest.model_validate(
            {"principal": {**SALES.model_dump(), fact: {}}, "task": QUOTE_TASK, "environment": "x"}
        )
    for entry in (Gateway.call, Gateway.compose, Gateway.dispatch, AgentSession.__init__):
        assert fact not in inspect.signature(entry).parameters


def test_facts_passed_as_tool_parameters_are_refused(
    gateway: Gateway, store: Store, store_url: str, desk: SalesDesk
) -> None:
    gather_evidence(gateway)
    session = AgentSession(gateway, SALES_REQUEST)
    before = row_counts(store_url)
    with pytest.raises(InvalidInput):
        session.call_tool("quote.prepare_send", **EMAIL, approval={"used": False})
    with pytest.raises(TypeError):
        gateway.call(SALES_REQUEST, "quote.prepare_send", EMAIL, approval={})  # type: ignore[call-arg]
    assert row_counts(store_url) == before


def test_a_session_built_before_a_revoke_cannot_use_the_revoked_connection(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    session = AgentSession(gateway, SALES_REQUEST)
    assert "contact.read" in session.visible_tools
    session.call_tool("contact.read", contact_id="c-42")
    gateway.revoke_connection(TENANT, "crm", by="ops")
    entered = len(desk.entered)
    denial = denied(lambda: session.call_tool("contact.read", contact_id="c-42"))
    assert denial.reason_codes == ["connection_revoked"]
    assert len(desk.entered) == entered
    assert "contact.read" in session.visible_tools  # stale, and it does not matter
    assert "contact.read" not in session.refresh().visible

    # The same when the store changes under the gateway's feet.
    gateway.restore_connection(TENANT, "crm", by="ops")
    session.refresh()
    with store.transaction() as tx:
        tx.set_connection_status(TENANT, "crm", ConnectionStatus.DISABLED)
    denial = denied(lambda: session.call_tool("contact.read", contact_id="c-42"))
    assert denial.reason_codes == ["tool_not_enabled_for_tenant"]
    assert len(desk.entered) == entered


def test_evidence_comes_from_successful_producing_calls_only(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    session = AgentSession(gateway, SALES_REQUEST)
    # Nothing recorded yet: proposing the email is denied for the missing evidence.
    denial = denied(lambda: session.call_tool("quote.prepare_send", **EMAIL))
    assert set(denial.reason_codes) == {"evidence_missing"}
    assert len(denial.reasons) == 3
    # A refused producing call records nothing.
    for tool, params in (
        ("contact.verify_email", {"contact_id": "c-77", "email": "cb@example.test"}),
        ("contact.verify_email", {"contact_id": "c-42", "email": "cb@example.test"}),
        ("consent.check", {"contact_id": "c-77"}),
    ):
        with pytest.raises(ToolFailed) as failed:
            session.call_tool(tool, **params)
        assert failed.value.outcome.status is OutcomeStatus.REFUSED
    assert evidence_of(store, SALES_REQUEST.task_id) == set()
    # Successful ones do, for this task only.
    session.call_tool("contact.verify_email", contact_id="c-42", email=EMAIL["recipient"])
    session.call_tool("consent.check", contact_id="c-42")
    assert evidence_of(store, SALES_REQUEST.task_id) == {
        "verified_recipient",
        "communication_permission",
    }
    denial = denied(lambda: session.call_tool("quote.prepare_send", **EMAIL))
    assert [r.message for r in denial.reasons if "current_quote_revision" in r.message]
    quote = session.call_tool("quote.propose", **QUOTE)["proposal_id"]
    assert evidence_of(store, SALES_REQUEST.task_id) == {
        "verified_recipient",
        "communication_permission",
    }  # a proposal is not a quote
    gateway.review(quote, MANAGER, "approved")
    assert gateway.dispatch(quote).ok
    assert "current_quote_revision" in evidence_of(store, SALES_REQUEST.task_id)
    assert session.call_tool("quote.prepare_send", **EMAIL)["status"] == "pending_review"
    # Another task of the same agent has none of it.
    other = agent_request(SALES, {**QUOTE_TASK, "id": "task-quote-18"})
    denial = denied(lambda: gateway.call(other, "quote.prepare_send", EMAIL))
    assert set(denial.reason_codes) == {"evidence_missing"}


def test_the_same_operation_with_other_parameters_is_a_conflict(
    metered: Gateway, store: Store, store_url: str, provider: FileProvider
) -> None:
    first = metered.call(METER_REQUEST, "meter.tick", {"label": "a"}, operation_id="op-same")
    assert isinstance(first, Outcome)
    assert first.ok
    before = row_counts(store_url)
    with pytest.raises(OperationConflict):
        metered.call(METER_REQUEST, "meter.tick", {"label": "b"}, operation_id="op-same")
    with pytest.raises(OperationConflict):
        metered.call(
            METER_REQUEST,
            "parcel.ship",
            {"parcel_id": "p", "address": "a"},
            operation_id="op-same",
        )
    assert row_counts(store_url) == before
    assert len(provider.entries()) == 1
    # The same call again is the first outcome.
    assert (
        metered.call(METER_REQUEST, "meter.tick", {"label": "a"}, operation_id="op-same") == first
    )
    assert len(provider.entries()) == 1


def test_a_proposal_reusing_an_operation_id_with_other_content_is_a_conflict(
    gateway: Gateway, store: Store, store_url: str
) -> None:
    gather_evidence(gateway)
    first = propose(gateway, operation_id="op-email-1")
    assert propose(gateway, operation_id="op-email-1") == first  # the same proposal again
    before = row_counts(store_url)
    with pytest.raises(OperationConflict):
        gateway.call(
            SALES_REQUEST,
            "quote.prepare_send",
            {**EMAIL, "subject": "Other"},
            operation_id="op-email-1",
        )
    assert row_counts(store_url) == before


def test_an_operation_id_a_call_used_cannot_be_proposed_for_another_call(
    gateway: Gateway, store: Store, store_url: str, desk: SalesDesk
) -> None:
    gather_evidence(gateway)
    read = gateway.call(SALES_REQUEST, "contact.read", {"contact_id": "c-42"}, operation_id="op-1")
    assert isinstance(read, Outcome)
    assert read.ok
    before = row_counts(store_url)
    # Refused when proposed, not after a person reviewed it and the dispatch collides.
    with pytest.raises(OperationConflict):
        gateway.call(SALES_REQUEST, "quote.prepare_send", EMAIL, operation_id="op-1")
    assert row_counts(store_url) == before
    assert desk.mailbox == {}


def test_a_call_cannot_take_the_operation_id_of_a_pending_proposal(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway, operation_id="op-held")
    # The id is the proposal's from the moment it is proposed: a read under it is
    # refused, rather than letting the reviewed dispatch collide with it later.
    with pytest.raises(OperationConflict, match="belongs to proposal"):
        gateway.call(SALES_REQUEST, "contact.read", {"contact_id": "c-42"}, operation_id="op-held")
    assert operation_of(store, "op-held") is None
    gateway.review(proposal.id, MANAGER, "approved")
    outcome = gateway.dispatch(proposal.id)
    assert outcome.status is OutcomeStatus.SUCCESS
    assert list(desk.mailbox) == ["op-held"]


# -- 9. bad input: a clear error, nothing partly written ------------------------------------------


def test_bad_input_is_refused_with_nothing_written(
    gateway: Gateway, store: Store, store_url: str, desk: SalesDesk
) -> None:
    gather_evidence(gateway)
    proposal = propose(gateway)
    before = row_counts(store_url)
    ledger_before = store.ledger()

    with pytest.raises(UnknownProposal) as unknown:
        gateway.dispatch("prop-does-not-exist")
    assert unknown.value.proposal_id == "prop-does-not-exist"
    assert "prop-does-not-exist" in str(unknown.value)
    with pytest.raises(UnknownProposal):
        gateway.review("prop-does-not-exist", MANAGER, "approved")

    stranger = agent_request(Principal(agent="bot", role="sales", tenant="globex"), QUOTE_TASK)
    for attempt in (
        lambda: gateway.call(stranger, "contact.read", {"contact_id": "c-42"}),
        lambda: gateway.call(stranger, "quote.prepare_send", EMAIL),
        lambda: gateway.compose(stranger),
        lambda: AgentSession(gateway, stranger),
    ):
        with pytest.raises(UnknownTenant) as unknown_tenant:
            attempt()
        assert unknown_tenant.value.tenant == "globex"
        assert "'globex'" in str(unknown_tenant.value)

    for bad in ("", " ", "has space", "x" * 129, "-leading-dash", "a\nb"):
        for tool, params in (
            ("contact.read", {"contact_id": "c-42"}),
            ("quote.prepare_send", EMAIL),
        ):
            with pytest.raises(InvalidInput) as invalid:
                gateway.call(SALES_REQUEST, tool, params, operation_id=bad)
            assert "operation" in str(invalid.value)
    with pytest.raises(InvalidInput):
        gateway.call(SALES_REQUEST, "contact.read", {"contact_id": "c-42"}, operation_id=17)  # type: ignore[arg-type]

    for verdict in ("maybe", "APPROVED", "", None, 1):
        with pytest.raises(InvalidInput) as invalid:
            gateway.review(proposal.id, MANAGER, verdict)  # type: ignore[arg-type]
        assert "verdict" in str(invalid.value)
    for ttl in (timedelta(0), timedelta(seconds=-1), 3600, "1h"):
        with pytest.raises(InvalidInput):
            gateway.review(proposal.id, MANAGER, "approved", ttl=ttl)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        gateway.review(proposal.id, {"agent": "maria"}, "approved")  # type: ignore[arg-type]
    with pytest.raises(UnknownConnection):
        gateway.revoke_connection(TENANT, "no_such_alias", by="ops")
    with pytest.raises(UnknownConnection):
        gateway.revoke_connection("globex", "crm", by="ops")

    assert row_counts(store_url) == before
    assert store.ledger() == ledger_before
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING
    assert desk.mailbox == {}
    assert raw_rows(store_url, "SELECT count(*) FROM operations WHERE operation_id = ?", ("",)) == [
        (0,)
    ]


# -- 6. a run longer than its lease (crashes: test_lifecycle_crash.py) -----------------------------


def test_a_live_run_longer_than_its_lease_keeps_it_renewed(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
    clock: ShiftClock,
) -> None:
    # A tool held at the provider until the store's clock has passed its first lease:
    # the gateway running it renews the lease, so another gateway's reconcile leaves it
    # alone and a duplicate waits for its outcome instead of taking it over (and
    # sending a second time). The store's clock is moved on rather than waited for, and
    # the lease (10 s, renewed every third of it) is long enough that a renewal thread
    # kept waiting by a loaded machine still renews in time.
    lease = timedelta(seconds=10)
    slow = make_gateway(
        lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools(), lease=lease
    )
    other = make_gateway(
        lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools(), lease=lease,
        duplicate_wait=INNER_HANG_SECONDS,  # the runner's outcome must come: a hang bound
    )  # fmt: skip
    held = threading.Event()
    provider.before_effect = lambda tool: held.wait(HANG_SECONDS)
    params = {"parcel_id": "p-8", "address": "8 Slow Lane"}
    answers: list[Outcome | ProposalRecord | Exception] = []

    def ship(gateway: Any) -> None:
        try:
            answers.append(
                gateway.call(METER_REQUEST, "parcel.ship", params, operation_id="op-long")
            )
        except Exception as exc:
            answers.append(exc)

    runner = threading.Thread(target=ship, args=(slow,))
    runner.start()
    wait_until(lambda: kinds(store, operation_id="op-long") != [], what="the intent")
    first = operation_of(store, "op-long")
    assert first is not None
    assert first.lease_until is not None
    clock.offset = lease + timedelta(seconds=1)  # the run is now longer than its lease
    wait_until(
        lambda: (
            (op := operation_of(store, "op-long")) is not None
            and op.lease_until is not None
            and first.lease_until is not None
            and op.lease_until > first.lease_until + lease
        ),
        what="a renewal of the lease past the first one",
    )
    assert other.reconcile() == []
    duplicate = threading.Thread(target=ship, args=(other,))
    duplicate.start()  # it waits for the runner's outcome, while the tool is held
    held.set()
    runner.join(timeout=HANG_SECONDS)  # the answers are asserted: they must come
    duplicate.join(timeout=HANG_SECONDS)
    assert len(answers) == 2
    assert all(isinstance(a, Outcome) and a.ok for a in answers), answers
    assert len(provider.entries("parcel.ship")) == 1
    rows = store.ledger(operation_id="op-long")
    assert [(r.kind, r.outcome) for r in rows if r.kind != "duplicate"] == [
        ("intent", "running"),
        ("outcome", "success"),
    ]
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    assert (budget.spent, budget.reserved) == (1, 0)


def test_a_run_whose_lease_lapsed_still_ends_in_its_outcome(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
    clock: ShiftClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A run whose lease could not be renewed (the store was out of reach for its
    # renewing thread), and another gateway reconciling meanwhile: the run is marked
    # unknown, its reservation held under it. The tool is held at the provider until
    # the reconcile is done; the run's own end must still come back as an Outcome, be
    # recorded over the unknown, and settle the budget once.
    slow = make_gateway(
        lifecycle_catalogue,
        lifecycle_sidecar.client,
        store,
        provider.tools(),
        lease=timedelta(seconds=10),
    )
    monkeypatch.setattr(slow._leases, "_renew", lambda *args: None)
    other = make_gateway(lifecycle_catalogue, lifecycle_sidecar.client, store)
    held = threading.Event()
    provider.before_effect = lambda tool: held.wait(HANG_SECONDS)
    params = {"parcel_id": "p-9", "address": "9 Slow Lane"}
    answers: list[Outcome | ProposalRecord | Exception] = []

    def ship() -> None:
        try:
            answers.append(slow.call(METER_REQUEST, "parcel.ship", params, operation_id="op-slow"))
        except Exception as exc:
            answers.append(exc)

    runner = threading.Thread(target=ship)
    runner.start()
    wait_until(lambda: kinds(store, operation_id="op-slow") != [], what="the intent")
    clock.offset = timedelta(seconds=11)  # past the lease, by the store's clock
    assert [r.operation_id for r in other.reconcile()] == ["op-slow"]
    held.set()
    runner.join(timeout=HANG_SECONDS)  # the answer is asserted: it must come
    [answer] = answers
    assert isinstance(answer, Outcome), answer
    assert answer.ok
    [shipped] = provider.entries("parcel.ship")
    assert answer.provider_receipt == shipped["receipt"]
    stored = operation_of(store, "op-slow")
    assert stored is not None
    assert stored.outcome is not None
    assert stored.outcome["provider_receipt"] == shipped["receipt"]  # better than unknown
    rows = store.ledger(operation_id="op-slow")
    assert [(r.kind, r.outcome) for r in rows] == [
        ("intent", "running"),
        ("outcome", "unknown"),
        ("outcome", "success"),
    ]
    assert rows[-1].detail["after_lease"] is True
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    assert (budget.spent, budget.reserved) == (1, 0)
    assert store.verify_ledger().ok
    # And the operation is settled: the same call again is that outcome, nothing sent.
    assert slow.call(METER_REQUEST, "parcel.ship", params, operation_id="op-slow") == answer
    assert len(provider.entries("parcel.ship")) == 1


# -- budgets charged once per operation; denials that name their policy ---------------------------


def test_a_duplicate_gets_its_first_outcome_after_the_budget_is_spent(
    metered: Gateway, store: Store, provider: FileProvider
) -> None:
    with store.transaction() as tx:
        tx.set_budget_limit(TENANT, 1)
    first = metered.call(METER_REQUEST, "meter.tick", {"label": "a"}, operation_id="op-b")
    assert isinstance(first, Outcome)
    assert first.ok
    assert metered.call(METER_REQUEST, "meter.tick", {"label": "a"}, operation_id="op-b") == first
    assert len(provider.entries()) == 1


def test_an_unknown_payment_can_be_looked_up_when_it_spent_the_whole_budget(
    gateway: Gateway, store: Store, desk: SalesDesk, sales_catalogue: Catalogue
) -> None:
    with store.transaction() as tx:
        tx.set_budget_limit(TENANT, sales_catalogue.tools["payment.execute"].cost_units)
    finance = AgentSession(gateway, FINANCE_REQUEST)
    finance.call_tool("invoice.check_approval", invoice_id="inv-9")
    proposal_id = finance.call_tool("payment.execute", **PAYMENT)["proposal_id"]
    gateway.review(proposal_id, CONTROLLER, "approved")
    desk.lose_answer_once.add("payment.execute")
    assert gateway.dispatch(proposal_id).status is OutcomeStatus.UNKNOWN
    assert gateway.dispatch(proposal_id).ok
    assert len(desk.payments) == 1


def test_a_denied_dispatch_row_names_the_policy_revision(
    gateway: Gateway, store: Store, sales_sidecar: PolicySidecar
) -> None:
    proposal = approved_email(gateway)
    gateway.revoke_connection(TENANT, "sales_mailbox", by="ops")
    denied(lambda: gateway.dispatch(proposal.id))
    deny = store.ledger(proposal_id=proposal.id)[-1]
    assert (deny.kind, deny.outcome) == ("decision", "deny")
    assert deny.decision_id is not None
    revision = sales_sidecar.client.expected_revision
    assert revision is not None
    assert deny.policy_revision is not None
    assert revision in deny.policy_revision
