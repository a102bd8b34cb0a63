"""The gateway: the one source of every fact that grants, and the life cycle around OPA.

A caller says who is asking, the task, the environment and the call; nothing more.
Connection status, budget, evidence, approvals and operation history are read from
the :class:`~capgate.gateway.state.store.Store` at decision time and sent to OPA as input,
so no caller can assert them. Every step that changes the world asks OPA again,
with the facts as they are at that moment::

    agent ──call──▶ needs review? ──no──▶ call (execute, stage "call") ──▶ run
                        │yes
                        ▼
                    propose (execute, stage "propose") ──▶ proposal: pending
    reviewer ──review──▶ (review decision) ──▶ approved / rejected
    service ──dispatch──▶ (execute, stage "dispatch", current facts) ──▶ run
                                   └─ deny ──▶ proposal blocked, nothing sent

Each step is one store transaction, and the ledger gets a row for every compose,
decision, proposal, review, intent, outcome and lookup. An operation's *intent* is
written (with its budget reserved) before its tool runs, so a crash between run and
record leaves a ``running`` operation that :meth:`Gateway.reconcile` (or the next
attempt, once the lease is over) turns into ``unknown``. An ``unknown`` operation
keeps its reservation until it is settled, and is settled by looking, never by
acting: :meth:`Gateway.look_up` and ``reconcile`` ask the adapter's lookup without
any allow (nothing is sent, so an expired approval or a revoked connection does not
stand in the way); a retry through ``call`` or ``dispatch`` looks it up too before
sending again (LOOKUP_BEFORE_RETRY). The same operation id with the same call
returns the first outcome; with another call it is an
:class:`~capgate.gateway.errors.OperationConflict`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, NoReturn, Protocol

from pydantic import TypeAdapter, ValidationError

from capgate.gateway.enforce.dispatcher import (
    Authorised,
    DecisionEvent,
    Dispatcher,
    PolicyDecider,
    policy_revision,
)
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CredentialUnavailable,
    DuplicateOperation,
    InvalidInput,
    OperationConflict,
    PolicyUnavailable,
    UnknownOperation,
    UnknownProposal,
    UnknownTenant,
    quote,
)
from capgate.gateway.model.contracts import Catalogue, Idempotency, ToolContract
from capgate.gateway.model.decisions import ComposeDecision, Reason, ReviewDecision
from capgate.gateway.model.facts import (
    Approval,
    Budget,
    ComposeInput,
    ConnectionStatus,
    Identifier,
    OperationState,
    Principal,
    ProposalRef,
    ReviewInput,
    Stage,
    Task,
)
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.credentials import CredentialResolver, NoCredentials
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import (
    BudgetState,
    ConnectionRecord,
    LedgerEntry,
    OperationRecord,
    OperationStatus,
    PinRecord,
    PinStatus,
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
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
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["Gateway", "ReviewPolicy"]

log = logging.getLogger("capgate.service")

#: How long an approval stays good for its one dispatch, unless the reviewer says.
DEFAULT_APPROVAL_TTL: Final = timedelta(hours=24)
#: The longest an approval may be given for: a year. Longer is a mistake (and far
#: enough out, an expiry the calendar cannot hold).
MAX_APPROVAL_TTL: Final = timedelta(days=366)
#: How long a running operation is left alone before it may be reconciled or taken
#: over: a gateway process that died mid-run leaves its operation ``running`` until
#: then. A live gateway renews the lease every third of it while the tool runs.
DEFAULT_LEASE: Final = timedelta(minutes=5)
#: How long a duplicate of a running operation waits for its outcome.
DEFAULT_DUPLICATE_WAIT: Final = 10.0

#: Outcomes after which an operation may be tried again.
_UNSETTLED: Final = (OutcomeStatus.RETRYABLE, OutcomeStatus.UNKNOWN)
#: The first wait before a failed lookup is tried again, doubled after each failure
#: up to the longest; the wait is the stored outcome's ``retry_after_seconds``.
LOOKUP_RETRY_FIRST: Final = 30.0
LOOKUP_RETRY_LONGEST: Final = 3600.0
#: Checks an operation id as the policy input will (see _operation_id).
_IDENTIFIER: Final = TypeAdapter(Identifier)


def _text_digest(text: object) -> str:
    """``sha256:<hex>`` of a caller's string, to record it without repeating it."""
    data = text.encode("utf-8", "replace") if isinstance(text, str) else repr(text).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


#: Messages of the refusals found after OPA's allow, while claiming the operation.
_REFUSALS: Final = {
    "budget_exhausted": "another call spent the budget first; nothing was run",
    "approval_used": "a concurrent dispatch used the approval first; nothing was sent",
    "proposal_not_approved": "the proposal is no longer approved; nothing was sent",
    "tool_quarantined": "the tool's server shows a definition other than the accepted one; "
    "the tool is quarantined until a person reviews it, and nothing was sent",
}


