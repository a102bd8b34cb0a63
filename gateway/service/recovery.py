"""Recovery: what crashes and lost answers leave open, settled without acting again.

Crashes leave operations ``running`` past their lease, and lost answers leave them
``unknown``. :class:`Recovery` settles both without sending anything: it marks the
first unknown (reservation held) and looks the unknown ones up through their
adapter's lookup, with no allow (looking sends and grants nothing, so an expired
approval or a revoked connection does not stand in the way), recording each
lookup in the ledger. :class:`Reconciler` runs that pass on a timer for a service
that runs the gateway for a long time (``capgate serve``), so an uncertain payment
is settled by its lookup even when no agent ever calls again.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from capgate.gateway.enforce.arguments import subject_of, values_of
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import (
    CapgateError,
    CredentialUnavailable,
    InvalidInput,
    UnknownOperation,
)
from capgate.gateway.model.contracts import Catalogue, CurrencyTable, Idempotency, ToolContract
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.credentials import CredentialResolver
from capgate.gateway.service.operations import has_lookup
from capgate.gateway.service.settle import call_about, conclude, record_produced
from capgate.gateway.state.records import LedgerEntry, OperationRecord, OperationStatus
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import CallContext, SupportsLookup
from capgate.gateway.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from capgate.gateway.service.gateway import Gateway

__all__ = [
    "DEFAULT_RECONCILE_SECONDS",
    "LOOKUP_RETRY_FIRST",
    "LOOKUP_RETRY_LONGEST",
    "Reconciler",
    "Recovery",
    "read_operation",
]

log = logging.getLogger("capgate.service")

#: How often a long-running service reconciles, by default.
DEFAULT_RECONCILE_SECONDS: Final = 30.0
#: The first wait before a failed lookup is tried again, doubled after each failure
#: up to the longest; the wait is the stored outcome's ``retry_after_seconds``.
LOOKUP_RETRY_FIRST: Final = 30.0
LOOKUP_RETRY_LONGEST: Final = 3600.0


class Recovery:
    """The reconcile pass and lookups of unknown operations, for one gateway."""

    def __init__(
        self,
        store: Store,
        catalogue: Catalogue,
        registry: ToolRegistry,
        dispatcher: Dispatcher,
        credentials: CredentialResolver,
    ) -> None:
        self.store = store
        self.catalogue = catalogue
        self.registry = registry
        self.dispatcher = dispatcher
        self.credentials = credentials

    def reconcile(self) -> list[OperationRecord]:
        """Settle what crashes and lost answers left open; return the operations changed.

        Two passes, each operation in a transaction of its own:

        1. A ``running`` operation past its lease (its runner died mid-run) may or may
           not have had its effect: its outcome becomes ``unknown`` with the contract's
           recovery procedure, its reservation still held, and the ledger says so.
           Only if it is still running and past its lease once its row is locked:
           another gateway reconciling at the same time, or a new attempt that took
           the operation over meanwhile, got there first.
        2. Every ``unknown`` operation whose wait is over (its outcome's
           ``retry_after_seconds`` since it was last touched) and whose adapter can look
           it up is looked up (:meth:`look_up`): nothing is sent, whatever changed
           since. Those without a lookup stay unknown, for a person to settle.
        """
        changed: dict[tuple[str, str], OperationRecord] = {}
        with self.store.transaction(read_only=True) as tx:
            candidates = tx.stale_operations()
        for candidate in candidates:
            record = self._stop(candidate)
            if record is not None:
                changed[(record.tenant, record.operation_id)] = record
                log.warning(
                    "reconciled operation=%s tool=%s as unknown", record.operation_id, record.tool
                )
        with self.store.transaction(read_only=True) as tx:
            now = tx.now
            unsettled = tx.unsettled_operations()
        for operation in unsettled:
            if not _lookup_due(operation, now):
                continue
            settled = self._look_up(operation, by="reconcile")
            if settled is not None:
                changed[(settled.tenant, settled.operation_id)] = settled
        return list(changed.values())

    def look_up(self, tenant: str, operation_id: str, *, by: str) -> Outcome | None:
        """Ask the provider what an ``unknown`` operation did, and record the answer.

        Looking up sends nothing and grants nothing, so it needs no allow: it works
        after the approval expired, the connection was revoked, the contract or the
        role changed (the likely reactions to an incident), which is when it matters.
        The adapter's lookup runs with the connection's secret, in the operation's own
        tenant. What it finds settles the operation: a receipt is the success it
        stands for (checked like a run's result; the budget it held is spent), no
        trace means nothing happened (``retryable``; the budget is released, and the
        operation may be tried again under a new allow). A lookup that fails leaves it
        unknown and waits longer before the next one. Every lookup is a ledger row
        (kind ``lookup``, naming ``by``).

        Returns the operation's outcome afterwards (unchanged if it was not unknown,
        or its adapter has no lookup), or None while it is running. A running
        operation past its lease is reconciled first. Raises UnknownOperation.
        """
        if not isinstance(by, str) or not by:
            raise InvalidInput("look_up needs who asks (by), a non-empty string")
        operation = read_operation(self.store, tenant, operation_id)
        if operation is None:
            raise UnknownOperation(tenant, operation_id)
        if operation.status is OperationStatus.RUNNING:
            operation = self._stop(operation) or read_operation(self.store, tenant, operation_id)
            if operation is None or operation.status is OperationStatus.RUNNING:
                return None
        settled = self._look_up(operation, by=by) or operation
        return Outcome.model_validate(settled.outcome or {})

    def _stop(self, candidate: OperationRecord) -> OperationRecord | None:
        """Reconcile one running operation whose lease is over: unknown, reservation
        held. None if it is no longer stale once locked."""
        with self.store.transaction() as tx:
            stale = tx.get_operation(candidate.tenant, candidate.operation_id, for_update=True)
            if (
                stale is None
                or stale.status is not OperationStatus.RUNNING
                or stale.lease_until is None
                or stale.lease_until >= tx.now
            ):
                return None
            proposal = tx.proposal_for_operation(stale.tenant, stale.operation_id)
            version = proposal.contract_version if proposal is not None else None
            contract = self.catalogue.contract_at(stale.tool, version)
            outcome = Outcome(
                tool=stale.tool,
                version=contract.version if contract else 1,
                operation_id=stale.operation_id,
                status=OutcomeStatus.UNKNOWN,
                error="the gateway stopped while the operation ran",
                recovery=contract.recovery if contract else "lookup_before_retry",
            )
            record = conclude(tx, stale, outcome)
            tx.append(
                LedgerEntry(
                    kind="outcome",
                    tenant=stale.tenant,
                    tool=stale.tool,
                    operation_id=stale.operation_id,
                    outcome=OutcomeStatus.UNKNOWN.value,
                    reason_codes=["reconciled"],
                    detail={"attempt": stale.attempts},
                )
            )
        return record

    def _look_up(self, operation: OperationRecord, *, by: str) -> OperationRecord | None:
        """Look one unknown operation up and record what was found (see look_up).

        None when there was nothing to do: not unknown, no contract or no adapter
        with a lookup for it, or settled by someone else meanwhile."""
        previous = Outcome.model_validate(operation.outcome or {})
        contract = self.catalogue.tools.get(operation.tool)
        if previous.status is not OutcomeStatus.UNKNOWN or contract is None:
            return None
        tenant, operation_id = operation.tenant, operation.operation_id
        with self.store.transaction(read_only=True) as tx:
            proposal = tx.proposal_for_operation(tenant, operation_id)
            connections = tx.connections(tenant)
        # A dispatched proposal ran its contract's execution action: that is what the
        # provider knows of.
        action = proposal.execution_action if proposal is not None else contract.name
        if proposal is not None:  # the contract it was dispatched under, when kept
            contract = self.catalogue.contract_at(operation.tool, proposal.contract_version)
            assert contract is not None  # the tool is the catalogue's (checked above)
        adapter = self.registry.adapter_for(action)
        if not has_lookup(adapter, action):
            return None
        assert isinstance(adapter, SupportsLookup)
        alias = contract.connection_alias
        failure: str | None = None
        found: object = None
        try:
            secret = self.credentials.resolve(tenant, alias) if alias is not None else None
        except CredentialUnavailable:
            failure = "the connection's secret could not be resolved"
        else:
            connection = connections.get(alias) if alias is not None else None
            context = CallContext(
                operation_id=operation_id,
                idempotency_key=operation_id
                if contract.idempotency is Idempotency.IDEMPOTENT_WITH_KEY
                else None,
                connection_alias=alias,
                tenant=tenant,
                account=connection.account if connection is not None else None,
                credential=secret,
            )
            try:
                found = adapter.lookup(action, operation_id, context)
            except Exception as exc:  # never sends: a failed lookup leaves it unknown
                failure = f"the lookup failed ({type(exc).__name__})"
        outcome = self._found(contract, previous, found, failure)
        with self.store.transaction() as tx:
            current = tx.get_operation(tenant, operation_id, for_update=True)
            if (
                current is None
                or current.status is not OperationStatus.DONE
                or current.attempts != operation.attempts
                or Outcome.model_validate(current.outcome or {}).status is not OutcomeStatus.UNKNOWN
            ):
                return None  # settled, or taken up again, meanwhile
            record = conclude(tx, current, outcome)
            produced = record_produced(
                tx,
                contract,
                tenant,
                current.task_id,
                operation_id,
                outcome,
                _proposed_about(contract, proposal.params, self.catalogue.currencies)
                if proposal is not None
                else None,
            )
            tx.append(
                LedgerEntry(
                    kind="lookup",
                    tenant=tenant,
                    principal=by,
                    tool=operation.tool,
                    contract_version=previous.version,
                    operation_id=operation_id,
                    proposal_id=proposal.id if proposal is not None else None,
                    outcome=outcome.status.value,
                    reason_codes=["lookup_failed"] if failure else [],
                    detail={
                        "attempt": current.attempts,
                        "found": found is not None,
                        "receipt": outcome.provider_receipt,
                        "produced": produced,
                    },
                )
            )
        log.info(
            "looked up operation=%s by=%s: %s%s",
            operation_id,
            by,
            outcome.status.value,
            f" ({failure})" if failure else "",
        )
        return record

    def _found(
        self, contract: ToolContract, previous: Outcome, found: object, failure: str | None
    ) -> Outcome:
        """The outcome a lookup's answer stands for (see look_up)."""
        if failure is not None:
            wait = previous.retry_after_seconds
            wait = LOOKUP_RETRY_FIRST if not wait else min(wait * 2, LOOKUP_RETRY_LONGEST)
            return previous.model_copy(
                update={"error": f"{failure}; nothing was sent", "retry_after_seconds": wait}
            )
        if found is None:
            return previous.model_copy(
                update={
                    "status": OutcomeStatus.RETRYABLE,
                    "error": "looked up: the provider has no trace of this operation, so it "
                    "did not happen; it may be tried again",
                    "recovery": None,
                    "retry_after_seconds": None,
                }
            )
        outcome = self.dispatcher.interpret_found(contract, previous.operation_id, found)
        if outcome.status is OutcomeStatus.UNKNOWN:  # an answer that settles nothing
            return self._found(contract, previous, None, f"the lookup's answer: {outcome.error}")
        return outcome.model_copy(
            update={"version": previous.version, "decision_id": previous.decision_id}
        )


