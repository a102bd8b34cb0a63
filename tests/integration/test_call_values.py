"""A call's values reach the policies, against a real OPA and both stores (#21).

The demo catalogue's payment.execute sends its amount and currency
(``values:``) and limits one payment by the finance role to 5,000.00 (``limits:``):
a payment over it is denied with ``value_over_limit`` before anything is proposed,
and at the limit it is proposed as before (the roles a limit is for, and the other
cases, are the Rego tests' in execute_values_test.rego). A budget can count an
amount instead of a fixed cost (``cost_value``): the reservation is the amount, and
a payment larger than what is left is refused. The limit and the quorum threshold
are on the amount converted into euros by the catalogue's currencies.yaml
(``derive: converted``), so they hold in every currency the table names, and a
payment in any other currency is refused before OPA is asked.

Above 2,000.00 two distinct controllers must approve. The gateway shows the review
policy who has approved so far and records an approval as completing the quorum
only when the policy says so (``quorum_met``), and only while the approvals it
counted still stand: two controllers deciding at the same moment are not both told
they are one short, and an approval that expired before the next one is not
counted by it. Reviewers see the progress (the desk's view, the MCP answer) in the
policy's number.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from capgate.adapters.fronts.answers import verdict_answer
from capgate.adapters.fronts.desk import ReviewDesk
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import CapabilityViolation, InvalidInput
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import ReviewDecision
from capgate.gateway.model.facts import ReviewInput
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.proposals import QuorumProgress, quorum_progress
from capgate.gateway.state.records import ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from tests.integration import lifecycle_support as lifecycle_fixtures
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_support import (
    CONTROLLER,
    FINANCE,
    PAY_TASK,
    PAYMENT,
    TENANT,
    SalesDesk,
    agent_request,
    make_gateway,
    proposal_of,
)

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url
clock = lifecycle_fixtures.clock
store = lifecycle_fixtures.store
desk = lifecycle_fixtures.desk
gateway = lifecycle_fixtures.gateway

FINANCE_REQUEST = agent_request(FINANCE, PAY_TASK)


def pay(gateway: Any, amount_cents: int, currency: str = "EUR") -> Any:
    gateway.call(FINANCE_REQUEST, "invoice.check_approval", {"invoice_id": "inv-9"})
    return gateway.call(
        FINANCE_REQUEST,
        "payment.execute",
        {**PAYMENT, "amount_cents": amount_cents, "currency": currency},
    )


def test_a_payment_over_the_roles_limit_is_denied_with_its_own_code(gateway, store: Store):
    with pytest.raises(CapabilityViolation) as denied:
        pay(gateway, 500_001)
    assert denied.value.reason_codes == ["value_over_limit"]
    [reason] = denied.value.reasons
    assert 'up to 500000 for role "finance"' in reason.message
    assert "500001" in reason.message
    with store.transaction(read_only=True) as tx:
        assert tx.list_proposals() == []  # nothing proposed, nothing to review
    at_limit = pay(gateway, 500_000)
    assert isinstance(at_limit, ProposalRecord)
    assert at_limit.status is ProposalStatus.PENDING


def test_the_limit_compares_the_amount_converted_into_euros(gateway, store: Store):
    # 4,500.00 GBP is under 500000 as written, but 5,265.00 EUR by the demo's rate.
    with pytest.raises(CapabilityViolation) as denied:
        pay(gateway, 450_000, "GBP")
    assert denied.value.reason_codes == ["value_over_limit"]
    assert "526500" in denied.value.reasons[0].message
    # 5,400.00 USD is over 500000 as written, but 4,968.00 EUR: proposed.
    in_dollars = pay(gateway, 540_000, "USD")
    assert isinstance(in_dollars, ProposalRecord)
    assert in_dollars.status is ProposalStatus.PENDING


def test_a_currency_without_a_rate_is_refused_before_anything_is_proposed(
    gateway, store: Store, desk
):
    with pytest.raises(InvalidInput, match="no rate in the catalogue's currency table"):
        pay(gateway, 1_000, "XTS")
    with store.transaction(read_only=True) as tx:
        assert tx.list_proposals() == []
    rows = [r for r in store.ledger(tenant=TENANT) if r.tool == "payment.execute"]
    assert rows == []  # refused before OPA: no decision to record
    assert not desk.payments


def test_the_quorum_threshold_is_in_euros_too(gateway, store: Store, desk):
    # 2,100.00 USD is 1,932.00 EUR: at most 2,000.00 EUR, one controller is enough.
    proposal = pay(gateway, 210_000, "USD")
    gateway.review(proposal.id, CONTROLLER, "approved")
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    # 1,800.00 GBP is 2,106.00 EUR: a second, distinct controller is needed.
    pounds = pay(gateway, 180_000, "GBP")
    gateway.review(pounds.id, CONTROLLER, "approved")
    assert proposal_of(store, pounds.id).status is ProposalStatus.PENDING


def test_a_budget_can_count_the_amount(tmp_path: Path, store: Store, desk, sales_sidecar):
    # The demo catalogue, its payment counting amount_cents against the budget.
    source = demo_catalogue_dir("sales")
    folder = tmp_path / "catalogue"
    folder.mkdir()
    for path in source.glob("*.yaml"):
        (folder / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    tools = yaml.safe_load((folder / "tools.yaml").read_text(encoding="utf-8"))
    for tool in tools["tools"]:
        if tool["name"] == "payment.execute":
            tool["cost_value"] = "amount_cents"
    (folder / "tools.yaml").write_text(yaml.safe_dump(tools), encoding="utf-8")
    catalogue = load_catalogue(folder)
    with store.transaction() as tx:
        tx.set_budget_limit(TENANT, 150_000)
    with PolicySidecar(catalogue) as sidecar:
        counted = make_gateway(catalogue, sidecar.client, store, desk.tools())
        proposal = pay(counted, 120_000)
        counted.review(proposal.id, CONTROLLER, "approved")
        assert counted.dispatch(proposal.id).ok
        with store.transaction(read_only=True) as tx:
            budget = tx.budget(TENANT)
        assert (budget.spent, budget.reserved) == (120_000, 0)

        second = pay(counted, 40_000)  # proposing reserves nothing; dispatch would
        counted.review(second.id, CONTROLLER, "approved")
        with pytest.raises(CapabilityViolation) as short:
            counted.dispatch(second.id)
        assert short.value.reason_codes == ["budget_exhausted"]
        assert proposal_of(store, second.id).status is ProposalStatus.BLOCKED
        assert len(desk.payments) == 1


# -- a quorum of distinct reviewers ---------------------------------------------------------

#: A second controller: above 2,000.00 the demo's payments need two.
SECOND_CONTROLLER = CONTROLLER.model_copy(update={"id": "dana"})
THIRD_CONTROLLER = CONTROLLER.model_copy(update={"id": "emil"})


def review_rows(store: Store, proposal_id: str) -> list[tuple[str | None, str | None]]:
    return [(r.principal, r.outcome) for r in store.ledger(tenant=TENANT)
            if r.kind == "review" and r.proposal_id == proposal_id]  # fmt: skip


def test_above_the_threshold_two_distinct_reviewers_must_approve(gateway, store: Store, desk):
    proposal = pay(gateway, 300_000)
    gateway.review(proposal.id, CONTROLLER, "approved")
    gateway.review(proposal.id, CONTROLLER, "approved")  # the same person counts once
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING
    with store.transaction(read_only=True) as tx:
        assert tx.get_dispatch(proposal.id) is None  # nothing queued for the workers
    with pytest.raises(CapabilityViolation) as early:
        gateway.dispatch(proposal.id)
    assert "proposal_not_approved" in early.value.reason_codes
    assert not desk.payments

    gateway.review(proposal.id, SECOND_CONTROLLER, "approved")
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    assert gateway.dispatch(proposal.id).ok
    assert len(desk.payments) == 1
    assert [outcome for _, outcome in review_rows(store, proposal.id)] == [
        "awaiting_quorum",
        "awaiting_quorum",
        "approved",
    ]


def test_a_person_and_the_agent_acting_for_them_are_one_approval(gateway, store: Store, desk):
    assistant = CONTROLLER.model_copy(
        update={"id": "carl-assistant", "kind": "agent", "acts_for": "Carl"}
    )
    proposal = pay(gateway, 300_000)
    gateway.review(proposal.id, CONTROLLER, "approved")
    gateway.review(proposal.id, assistant, "approved")
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING
    gateway.review(proposal.id, SECOND_CONTROLLER, "approved")
    assert gateway.dispatch(proposal.id).ok


def test_at_the_threshold_one_approval_is_enough(gateway, store: Store, desk):
    proposal = pay(gateway, 200_000)
    gateway.review(proposal.id, CONTROLLER, "approved")
    assert gateway.dispatch(proposal.id).ok
    assert len(desk.payments) == 1


def test_an_approval_that_expired_before_the_dispatch_no_longer_counts(
    gateway, store: Store, desk, clock
):
    proposal = pay(gateway, 300_000)
    clock.offset = -timedelta(hours=2)  # both reviews two hours ago: the first for one hour
    gateway.review(proposal.id, CONTROLLER, "approved", ttl=timedelta(hours=1))
    gateway.review(proposal.id, SECOND_CONTROLLER, "approved", ttl=timedelta(hours=6))
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    clock.offset = timedelta(0)
    with pytest.raises(CapabilityViolation) as short:
        gateway.dispatch(proposal.id)
    assert short.value.reason_codes == ["approval_quorum_not_met"]
    assert proposal_of(store, proposal.id).status is ProposalStatus.BLOCKED
    assert not desk.payments


# -- the quorum is counted by the review policy, on the approvals that stand ---------------


class Watched:
    """The real policy client, with the review questions it was asked kept; the first
    ``held`` reviews wait at ``barrier`` after OPA answered, so that they are all
    decided before any is recorded."""

    def __init__(self, client: Any, held: int = 0) -> None:
        self.client = client
        self.asked: list[ReviewInput] = []
        self.answers: list[ReviewDecision] = []
        self.held = held
        self.barrier = threading.Barrier(held) if held else None
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def review(self, facts: ReviewInput) -> ReviewDecision:
        decision = self.client.review(facts)
        with self.lock:
            self.asked.append(facts)
            self.answers.append(decision)
            hold = len(self.asked) <= self.held
        if hold and self.barrier is not None:
            self.barrier.wait(timeout=600)  # the other reviewer's question, however slow
        return decision


def test_the_policy_is_shown_who_approved_and_says_when_the_quorum_is_met(
    sales_catalogue: Catalogue, sales_sidecar: PolicySidecar, store: Store, desk: SalesDesk
):
    policy = Watched(sales_sidecar.client)
    gateway = make_gateway(sales_catalogue, policy, store, desk.tools())  # type: ignore[arg-type]
    proposal = pay(gateway, 300_000)
    gateway.review(proposal.id, CONTROLLER, "approved")
    gateway.review(proposal.id, SECOND_CONTROLLER, "approved")
    assert [facts.proposal.approvers for facts in policy.asked] == [[], ["carl"]]
    assert [(a.approvals_required, a.quorum_met) for a in policy.answers] == [
        (2, False),
        (2, True),
    ]
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    assert gateway.dispatch(proposal.id).ok


def test_two_reviewers_approving_at_once_complete_the_quorum(
    sales_catalogue: Catalogue, sales_sidecar: PolicySidecar, store: Store, desk: SalesDesk
):
    # Both are answered "one short" before either is recorded: the second to record
    # finds the approvals changed, is asked again, and completes the quorum.
    policy = Watched(sales_sidecar.client, held=2)
    gateway = make_gateway(sales_catalogue, policy, store, desk.tools())  # type: ignore[arg-type]
    proposal = pay(gateway, 300_000)
    with ThreadPoolExecutor(max_workers=2) as pool:
        reviews = [
            pool.submit(gateway.review, proposal.id, reviewer, "approved")
            for reviewer in (CONTROLLER, SECOND_CONTROLLER)
        ]
        for review in reviews:
            review.result()
    assert [a.quorum_met for a in policy.answers[:2]] == [False, False]
    assert len(policy.asked) == 3
    assert sorted(policy.asked[2].proposal.approvers) in (["carl"], ["dana"])
    assert policy.answers[2].quorum_met is True
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    with store.transaction(read_only=True) as tx:
        assert tx.get_dispatch(proposal.id) is not None
    outcomes = [r.outcome for r in store.ledger(proposal_id=proposal.id) if r.kind == "review"]
    assert outcomes == ["awaiting_quorum", "approved"]
    assert gateway.dispatch(proposal.id).ok
    assert len(desk.payments) == 1


def test_an_approval_expired_before_the_next_one_is_not_counted_by_it(
    gateway, store: Store, desk: SalesDesk, clock
):
    proposal = pay(gateway, 300_000)
    clock.offset = -timedelta(hours=2)
    gateway.review(proposal.id, CONTROLLER, "approved", ttl=timedelta(hours=1))
    clock.offset = timedelta(0)  # carl's approval expired an hour ago
    gateway.review(proposal.id, SECOND_CONTROLLER, "approved")
    assert proposal_of(store, proposal.id).status is ProposalStatus.PENDING
    assert quorum_progress(store, proposal.id) == QuorumProgress(approvals=1, required=2)
    gateway.review(proposal.id, THIRD_CONTROLLER, "approved")
    assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
    assert gateway.dispatch(proposal.id).ok


def test_reviewers_see_the_progress_in_the_policy_s_number(gateway, store: Store):
    reviews = ReviewDesk(gateway)
    proposal = pay(gateway, 300_000)
    # Before anyone approved, the gateway has not asked: it claims no number.
    assert reviews.show(CONTROLLER, proposal.id).quorum is None
    first = reviews.decide(CONTROLLER, proposal.id, "approved", digest=proposal.params_digest)
    progress = reviews.progress(proposal.id)
    assert progress == QuorumProgress(approvals=1, required=2)
    assert reviews.show(SECOND_CONTROLLER, proposal.id).quorum == progress
    answer = verdict_answer(first, progress)
    assert answer.facts["status"] == "awaiting_quorum"
    assert (answer.facts["approvals"], answer.facts["approvals_required"]) == (1, 2)
    assert "1 of the 2 distinct reviewers" in answer.text
    assert "dispatches" not in answer.text

    second = reviews.decide(
        SECOND_CONTROLLER, proposal.id, "approved", digest=proposal.params_digest
    )
    assert reviews.progress(proposal.id) is None  # approved: nothing left to wait for
    assert reviews.show(CONTROLLER, proposal.id).quorum is None
    assert verdict_answer(second, None).facts["status"] == "approved"