class _Leases:
    """Renews the leases of the operations this gateway is running, from one thread.

    Every lease/3 the thread extends each held operation's lease by a whole lease,
    if that attempt still owns it. One thread per gateway, started on first use and
    gone again once nothing is held, so an idle gateway keeps no thread.
    """

    def __init__(self, store: Store, lease: timedelta) -> None:
        self._store = store
        self._lease = lease
        self._held: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def held(self, operation: OperationRecord) -> Iterator[None]:
        key = (operation.tenant, operation.operation_id)
        with self._lock:
            self._held[key] = operation.attempts
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._renew_forever, name="capgate-leases", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(key, None)

    def _renew_forever(self) -> None:
        interval = max(self._lease.total_seconds() / 3, 0.01)
        while not self._wake.wait(interval):
            with self._lock:
                held = dict(self._held)
                if not held:  # nothing runs: stop; the next held() starts a new thread
                    self._thread = None
                    return
            for (tenant, operation_id), attempts in held.items():
                try:
                    self._renew(tenant, operation_id, attempts)
                except CapgateError as exc:  # the next beat tries again; the run goes on
                    log.warning("could not renew the lease of operation=%s: %s", operation_id, exc)
                except Exception as exc:  # never let the renewing thread die
                    log.warning(
                        "could not renew the lease of operation=%s (%s)",
                        operation_id,
                        type(exc).__name__,
                    )

    def _renew(self, tenant: str, operation_id: str, attempts: int) -> None:
        with self._store.transaction() as tx:
            current = tx.get_operation(tenant, operation_id, for_update=True)
            if (
                current is None
                or current.status is not OperationStatus.RUNNING
                or current.attempts != attempts
            ):
                return  # finished, or taken over: not ours to renew
            tx.update_operation(
                tenant,
                operation_id,
                status=OperationStatus.RUNNING,
                outcome=None,
                attempts=attempts,
                lease_until=tx.now + self._lease,
            )


@dataclass(frozen=True)
class _CallFacts:
    """What deciding and running one call read from the store, in one snapshot."""

    compose: ComposeInput
    evidence: set[str]
    budget: BudgetState
    operation: OperationState
    #: The account of each of the tenant's connections, by alias: the tool's
    #: connection names the one its call runs as.
    accounts: dict[str, str]


