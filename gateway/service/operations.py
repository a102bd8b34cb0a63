"""Running an authorised operation: claim it, hold its lease, run or look up, finish.

An operation is one effect at most, however many gateways and attempts race for
it. The claim is one transaction: it writes the intent and reserves the cost (or
finds the operation already running, finished, or taken over from a dead runner),
before anything is sent. While this process runs it, :class:`Leases` renews its
lease, so a duplicate elsewhere waits instead of taking it over. The outcome is
written in a second transaction that settles the reservation once (success spends
it, refused and retryable release it, unknown keeps it held until a lookup settles
it: :mod:`capgate.gateway.service.recovery`). A refusal found after OPA's allow (the
budget spent by a concurrent call, an approval used first, a changed upstream
definition) is recorded and raised with nothing sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final, NoReturn

from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.enforce.grant import Authorised
from capgate.gateway.errors import CapabilityViolation, OperationConflict, quote
from capgate.gateway.model.contracts import Idempotency, ToolContract
from capgate.gateway.model.decisions import Reason
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.credentials import CredentialResolver
from capgate.gateway.service.facts import CallFacts
from capgate.gateway.service.leases import Leases
from capgate.gateway.service.ledger import append, entry
from capgate.gateway.service.proposals import block
from capgate.gateway.service.settle import call_about, conclude, record_produced, stopped
from capgate.gateway.state.records import (
    OperationRecord,
    OperationStatus,
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
)
from capgate.gateway.state.store import Store, Tx
from capgate.gateway.tools.contract import (
    Adapter,
    CallContext,
    DefinitionChanged,
    Secret,
    SupportsLookup,
)
from capgate.gateway.tools.definitions import SupportsDefinitions

__all__ = ["REFUSALS", "Lost", "Operations", "has_lookup", "may_try_again"]

log = logging.getLogger("capgate.service")

#: Messages of the refusals found after OPA's allow, while claiming the operation.
REFUSALS: Final = {
    "budget_exhausted": "another call spent the budget first; nothing was run",
    "approval_used": "a concurrent dispatch used the approval first; nothing was sent",
    "proposal_not_approved": "the proposal is no longer approved; nothing was sent",
    "tool_quarantined": "the tool's server shows a definition other than the accepted one; "
    "the tool is quarantined until a person reviews it, and nothing was sent",
}


class _Refused(Exception):
    """Raised inside a claim's transaction (rolling it back) with the reason code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Lost(Exception):
    """Raised inside a transaction (rolling it back) when a concurrent claim of the
    same operation, or a concurrent review of the same proposal, committed first."""


