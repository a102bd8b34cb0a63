"""Representative calls a catalogue names, with the decisions they must get.

A contract change is easy to review by its diff and hard to review by its effect:
does the finance agent still get to pay an approved invoice, is the payment over
its limit still refused? A catalogue answers that itself in its optional
``fixtures.yaml``: sample calls, each with the facts it is made under and the
decision it must get. The catalogue holds each to its tools at load; here each is
made a call (its parameters prepared under its tool's contract) and asked of the
real OPA before a gateway starts to serve (:func:`check_fixtures`: one that is not a
call the contract takes, or does not get its decision, stops the start), and put to
both sides of ``capgate diff``, which shows each one's decision before and after.

A fixture's execute input is built here (:class:`FixtureCalls`) the way the gateway
builds a call's: the parameters prepared by the same dispatcher (validated, hashed,
their subject and declared values read) under the catalogue's contract of today,
so a contract that changes what a call means is tried with the change. The facts
the store would give (connections, evidence, budget, an approval) are the
fixture's own.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import CapgateError, CatalogueError, PolicyUnavailable, quote
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision
from capgate.gateway.model.facts import (
    Approval,
    Approver,
    Budget,
    ComposeInput,
    ConnectionStatus,
    EvidencePiece,
    ExecuteInput,
    ProposalRef,
    Stage,
)
from capgate.gateway.model.fixtures import Fixture, FixtureOutcome
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["FixtureCalls", "check_fixtures", "fixture_outcome"]

#: How long a fixture's approval is good for, from the moment it is asked.
_APPROVAL_LIFETIME: Final = timedelta(hours=1)
_OPERATION: Final = "capgate-fixture"


class _Unasked:
    """The policy of a dispatcher that only prepares: it is never asked."""

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        raise PolicyUnavailable("a fixture's dispatcher asks no policy")

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        raise PolicyUnavailable("a fixture's dispatcher asks no policy")


class FixtureCalls:
    """Makes fixtures calls under one catalogue's contracts, with one dispatcher, so
    each contract's schemas are compiled once, however many fixtures name it."""

    def __init__(self, catalogue: Catalogue) -> None:
        self._dispatcher = Dispatcher(catalogue, _Unasked(), ToolRegistry())

    def input(self, fixture: Fixture, now: datetime) -> ExecuteInput:
        """The execute input of ``fixture`` under the catalogue's contract of its tool.

        InvalidInput (a CapgateError) when its parameters do not fit that contract."""
        prepared = self._dispatcher.prepare(fixture.tool, fixture.params)
        contract = prepared.contract
        needs_review = contract is not None and contract.needs_review
        stage = fixture.stage or (Stage.PROPOSE if needs_review else Stage.CALL)
        alias = contract.connection_alias if contract is not None else None
        connections = fixture.connections
        if connections is None:
            connections = {alias: ConnectionStatus.ACTIVE} if alias else {}
        facts = ComposeInput(
            principal=fixture.principal,
            task=fixture.task,
            connections=connections,
            environment=fixture.environment,
            budget_class=fixture.budget_class,
        )
        approval = None
        proposal = None
        if stage is Stage.DISPATCH:
            proposal = ProposalRef(id="capgate-fixture-proposal", status="approved")
        if stage is Stage.DISPATCH and fixture.approved_by and contract is not None:
            expires = now + _APPROVAL_LIFETIME
            approval = Approval(
                kind=contract.approval.value,
                tool=fixture.tool,
                operation_id=_OPERATION,
                tenant=fixture.principal.tenant,
                digest=prepared.digest,
                expires_at=expires,
                approved_by=fixture.approved_by[0],
                used=False,
                approvers=[Approver(by=who, expires_at=expires) for who in fixture.approved_by],
            )
        return self._dispatcher.execute_input(
            facts,
            prepared,
            operation_id=_OPERATION,
            stage=stage,
            approval=approval,
            evidence=sorted({piece.name for piece in fixture.evidence}),
            evidence_about=[
                EvidencePiece(name=piece.name, subject=piece.subject) for piece in fixture.evidence
            ],
            budget=Budget(remaining=fixture.budget_remaining, cost=prepared.cost),
            proposal=proposal,
        )


def fixture_outcome(decision: ExecuteDecision) -> FixtureOutcome:
    return FixtureOutcome(allow=decision.allow, codes=tuple(decision.reason_codes))


def check_fixtures(catalogue: Catalogue, policy: Any, now: datetime) -> list[FixtureOutcome]:
    """Ask ``policy`` (a PolicyClient: the OPA about to serve) every fixture of the
    catalogue; their outcomes, in order. CatalogueError, one problem a fixture, when
    any does not get its decision: the catalogue is not to be served so."""
    calls = FixtureCalls(catalogue)
    outcomes: list[FixtureOutcome] = []
    problems: list[str] = []
    for position, fixture in enumerate(catalogue.fixtures):
        where = f"fixtures.yaml: fixture {quote(fixture.name, 80)} (fixtures[{position}])"
        try:
            facts = calls.input(fixture, now)
        except CapgateError as bad:
            problems.append(f"{where}: field 'params': not a call its tool takes: {bad}")
            continue
        # What asking fails with (no OPA, no usable answer) is no fixture's fault.
        outcome = fixture_outcome(policy.execute(facts))
        outcomes.append(outcome)
        if not fixture.holds(outcome):
            problems.append(
                f"{where}: must be {fixture.expected.text()}, but the policy has it "
                f"{outcome.text()}"
            )
    if problems:
        raise CatalogueError(problems)
    return outcomes