class _Refused(Exception):
    """Raised inside a claim's transaction (rolling it back) with the reason code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Lost(Exception):
    """Raised inside a transaction (rolling it back) when a concurrent claim of the
    same operation, or a concurrent review of the same proposal, committed first."""


class ReviewPolicy(PolicyDecider, Protocol):
    """A policy decider that also answers the review question (``PolicyClient`` does)."""

    def review(self, facts: ReviewInput) -> ReviewDecision: ...


class Gateway:
    """The stateful front: store-backed facts, the life cycle, the ledger.

    ``policy`` is normally a :class:`~capgate.gateway.policy.client.PolicyClient`; ``registry``
    holds the adapters; ``store`` the state (see :func:`capgate.gateway.state.open_store`);
    ``credentials`` resolves a connection's secret at dispatch only.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        policy: ReviewPolicy,
        registry: ToolRegistry,
        store: Store,
        *,
        credentials: CredentialResolver | None = None,
        approval_ttl: timedelta = DEFAULT_APPROVAL_TTL,
        lease: timedelta = DEFAULT_LEASE,
        duplicate_wait: float = DEFAULT_DUPLICATE_WAIT,
        observer: Callable[[DecisionEvent], None] | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.policy = policy
        self.store = store
        self.credentials: CredentialResolver = credentials or NoCredentials()
        self.approval_ttl = approval_ttl
        self.lease = lease
        self.duplicate_wait = duplicate_wait
        self.dispatcher = Dispatcher(catalogue, policy, registry, observer=observer)
        self.registry = registry
        self._leases = _Leases(store, lease)
        #: Catalogue tools that run on an MCP server: name -> (server, upstream tool).
        self._upstream = {
            name: (contract.upstream.server, contract.upstream.tool)
            for name, contract in sorted(catalogue.tools.items())
            if contract.upstream is not None
        }
        #: The adapters that run tools only under accepted definitions, with the
        #: catalogue tools each runs (an MCP adapter may also run the tools the
        #: catalogue leaves unplaced). Their pins are read with every call's facts, so
        #: adapters are attached to the registry before the gateway is built.
        pinned: dict[int, tuple[SupportsDefinitions, list[str]]] = {}
        for name in sorted(catalogue.tools):
            holder = registry.adapter_for(name)
            if isinstance(holder, SupportsDefinitions):
                pinned.setdefault(id(holder), (holder, []))[1].append(name)
        self._pinned_adapters = list(pinned.values())

    # -- the facts ---------------------------------------------------------------------

    def compose_facts(self, request: AgentRequest) -> ComposeInput:
        """The compose input: the request's facts plus the tenant's, from the store now."""
        request = _request(request)
        with self.store.transaction(read_only=True) as tx:
            return self._compose_facts(tx, request.principal, request.task, request.environment)

    def _compose_facts(
        self,
        tx: Tx,
        principal: Principal,
        task: Task,
        environment: str,
        connections: dict[str, ConnectionRecord] | None = None,
    ) -> ComposeInput:
        tenant = tx.get_tenant(principal.tenant)
        if tenant is None:
            raise UnknownTenant(principal.tenant)
        if connections is None:
            connections = tx.connections(principal.tenant)
        return ComposeInput(
            principal=principal,
            task=task,
            connections={alias: c.status for alias, c in connections.items()},
            environment=environment,
            budget_class=tenant.budget_class,
            quarantined=self._quarantined(tx),
        )

    def _quarantined(self, tx: Tx) -> list[str]:
        """The catalogue tools an MCP server runs whose definition, as the server shows
        it now, a person has not accepted as that tool (never discovered, pending,
        changed upstream, no longer listed, or rejected): OPA hides and denies them
        (``tool_quarantined``). Read from the store's pins, never from the caller."""
        if not self._upstream and not self._pinned_adapters:
            return []
        listed = tx.pins()
        pins = {(pin.server, pin.tool): pin for pin in listed}
        quarantined = set()
        for name, (server, tool) in self._upstream.items():
            pin = pins.get((server, tool))
            if pin is None or pin.status is not PinStatus.ACCEPTED or pin.catalogue_tool != name:
                quarantined.add(name)
        for adapter, names in self._pinned_adapters:
            quarantined |= _adapter_quarantine(adapter, names, listed)
        return sorted(quarantined)

    # -- compose -----------------------------------------------------------------------

    def compose(self, request: AgentRequest, *, reasons: bool = False) -> ComposeDecision:
        """Which tools may this agent see now? Connection state is read from the store.

        An agent's compose carries the visible names only. With ``reasons`` (for
        people: a reviewer, an operator, the demo) ``excluded`` also says why each
        other tool is hidden, from the policy's explain entrypoint.
        """
        request = _request(request)
        facts = self.compose_facts(request)
        decision = self.dispatcher.compose(facts, reasons=reasons)
        self._append(
            LedgerEntry(
                kind="compose",
                tenant=request.tenant,
                principal=_who(request.principal),
                decision_id=decision.decision_id,
                policy_revision=policy_revision(decision.bundle_revisions),
                outcome="composed",
                detail={"task": request.task_id, "visible": sorted(decision.visible)},
            )
        )
        return decision

    def record_unseen_call(self, request: AgentRequest, tool: str) -> None:
        """Record an attempt to call a tool the caller cannot see.

        A front that answers such a call itself (the MCP server answers a hidden tool
        exactly like a missing one, without asking OPA) still leaves the attempt in
        the ledger, so that an agent probing for tools shows up in an audit. Hidden
        and nonexistent names are recorded alike; a name too long or odd to be a
        tool's is kept as its digest only.
        """
        request = _request(request)
        try:
            name: str | None = _IDENTIFIER.validate_python(tool)
        except ValidationError:
            name = None
        self._append(
            LedgerEntry(
                kind="decision",
                tenant=request.tenant,
                principal=_who(request.principal),
                tool=name,
                outcome="denied",
                reason_codes=["unknown_tool"],
                detail={
                    "task": request.task_id,
                    "stage": "unseen",
                    **({} if name else {"tool_digest": _text_digest(tool)}),
                },
            )
        )

    # -- call and propose ----------------------------------------------------------------

    def call(
        self,
        request: AgentRequest,
        tool: str,
        params: dict[str, Any],
        *,
        operation_id: str | None = None,
    ) -> Outcome | ProposalRecord:
        """Call ``tool``: run it now, or, when its calls are reviewed, propose it.

        Returns the Outcome of a run, or the pending ProposalRecord. Raises the
        dispatcher's errors (InvalidInput, PolicyUnavailable, CapabilityViolation,
        ToolNotRegistered), OperationConflict, CredentialUnavailable or a StoreError,
        all before the tool is entered; once it has been entered the answer is always
        an Outcome.
        """
        request = _request(request)
        operation_id = _operation_id(operation_id)
        prepared = self.dispatcher.prepare(tool, params)
        contract = prepared.contract
        stage = Stage.PROPOSE if contract is not None and contract.needs_review else Stage.CALL
        read = self._call_facts(
            request.principal,
            request.task,
            request.environment,
            request.task_id,
            operation_id,
        )
        cost = contract.cost_units if contract is not None else 0
        execute = self.dispatcher.execute_input(
            read.compose,
            prepared,
            operation_id=operation_id,
            stage=stage,
            evidence=read.evidence,
            budget=Budget(remaining=read.budget.remaining, cost=cost)
            if stage is Stage.CALL
            else None,
            operation=read.operation if stage is Stage.CALL else None,
        )
        authorised = self._authorise(prepared, execute, request.principal, None)
        if stage is Stage.PROPOSE:
            return self._propose(authorised, request)
        return self._execute(authorised, request.task_id, read, proposal=None, review=None)

    def _call_facts(
        self,
        principal: Principal,
        task: Task,
        environment: str,
        task_id: str,
        operation_id: str,
    ) -> _CallFacts:
        """Every fact a call's decision and run need, read in one transaction."""
        tenant = principal.tenant
        with self.store.transaction(read_only=True) as tx:
            connections = tx.connections(tenant)
            return _CallFacts(
                compose=self._compose_facts(tx, principal, task, environment, connections),
                evidence=tx.evidence(tenant, task_id),
                budget=tx.budget(tenant, task_id),
                operation=_operation_state(tx.get_operation(tenant, operation_id)),
                accounts={alias: c.account for alias, c in connections.items()},
            )

    def _propose(self, authorised: Authorised, request: AgentRequest) -> ProposalRecord:
        contract = authorised.contract
        with self.store.transaction() as tx:
            # The same content as an operation whose outcome is still open (running, or
            # unknown until looked up): approving this one may do it a second time. The
            # proposal says so, to the agent and to its reviewers.
            twins = [
                twin
                for twin in tx.unsettled_twins(
                    request.tenant, contract.name, authorised.prepared.digest
                )
                if twin != authorised.operation_id
            ]
            proposal = ProposalRecord(
                id=f"prop-{uuid.uuid4().hex[:20]}",
                tenant=request.tenant,
                task_id=request.task_id,
                proposer=request.principal,
                environment=request.environment,
                task=request.task.model_dump(mode="json"),
                tool=contract.name,
                contract_version=contract.version,
                execution_action=contract.dispatch_action,
                params=authorised.prepared.params,
                params_digest=authorised.prepared.digest,
                operation_id=authorised.operation_id,
                decision_id=authorised.decision_id,
                status=ProposalStatus.PENDING,
                created_at=tx.now,
                updated_at=tx.now,
                unsettled_twins=twins,
            )
            # An id some call already used would only collide at dispatch, after a
            # person reviewed the proposal: refuse it now.
            used = tx.get_operation(request.tenant, authorised.operation_id)
            if used is not None and (used.tool, used.params_digest) != (
                proposal.tool,
                proposal.params_digest,
            ):
                raise OperationConflict(
                    f"operation {quote(authorised.operation_id)} was used for another call "
                    "(tool or parameters differ); use a new operation id"
                )
            try:
                stored = tx.insert_proposal(proposal)
            except DuplicateOperation:
                stored = None
            if stored is None:
                existing = tx.proposal_for_operation(request.tenant, authorised.operation_id)
                if existing is None or (existing.tool, existing.params_digest) != (
                    proposal.tool,
                    proposal.params_digest,
                ):
                    raise OperationConflict(
                        f"operation {quote(authorised.operation_id)} was already proposed "
                        "with other parameters"
                    ) from None
                return existing
            tx.append(
                self._entry(
                    "proposal",
                    authorised,
                    proposal_id=stored.id,
                    outcome=stored.status.value,
                    detail={
                        "task": request.task_id,
                        "params_digest": stored.params_digest,
                        **({"unsettled_twins": twins} if twins else {}),
                    },
                )
            )
        log.info(
            "proposed tool=%s proposal=%s operation=%s decision=%s",
            contract.name,
            stored.id,
            stored.operation_id,
            stored.decision_id,
        )
        if twins:
            log.warning(
                "proposal=%s has the content of unsettled operation(s) %s: approving it may "
                "repeat what they did",
                stored.id,
                ",".join(twins),
            )
        return stored

    # -- review -------------------------------------------------------------------------

    def review(
        self,
        proposal_id: str,
        reviewer: Principal,
        verdict: ReviewVerdict | str,
        *,
        ttl: timedelta | None = None,
    ) -> ReviewRecord:
        """A reviewer approves or rejects a pending proposal, if OPA says they may.

        Raises UnknownProposal, CapabilityViolation (the review policy's reasons,
        e.g. self_review or reviewer_not_permitted) or PolicyUnavailable; an approval
        binds the proposal's digest, operation and tenant and expires after ``ttl``.
        """
        if not isinstance(reviewer, Principal):
            raise InvalidInput(f"reviewer must be a Principal, not a {type(reviewer).__name__}")
        try:
            verdict = ReviewVerdict(verdict)
        except ValueError:
            raise InvalidInput(
                f"verdict {quote(str(verdict), 40)} is not 'approved' or 'rejected'"
            ) from None
        ttl = self.approval_ttl if ttl is None else ttl
        if not isinstance(ttl, timedelta):
            raise InvalidInput(f"ttl must be a timedelta or None, not a {type(ttl).__name__}")
        if ttl <= timedelta(0) or ttl > MAX_APPROVAL_TTL:
            raise InvalidInput(
                f"an approval's time to live must be positive and at most "
                f"{MAX_APPROVAL_TTL.days} days"
            )
        proposal = self._proposal(proposal_id)
        facts = ReviewInput.model_validate(
            {
                "reviewer": reviewer,
                "proposal": {
                    "id": proposal.id,
                    "tenant": proposal.tenant,
                    "tool": proposal.tool,
                    "status": proposal.status.value,
                    "proposer": proposal.proposer,
                },
                "verdict": verdict.value,
            }
        )
        decision = _ask_review(self.policy, facts)
        entry = LedgerEntry(
            kind="review",
            tenant=proposal.tenant,
            principal=_who(reviewer),
            tool=proposal.tool,
            contract_version=proposal.contract_version,
            operation_id=proposal.operation_id,
            proposal_id=proposal.id,
            decision_id=decision.decision_id,
            policy_revision=policy_revision(decision.bundle_revisions),
        )
        if not decision.allow or decision.reasons:
            self._append(
                entry.model_copy(
                    update={"outcome": "refused", "reason_codes": decision.reason_codes}
                )
            )
            if decision.allow:  # an allow with reasons contradicts itself: refuse it
                raise PolicyUnavailable("OPA returned an inconsistent review allow")
            raise CapabilityViolation(
                f"review of {proposal.tool}", decision.reasons, decision_id=decision.decision_id
            )
        contract = self.catalogue.tools.get(proposal.tool)
        kind = contract.approval.value if contract is not None else "none"
        try:
            record = self._record_review(proposal, reviewer, verdict, kind, ttl, decision, entry)
        except _Lost:
            # Another review got there first: this one was decided on stale facts. It is
            # recorded like any refusal, then refused.
            self._append(
                entry.model_copy(
                    update={
                        "outcome": "refused",
                        "reason_codes": ["proposal_not_pending"],
                        "detail": {"after_allow": True},
                    }
                )
            )
            raise CapabilityViolation(
                f"review of {proposal.tool}",
                [Reason(code="proposal_not_pending", message="the proposal is no longer pending")],
                decision_id=decision.decision_id,
            ) from None
        log.info("review proposal=%s verdict=%s by=%s", proposal.id, verdict.value, _who(reviewer))
        return record

    def _record_review(
        self,
        proposal: ProposalRecord,
        reviewer: Principal,
        verdict: ReviewVerdict,
        kind: str,
        ttl: timedelta,
        decision: ReviewDecision,
        entry: LedgerEntry,
    ) -> ReviewRecord:
        """In one transaction: the review, the proposal's new status, the ledger row;
        _Lost if the proposal is no longer pending."""
        with self.store.transaction() as tx:
            current = tx.get_proposal(proposal.id, for_update=True)
            if current is None or current.status is not ProposalStatus.PENDING:
                raise _Lost
            record = tx.insert_review(
                ReviewRecord(
                    id=f"rev-{uuid.uuid4().hex[:20]}",
                    proposal_id=proposal.id,
                    reviewer=reviewer,
                    verdict=verdict,
                    kind=kind,
                    tenant=proposal.tenant,
                    tool=proposal.tool,
                    operation_id=proposal.operation_id,
                    digest=proposal.params_digest,
                    expires_at=tx.now + ttl,
                    decision_id=decision.decision_id,
                    created_at=tx.now,
                )
            )
            status = (
                ProposalStatus.APPROVED
                if verdict is ReviewVerdict.APPROVED
                else ProposalStatus.REJECTED
            )
            tx.update_proposal(proposal.id, status=status, reason_codes=[])
            tx.append(
                entry.model_copy(update={"outcome": status.value, "detail": {"review": record.id}})
            )
        return record

    # -- dispatch -----------------------------------------------------------------------

    def dispatch(self, proposal_id: str) -> Outcome:
        """Run a reviewed proposal, asking OPA first with the facts as they are now.

        A deny (connection revoked, approval expired or used, content altered, the
        contract or the role changed, budget spent...) sends nothing, records why and
        marks an approved proposal blocked, then raises CapabilityViolation (a pending
        one stays pending: it was dispatched before its review). Dispatching a
        proposal that was dispatched already returns its operation's outcome.
        """
        proposal = self._proposal(proposal_id)
        if proposal.status is ProposalStatus.DISPATCHED:
            # Dispatched before: a final outcome is returned as it is; an unknown or
            # retryable one continues the same operation (asked again below, then
            # looked up before anything is sent again).
            previous = self._operation(proposal.tenant, proposal.operation_id)
            if previous is not None and previous.outcome is not None:
                outcome = Outcome.model_validate(previous.outcome)
                if outcome.status not in _UNSETTLED:
                    return outcome
        review = _latest_approval(self.store, proposal.id)
        contract = self.catalogue.tools.get(proposal.tool)
        read = self._call_facts(
            proposal.proposer,
            Task.model_validate(proposal.task),
            proposal.environment,
            proposal.task_id,
            proposal.operation_id,
        )
        # The stored parameters, hashed again now: content altered since the approval
        # gives another digest, and OPA denies it as approval_mismatch.
        prepared = self.dispatcher.prepare(proposal.tool, proposal.params)
        execute = self.dispatcher.execute_input(
            read.compose,
            prepared,
            operation_id=proposal.operation_id,
            stage=Stage.DISPATCH,
            approval=_approval_fact(review, proposal),
            evidence=read.evidence,
            budget=Budget(
                remaining=read.budget.remaining, cost=contract.cost_units if contract else 0
            ),
            operation=read.operation,
            proposal=ProposalRef(id=proposal.id, status=proposal.status.value),
        )
        # The version that was proposed and approved, not the catalogue's of today: a
        # contract changed since the review is denied by OPA (version_mismatch).
        execute = execute.model_copy(
            update={"call": execute.call.model_copy(update={"version": proposal.contract_version})}
        )
        try:
            authorised = self._authorise(prepared, execute, proposal.proposer, proposal.id)
        except CapabilityViolation as denial:
            if (
                proposal.status is not ProposalStatus.DISPATCHED
                and self._proposal(proposal.id).status is ProposalStatus.DISPATCHED
            ):
                # A concurrent dispatch claimed it between the reads above (so this
                # one saw its approval used): join that dispatch instead. Once only:
                # the proposal read again is DISPATCHED.
                return self.dispatch(proposal_id)
            self._block(proposal, denial.reason_codes, denial.decision_id, denial.revision)
            raise
        return self._execute(authorised, proposal.task_id, read, proposal=proposal, review=review)

    def _block(
        self,
        proposal: ProposalRecord,
        codes: list[str],
        decision_id: str | None,
        revision: str | None = None,
    ) -> None:
        """Block an approved proposal whose dispatch was denied. A pending one is left
        pending: dispatched before its review, it was early, not overtaken by events,
        and blocking it would make it impossible to review."""
        with self.store.transaction() as tx:
            current = tx.get_proposal(proposal.id, for_update=True)
            if current is None or current.status is not ProposalStatus.APPROVED:
                return
            tx.update_proposal(proposal.id, status=ProposalStatus.BLOCKED, reason_codes=codes)
            tx.append(
                LedgerEntry(
                    kind="dispatch",
                    tenant=proposal.tenant,
                    principal=_who(proposal.proposer),
                    tool=proposal.tool,
                    contract_version=proposal.contract_version,
                    operation_id=proposal.operation_id,
                    proposal_id=proposal.id,
                    decision_id=decision_id,
                    policy_revision=revision,
                    outcome=ProposalStatus.BLOCKED.value,
                    reason_codes=codes,
                )
            )
        log.info("blocked proposal=%s reasons=%s", proposal.id, ",".join(codes))

    # -- running an authorised operation ---------------------------------------------------

    def _authorise(
        self,
        prepared: Any,
        execute: Any,
        principal: Principal,
        proposal_id: str | None,
    ) -> Authorised:
        """Ask and verify; a deny or a refusal is recorded in the ledger, then raised."""
        try:
            return self.dispatcher.authorise(prepared, execute)
        except CapabilityViolation as denial:
            self._append(
                LedgerEntry(
                    kind="decision",
                    tenant=principal.tenant,
                    principal=_who(principal),
                    tool=prepared.tool,
                    contract_version=prepared.contract.version if prepared.contract else None,
                    operation_id=execute.call.operation_id,
                    proposal_id=proposal_id,
                    decision_id=denial.decision_id,
                    policy_revision=denial.revision,
                    outcome="deny",
                    reason_codes=denial.reason_codes,
                    detail={"stage": execute.stage.value},
                )
            )
            raise
        except PolicyUnavailable as failure:
            self._append(
                LedgerEntry(
                    kind="decision",
                    tenant=principal.tenant,
                    principal=_who(principal),
                    tool=prepared.tool,
                    operation_id=execute.call.operation_id,
                    proposal_id=proposal_id,
                    outcome="policy_unavailable",
                    reason_codes=[failure.code],
                    detail={"stage": execute.stage.value},
                )
            )
            raise

    def _execute(
        self,
        authorised: Authorised,
        task_id: str,
        read: _CallFacts,
        *,
        proposal: ProposalRecord | None,
        review: ReviewRecord | None,
    ) -> Outcome:
        """Record the intent, run (or look up), record the outcome: see the module doc."""
        account, secret = self._credential(authorised, read.accounts)
        try:
            # Asked before the claim: a server that changed the tool since its
            # definition was accepted (restarted, say) is found out by the listing this
            # makes, and the call is refused with nothing reserved, written or sent.
            definition = _definition_digest(authorised)
        except DefinitionChanged:
            self._refuse(authorised, proposal, "tool_quarantined")
        deadline = time.monotonic() + self.duplicate_wait
        while True:
            try:
                claim = self._claim(authorised, task_id, proposal, review, definition)
            except _Refused as refused:
                self._refuse(authorised, proposal, refused.reason)
            except _Lost:
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
        with self._leases.held(operation):
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
        self, authorised: Authorised, accounts: dict[str, str]
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
        cost = contract.cost_units
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
                    raise _Lost
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
                    raise _Lost
            else:
                if existing.status is OperationStatus.RUNNING:
                    if existing.lease_until is not None and existing.lease_until > tx.now:
                        return None  # someone is running it: wait for their outcome
                    # Its runner died mid-run: the effect may have happened.
                    previous = _stopped(existing, contract)
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
                        self._entry(
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
                self._entry(
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
        """Whether a finished operation may run again.

        Retryable means nothing happened: yes. Unknown means it may have: only when
        a repeat cannot do it twice, because the adapter can look the operation up
        first or the contract says repeating is safe. Success and refused are final.
        """
        if previous.status is OutcomeStatus.RETRYABLE:
            return True
        if previous.status is not OutcomeStatus.UNKNOWN:
            return False
        return _can_look_up(authorised) or (
            authorised.contract.idempotency is not Idempotency.NOT_IDEMPOTENT
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
            self._entry(
                "dispatch",
                authorised,
                proposal_id=proposal.id,
                outcome=ProposalStatus.DISPATCHED.value,
                detail={"review": review.id, "action": authorised.action},
            )
        )

    def _refuse(
        self, authorised: Authorised, proposal: ProposalRecord | None, code: str
    ) -> NoReturn:
        """Record a refusal found while claiming (after OPA's allow), then raise it."""
        reason = Reason(code=code, message=_REFUSALS[code])
        if proposal is not None and code != "proposal_not_approved":
            self._block(proposal, [code], authorised.decision_id, authorised.revision)
        self._append(
            self._entry(
                "decision",
                authorised,
                proposal_id=proposal.id if proposal else None,
                outcome="deny",
                reason_codes=[code],
                detail={"stage": authorised.request.stage.value, "after_allow": True},
            )
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
                _conclude(tx, current, outcome)
            _record_produced(tx, contract, tenant, task_id, operation.operation_id, outcome)
            tx.append(
                self._entry(
                    "outcome",
                    authorised,
                    proposal_id=proposal_id,
                    outcome=outcome.status.value,
                    detail={
                        "attempt": operation.attempts,
                        "receipt": outcome.provider_receipt,
                        "produced": list(contract.produces)
                        if outcome.status is OutcomeStatus.SUCCESS
                        else [],
                        **({"after_lease": True} if late else {}),
                        **({"definition": definition} if definition else {}),
                    },
                )
            )

    # -- recovery -----------------------------------------------------------------------

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
        operation = self._operation(tenant, operation_id)
        if operation is None:
            raise UnknownOperation(tenant, operation_id)
        if operation.status is OperationStatus.RUNNING:
            operation = self._stop(operation) or self._operation(tenant, operation_id)
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
            contract = self.catalogue.tools.get(stale.tool)
            outcome = Outcome(
                tool=stale.tool,
                version=contract.version if contract else 1,
                operation_id=stale.operation_id,
                status=OutcomeStatus.UNKNOWN,
                error="the gateway stopped while the operation ran",
                recovery=contract.recovery if contract else "lookup_before_retry",
            )
            record = _conclude(tx, stale, outcome)
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
        adapter = self.registry.adapter_for(action)
        if not _has_lookup(adapter, action):
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
            record = _conclude(tx, current, outcome)
            produced = _record_produced(
                tx, contract, tenant, current.task_id, operation_id, outcome
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

    # -- operators -----------------------------------------------------------------------

    def revoke_connection(self, tenant: str, alias: str, *, by: str) -> ConnectionRecord:
        """Revoke a connection: its tools vanish from the next compose, and every
        queued proposal that acts through it is blocked (``connection_revoked``)."""
        return self._set_connection(tenant, alias, ConnectionStatus.REVOKED, by=by)

    def restore_connection(self, tenant: str, alias: str, *, by: str) -> ConnectionRecord:
        """Make a revoked or disabled connection active again (blocked proposals stay
        blocked: their facts changed, so they must be proposed again)."""
        return self._set_connection(tenant, alias, ConnectionStatus.ACTIVE, by=by)

    def _set_connection(
        self, tenant: str, alias: str, status: ConnectionStatus, *, by: str
    ) -> ConnectionRecord:
        with self.store.transaction() as tx:
            record = tx.set_connection_status(tenant, alias, status)
            blocked: list[str] = []
            if status is not ConnectionStatus.ACTIVE:
                for queued in [
                    *tx.list_proposals(tenant=tenant, status=ProposalStatus.PENDING),
                    *tx.list_proposals(tenant=tenant, status=ProposalStatus.APPROVED),
                ]:
                    contract = self.catalogue.tools.get(queued.tool)
                    if contract is not None and contract.connection_alias == alias:
                        code = (
                            "connection_revoked"
                            if status is ConnectionStatus.REVOKED
                            else "tool_not_enabled_for_tenant"
                        )
                        tx.update_proposal(
                            queued.id, status=ProposalStatus.BLOCKED, reason_codes=[code]
                        )
                        blocked.append(queued.id)
                        # Under the proposal too, so its own ledger says why it stopped.
                        tx.append(
                            LedgerEntry(
                                kind="dispatch",
                                tenant=tenant,
                                principal=by,
                                tool=queued.tool,
                                contract_version=queued.contract_version,
                                operation_id=queued.operation_id,
                                proposal_id=queued.id,
                                outcome=ProposalStatus.BLOCKED.value,
                                reason_codes=[code],
                                detail={"alias": alias},
                            )
                        )
            tx.append(
                LedgerEntry(
                    kind="connection",
                    tenant=tenant,
                    principal=by,
                    outcome=status.value,
                    detail={"alias": alias, "account": record.account, "blocked": blocked},
                )
            )
        log.info("connection tenant=%s alias=%s status=%s by=%s", tenant, alias, status.value, by)
        return record

    # -- small helpers -------------------------------------------------------------------

    def _proposal(self, proposal_id: str) -> ProposalRecord:
        if not isinstance(proposal_id, str):
            raise InvalidInput(f"a proposal id is a string, not a {type(proposal_id).__name__}")
        with self.store.transaction(read_only=True) as tx:
            proposal = tx.get_proposal(proposal_id)
        if proposal is None:
            raise UnknownProposal(proposal_id)
        return proposal

    def _operation(self, tenant: str, operation_id: str) -> OperationRecord | None:
        with self.store.transaction(read_only=True) as tx:
            return tx.get_operation(tenant, operation_id)

    def _append(self, entry: LedgerEntry) -> None:
        with self.store.transaction() as tx:
            tx.append(entry)

    def _entry(self, kind: str, authorised: Authorised, **fields: Any) -> LedgerEntry:
        principal = authorised.request.principal
        return LedgerEntry(
            kind=kind,
            tenant=principal.tenant,
            principal=_who(principal),
            tool=authorised.contract.name,
            contract_version=authorised.contract.version,
            operation_id=authorised.operation_id,
            decision_id=authorised.decision_id,
            policy_revision=authorised.revision,
            **fields,
        )


# -- helpers -------------------------------------------------------------------------------


def _request(request: object) -> AgentRequest:
    if not isinstance(request, AgentRequest):
        raise InvalidInput(f"request must be an AgentRequest, not a {type(request).__name__}")
    return request


def _operation_id(operation_id: object) -> str:
    if operation_id is None:
        return f"op-{uuid.uuid4()}"
    if not isinstance(operation_id, str):
        raise InvalidInput(
            f"operation_id must be a string or None, not a {type(operation_id).__name__}"
        )
    # Checked here, not only by the execute input: the dispatcher reads an empty id as
    # "none given" and makes up a fresh one, which would silently turn every retry of
    # the caller's operation into a new operation.
    try:
        return str(_IDENTIFIER.validate_python(operation_id))
    except ValidationError:
        raise InvalidInput(
            f"operation_id {quote(operation_id)} is not an identifier (1 to 128 of "
            "A-Z a-z 0-9 _ . : / -, starting with a letter or digit)"
        ) from None


def _who(principal: Principal) -> str:
    return f"{principal.agent}/{principal.role}"


def _ask_review(policy: ReviewPolicy, facts: ReviewInput) -> ReviewDecision:
    try:
        decision = policy.review(facts)
    except CapgateError:
        raise
    except Exception as exc:
        raise PolicyUnavailable(
            f"the policy decider failed on review ({type(exc).__name__}); failing closed"
        ) from exc
    if not isinstance(decision, ReviewDecision):
        raise PolicyUnavailable("the policy answered review with something else")
    return decision


def _latest_approval(store: Store, proposal_id: str) -> ReviewRecord | None:
    with store.transaction(read_only=True) as tx:
        approvals = [r for r in tx.reviews(proposal_id) if r.verdict is ReviewVerdict.APPROVED]
    return approvals[-1] if approvals else None


def _approval_fact(review: ReviewRecord | None, proposal: ProposalRecord) -> Approval | None:
    """The approval as OPA sees it. ``used`` means consumed by anything but this very
    operation: a dispatched proposal whose outcome was unknown is continued, not
    approved twice (the approval binds its one operation id)."""
    if review is None:
        return None
    return Approval(
        kind=review.kind,
        tool=review.tool,
        operation_id=review.operation_id,
        tenant=review.tenant,
        digest=review.digest,
        expires_at=review.expires_at,
        approved_by=review.reviewer.agent,
        used=review.consumed_at is not None and proposal.status is not ProposalStatus.DISPATCHED,
    )


def _operation_state(record: OperationRecord | None) -> OperationState:
    """The store's state of an operation id, as the execute policy reads it."""
    if record is None:
        return OperationState(status="none")
    if record.status is OperationStatus.RUNNING or record.outcome is None:
        return OperationState(status="running")
    status = Outcome.model_validate(record.outcome).status
    return OperationState(status=status.value)


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


def _adapter_quarantine(
    adapter: SupportsDefinitions, names: list[str], pins: list[PinRecord]
) -> set[str]:
    """The tools an adapter says its pins do not let run; all of them if it cannot say
    (a fact that grants is never assumed)."""
    try:
        found = adapter.quarantined(names, pins)
    except Exception as exc:
        log.warning("an adapter could not say which tools are quarantined (%s)", type(exc).__name__)
        return set(names)
    return {name for name in found if name in names} if isinstance(found, set) else set(names)


def _has_lookup(adapter: Adapter | None, action: str) -> bool:
    try:
        return isinstance(adapter, SupportsLookup) and bool(adapter.has_lookup(action))
    except Exception:  # an adapter that cannot say: no lookup
        return False


def _can_look_up(authorised: Authorised) -> bool:
    return _has_lookup(authorised.adapter, authorised.action)


def _lookup_due(operation: OperationRecord, now: Any) -> bool:
    """Whether an unknown operation's wait before its next lookup is over: the stored
    outcome's ``retry_after_seconds`` (none: at once) since it was last touched."""
    wait = (operation.outcome or {}).get("retry_after_seconds")
    if not isinstance(wait, int | float) or isinstance(wait, bool) or wait <= 0:
        return True
    return bool(operation.updated_at + timedelta(seconds=float(wait)) <= now)


def _conclude(tx: Tx, current: OperationRecord, outcome: Outcome) -> OperationRecord:
    """Write ``outcome`` over the operation (``current``, locked) and settle its budget.

    One operation, one charge, settled once: success counts its reservation as spent,
    refused and retryable release it (nothing happened), and unknown keeps holding it
    until a lookup (or a later attempt) says what happened, so an uncertain payment
    is never handed back to the budget as if it had not been made.
    """
    unknown = outcome.status is OutcomeStatus.UNKNOWN
    if current.reserved and not unknown:
        tx.settle_budget(
            current.tenant,
            current.task_id,
            current.cost,
            spent=outcome.status is OutcomeStatus.SUCCESS,
        )
    return tx.update_operation(
        current.tenant,
        current.operation_id,
        status=OperationStatus.DONE,
        outcome=outcome.model_dump(mode="json"),
        attempts=current.attempts,
        lease_until=None,
        reserved=current.reserved and unknown,
    )


def _record_produced(
    tx: Tx,
    contract: ToolContract,
    tenant: str,
    task_id: str | None,
    operation_id: str,
    outcome: Outcome,
) -> list[str]:
    """Record, for the task, the evidence a successful operation produces; its names."""
    if outcome.status is not OutcomeStatus.SUCCESS or task_id is None:
        return []
    for name in contract.produces:
        tx.record_evidence(tenant, task_id, name, source=f"operation:{operation_id}")
    return list(contract.produces)


def _stopped(operation: OperationRecord, contract: ToolContract) -> Outcome:
    """The outcome of an operation whose runner stopped mid-run: unknown."""
    return Outcome(
        tool=operation.tool,
        version=contract.version,
        operation_id=operation.operation_id,
        status=OutcomeStatus.UNKNOWN,
        error="the gateway stopped while the operation ran",
        recovery=contract.recovery,
    )


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