class Operations:
    """Runs authorised operations for one gateway: see the module docstring."""

    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        credentials: CredentialResolver,
        *,
        lease: timedelta,
        duplicate_wait: float,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.credentials = credentials
        self.lease = lease
        self.duplicate_wait = duplicate_wait
        self.leases = Leases(store, lease)

    def run(
        self,
        authorised: Authorised,
        task_id: str,
        facts: CallFacts,
        *,
        proposal: ProposalRecord | None,
        review: ReviewRecord | None,
    ) -> Outcome:
        """Record the intent, run (or look up), record the outcome: see the module doc."""
        account, secret = self._credential(authorised, facts.accounts)
        try:
            # Asked before the claim: a server that changed the tool since its
            # definition was accepted (restarted, say) is found out by the listing this
            # makes, and the call is refused with nothing reserved, written or sent.
            definition = _definition_digest(authorised)
        except DefinitionChanged:
            self.refuse(authorised, proposal, "tool_quarantined")
        deadline = time.monotonic() + self.duplicate_wait
        while True:
            try:
                claim = self._claim(authorised, task_id, proposal, review, definition)
            except _Refused as refused:
                self.refuse(authorised, proposal, refused.reason)
            except Lost:
                claim = None  # a concurrent claim of this operation won: wait for it
            if isinstance(claim, Outcome):
                return claim
            if claim is not None:
                break
            if time.monotonic() >= deadline:
                return _outcome(
                    authorised,
                    OutcomeStatus.RETRYABLE,
                    error="the same operation is running elsewhere; ask again for its outcome",
                    retry_after_seconds=1.0,
                )
            time.sleep(0.05)
        operation = claim
        outcome: Outcome | None = None
        # The lease is renewed while this process runs the operation, so a duplicate
        # elsewhere waits for it however long the tool takes; only a runner that
        # died (and stopped renewing) leaves it to be taken over or reconciled.
        with self.leases.held(operation):
            if operation.attempts > 1:  # an earlier attempt may have had its effect
                outcome = self._lookup(authorised, account, secret)
            if outcome is None:
                outcome = self.dispatcher.run(authorised, account=account, credential=secret)
        self._finish(
            authorised,
            operation,
            outcome,
            task_id,
            proposal_id=proposal.id if proposal else None,
            definition=definition,
        )
        return outcome

    def _credential(
        self, authorised: Authorised, accounts: Mapping[str, str]
    ) -> tuple[str | None, Secret | None]:
        """The connection's account (read with the call's facts) and its secret (from
        the resolver, which the store never holds)."""
        alias = authorised.contract.connection_alias
        if alias is None:
            return None, None
        tenant = authorised.request.principal.tenant
        return accounts.get(alias), self.credentials.resolve(tenant, alias)

    def _claim(
        self,
        authorised: Authorised,
        task_id: str,
        proposal: ProposalRecord | None,
        review: ReviewRecord | None,
        definition: str | None = None,
    ) -> OperationRecord | Outcome | None:
        """In one transaction: own the operation (intent + budget), or say why not.

        Returns the operation this caller now runs (its ``reserved`` says whether
        this attempt holds a reservation of the cost), the outcome the operation
        already has (a finished duplicate, or an unknown that cannot be retried
        safely), or None while another caller is running it. Raises _Refused when
        the budget has no room or the approval was consumed by a concurrent dispatch.
        """
        contract = authorised.contract
        tenant = authorised.request.principal.tenant
        op_id = authorised.operation_id
        digest = authorised.prepared.digest
        cost = authorised.prepared.cost
        with self.store.transaction() as tx:
            existing = tx.get_operation(tenant, op_id, for_update=True)
            if existing is not None and (existing.tool, existing.params_digest) != (
                contract.name,
                digest,
            ):
                raise OperationConflict(
                    f"operation {quote(op_id)} was used for another call (tool or parameters "
                    "differ); use a new operation id"
                )
            lease_until = tx.now + self.lease
            if existing is None and proposal is None:
                # A pending proposal holds its operation id from the moment it is
                # proposed; another call may not take it from under the review.
                holder = tx.proposal_for_operation(tenant, op_id)
                if holder is not None:
                    raise OperationConflict(
                        f"operation {quote(op_id)} belongs to proposal {quote(holder.id)}; "
                        "use a new operation id"
                    )
            if existing is None:
                fits = tx.reserve_budget(tenant, task_id, cost)
                # reserve_budget locked the tenant's row, as every claim of the tenant
                # does. On PostgreSQL a concurrent claim of this id that had not
                # committed at the read above has committed now, and this statement
                # sees it: this claim lost the race. _Lost rolls back what it did (the
                # reservation) and the caller waits for the winner's outcome.
                if tx.get_operation(tenant, op_id) is not None:
                    raise Lost
                if not fits:
                    raise _Refused("budget_exhausted")
                if proposal is not None:
                    self._start_dispatch(tx, authorised, proposal, review)
                operation = tx.insert_operation(
                    tenant,
                    op_id,
                    tool=contract.name,
                    params_digest=digest,
                    cost=cost,
                    task_id=task_id,
                    lease_until=lease_until,
                )
                if operation is None:  # pragma: no cover - the tenant row lock prevents it
                    raise Lost
            else:
                if existing.status is OperationStatus.RUNNING:
                    if existing.lease_until is not None and existing.lease_until > tx.now:
                        return None  # someone is running it: wait for their outcome
                    # Its runner died mid-run: the effect may have happened.
                    previous = stopped(existing, contract)
                    reserved = True  # the dead runner's reservation is still held
                else:
                    previous = Outcome.model_validate(existing.outcome or {})
                    reserved = False
                if not self._may_try_again(previous, authorised):
                    if reserved:  # the dead runner's: unknown, as a reconcile would say
                        tx.update_operation(
                            tenant,
                            op_id,
                            status=OperationStatus.DONE,
                            outcome=previous.model_dump(mode="json"),
                            attempts=existing.attempts,
                            lease_until=None,
                        )
                    tx.append(
                        entry(
                            "duplicate",
                            authorised,
                            proposal_id=proposal.id if proposal else None,
                            outcome=previous.status.value,
                        )
                    )
                    return previous
                # One operation, one charge. A retryable outcome cost nothing (its
                # reservation was released), so this attempt reserves anew. An unknown
                # one still holds its reservation until it is settled: the attempt that
                # continues it (looking it up first) takes that reservation over and
                # reserves nothing more. So does a takeover of a dead runner. (A store
                # written before unknown outcomes kept their reservation has them
                # charged and flagged unreserved: they continue with none.)
                if previous.status is OutcomeStatus.RETRYABLE:  # a dead runner's is unknown
                    if not tx.reserve_budget(tenant, task_id, cost):
                        raise _Refused("budget_exhausted")
                    holds = True
                else:
                    holds = existing.reserved
                operation = tx.update_operation(
                    tenant,
                    op_id,
                    status=OperationStatus.RUNNING,
                    outcome=None,
                    attempts=existing.attempts + 1,
                    lease_until=lease_until,
                    reserved=holds,
                )
            tx.append(
                entry(
                    "intent",
                    authorised,
                    proposal_id=proposal.id if proposal else None,
                    outcome="running",
                    detail={
                        "attempt": operation.attempts,
                        "cost": cost,
                        **({"definition": definition} if definition else {}),
                    },
                )
            )
        return operation

    def _may_try_again(self, previous: Outcome, authorised: Authorised) -> bool:
        return may_try_again(
            previous.status, authorised.contract, authorised.adapter, authorised.action
        )

    def _start_dispatch(
        self,
        tx: Tx,
        authorised: Authorised,
        proposal: ProposalRecord,
        review: ReviewRecord | None,
    ) -> None:
        """Consume the approval and mark the proposal dispatched, once, atomically."""
        current = tx.get_proposal(proposal.id, for_update=True)
        if current is None or current.status is not ProposalStatus.APPROVED:
            raise _Refused("proposal_not_approved")
        if review is None or not tx.consume_review(review.id):
            raise _Refused("approval_used")
        tx.update_proposal(proposal.id, status=ProposalStatus.DISPATCHED, reason_codes=[])
        tx.append(
            entry(
                "dispatch",
                authorised,
                proposal_id=proposal.id,
                outcome=ProposalStatus.DISPATCHED.value,
                detail={"review": review.id, "action": authorised.action},
            )
        )

    def refuse(
        self, authorised: Authorised, proposal: ProposalRecord | None, code: str
    ) -> NoReturn:
        """Record a refusal found while claiming (after OPA's allow), then raise it."""
        reason = Reason(code=code, message=REFUSALS[code])
        if proposal is not None and code != "proposal_not_approved":
            block(self.store, proposal, [code], authorised.decision_id, authorised.revision)
        append(
            self.store,
            entry(
                "decision",
                authorised,
                proposal_id=proposal.id if proposal else None,
                outcome="deny",
                reason_codes=[code],
                detail={"stage": authorised.request.stage.value, "after_allow": True},
            ),
        )
        raise CapabilityViolation(
            authorised.contract.name, [reason], decision_id=authorised.decision_id
        )

    def _lookup(
        self, authorised: Authorised, account: str | None, secret: Secret | None
    ) -> Outcome | None:
        """LOOKUP_BEFORE_RETRY: the outcome of what an earlier attempt did, if found."""
        adapter = authorised.adapter
        if not isinstance(adapter, SupportsLookup) or not _can_look_up(authorised):
            return None
        context = CallContext(
            operation_id=authorised.operation_id,
            idempotency_key=authorised.grant.idempotency_key,
            connection_alias=authorised.contract.connection_alias,
            tenant=authorised.request.principal.tenant,
            account=account,
            credential=secret,
        )
        try:
            found = adapter.lookup(authorised.action, authorised.operation_id, context)
        except Exception as exc:  # an adapter's lookup failing must not send twice
            return _outcome(
                authorised,
                OutcomeStatus.UNKNOWN,
                error=f"lookup failed ({type(exc).__name__}); not sent again",
                recovery=authorised.contract.recovery,
            )
        if found is None:
            return None
        outcome = self.dispatcher.found(authorised, found)
        log.info(
            "lookup found operation=%s status=%s", authorised.operation_id, outcome.status.value
        )
        return outcome

    def _finish(
        self,
        authorised: Authorised,
        operation: OperationRecord,
        outcome: Outcome,
        task_id: str,
        *,
        proposal_id: str | None,
        definition: str | None = None,
    ) -> None:
        contract = authorised.contract
        tenant = authorised.request.principal.tenant
        with self.store.transaction() as tx:
            # A run that outlasted its lease may have been reconciled meanwhile (to an
            # unknown that still holds the reservation, perhaps settled by a lookup
            # since) or taken over by a new attempt. A taken-over attempt changes
            # nothing, and a late unknown adds nothing to what the row says; anything
            # else it learned is written over the row and settles what the row holds.
            # The ledger records it in every case.
            current = tx.get_operation(tenant, operation.operation_id, for_update=True)
            taken_over = current is None or current.attempts != operation.attempts
            late = taken_over or current is None or current.status is not OperationStatus.RUNNING
            adds = not (late and outcome.status is OutcomeStatus.UNKNOWN)
            if current is not None and not taken_over and adds:
                conclude(tx, current, outcome)
            record_produced(
                tx,
                contract,
                tenant,
                task_id,
                operation.operation_id,
                outcome,
                call_about(authorised.prepared.subject, authorised.prepared.values),
            )
            tx.append(
                entry(
                    "outcome",
                    authorised,
                    proposal_id=proposal_id,
                    outcome=outcome.status.value,
                    detail={
                        "attempt": operation.attempts,
                        "receipt": outcome.provider_receipt,
                        "produced": contract.produced_names
                        if outcome.status is OutcomeStatus.SUCCESS
                        else [],
                        **({"after_lease": True} if late else {}),
                        **({"definition": definition} if definition else {}),
                    },
                )
            )