def _lookup_due(operation: OperationRecord, now: Any) -> bool:
    """Whether an unknown operation's wait before its next lookup is over: the stored
    outcome's ``retry_after_seconds`` (none: at once) since it was last touched."""
    wait = (operation.outcome or {}).get("retry_after_seconds")
    if not isinstance(wait, int | float) or isinstance(wait, bool) or wait <= 0:
        return True
    return bool(operation.updated_at + timedelta(seconds=float(wait)) <= now)


class Reconciler:
    """Calls ``gateway.reconcile()`` every ``interval`` seconds in one daemon thread.

    A pass that fails (the store unreachable, say) is logged and the next one tries
    again; the thread never dies of it. Use it as a context manager: the thread
    starts on entry and is stopped (waiting for a pass under way) on exit.
    """

    def __init__(self, gateway: Gateway, interval: float = DEFAULT_RECONCILE_SECONDS) -> None:
        if (
            not isinstance(interval, int | float)
            or isinstance(interval, bool)
            or not math.isfinite(interval)
            or interval <= 0
        ):
            raise ValueError("the reconcile interval is a positive number of seconds")
        self.gateway = gateway
        self.interval = float(interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capgate-reconcile", daemon=True)

    def __enter__(self) -> Reconciler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                changed = self.gateway.reconcile()
            except CapgateError as exc:
                log.warning("reconcile failed (%s); trying again later", exc.code)
            except Exception as exc:  # never let the thread die
                log.warning("reconcile failed (%s); trying again later", type(exc).__name__)
            else:
                if changed:
                    log.info("reconcile settled or marked %d operation(s)", len(changed))


def read_operation(store: Store, tenant: str, operation_id: str) -> OperationRecord | None:
    """The tenant's operation of that id, read in a transaction of its own."""
    with store.transaction(read_only=True) as tx:
        return tx.get_operation(tenant, operation_id)


def _proposed_about(
    contract: ToolContract, params: Mapping[str, Any], currencies: CurrencyTable | None
) -> dict[str, Any] | None:
    """What a proposal's call was about (its subject and values), read from its frozen
    parameters as the dispatch read them; None if they no longer fit the contract (the
    evidence is then about nothing, which grants no more than not knowing)."""
    try:
        return call_about(subject_of(contract, params), values_of(contract, params, currencies))
    except InvalidInput:
        return None