def _definition_digest(authorised: Authorised) -> str | None:
    """The version of the tool's definition this run uses, when its adapter pins
    definitions (an MCP server's accepted definition, checked against what the server
    shows now and pinned for the run), for the intent and outcome rows.

    DefinitionChanged passes through: the server shows another definition, and the
    call must not run. Any other failure of the adapter leaves the rows without it
    (the adapter checks again before it sends)."""
    adapter = authorised.adapter
    if not isinstance(adapter, SupportsDefinitions):
        return None
    try:
        digest = adapter.definition_digest(authorised.action, authorised.operation_id)
    except DefinitionChanged:
        raise
    except Exception as exc:  # an adapter that cannot say: the rows go without it
        log.warning("no definition digest for tool=%s (%s)", authorised.action, type(exc).__name__)
        return None
    return digest if isinstance(digest, str) and digest.startswith("sha256:") else None


def may_try_again(
    status: OutcomeStatus, contract: ToolContract, adapter: Adapter | None, action: str
) -> bool:
    """Whether an operation that finished with ``status`` may run again.

    Retryable means nothing happened: yes. Unknown means it may have: only when a
    repeat cannot do it twice, because the adapter can look the operation up first
    or the contract says repeating is safe. Success and refused are final.
    """
    if status is OutcomeStatus.RETRYABLE:
        return True
    if status is not OutcomeStatus.UNKNOWN:
        return False
    return has_lookup(adapter, action) or contract.idempotency is not Idempotency.NOT_IDEMPOTENT


def has_lookup(adapter: Adapter | None, action: str) -> bool:
    try:
        return isinstance(adapter, SupportsLookup) and bool(adapter.has_lookup(action))
    except Exception:  # an adapter that cannot say: no lookup
        return False


def _can_look_up(authorised: Authorised) -> bool:
    return has_lookup(authorised.adapter, authorised.action)


def _outcome(authorised: Authorised, status: OutcomeStatus, **fields: Any) -> Outcome:
    contract = authorised.contract
    return Outcome(
        tool=contract.name,
        version=contract.version,
        operation_id=authorised.operation_id,
        status=status,
        decision_id=authorised.decision_id,
        **fields,
    )
