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

import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Concatenate, Final, Literal, ParamSpec, TypeVar

from pydantic import TypeAdapter, ValidationError

from capgate.gateway.catalogue.names import UndeclaredWatch
from capgate.gateway.enforce.dispatcher import DecisionEvent, Dispatcher, policy_revision
from capgate.gateway.enforce.grant import Authorised, Prepared
from capgate.gateway.errors import (
    CapabilityViolation,
    InvalidInput,
    PolicyUnavailable,
    UnknownProposal,
    quote,
)
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import ComposeDecision
from capgate.gateway.model.facts import (
    ComposeInput,
    ConnectionStatus,
    Identifier,
    Principal,
    ProposalRef,
    ResourceRef,
    Reviewer,
    Stage,
    Task,
)
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.connections import set_connection
from capgate.gateway.service.credentials import CredentialResolver, NoCredentials
from capgate.gateway.service.facts import CallFacts, FactReader, execute_input
from capgate.gateway.service.ledger import append, text_digest, who
from capgate.gateway.service.links import (
    AgentLink,
    agent_link,
    link_resource,
    task_links,
    unlink_resource,
)
from capgate.gateway.service.operations import Operations
from capgate.gateway.service.proposals import (
    DEFAULT_APPROVAL_TTL,
    Proposals,
    ReviewPolicy,
    approval_fact,
    approvals_of,
    block,
    read_proposal,
)
from capgate.gateway.service.recovery import Recovery, read_operation
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import (
    ConnectionRecord,
    LedgerEntry,
    OperationRecord,
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
    TaskLinkRecord,
)
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry
from capgate.gateway.tracing import annotate, traced

__all__ = ["Gateway", "ReviewPolicy", "StepTiming"]

log = logging.getLogger("capgate.service")

#: How long a running operation is left alone before it may be reconciled or taken
#: over: a gateway process that died mid-run leaves its operation ``running`` until
#: then. A live gateway renews the lease every third of it while the tool runs.
DEFAULT_LEASE: Final = timedelta(minutes=5)
#: How long a duplicate of a running operation waits for its outcome.
DEFAULT_DUPLICATE_WAIT: Final = 10.0
#: Outcomes after which an operation may be tried again.
_UNSETTLED: Final = (OutcomeStatus.RETRYABLE, OutcomeStatus.UNKNOWN)
#: Checks an operation id as the policy input will (see _operation_id).
_IDENTIFIER: Final = TypeAdapter(Identifier)

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One step of the life cycle, timed whole, as an ``on_step`` observer hears it.

    ``step`` is compose, execute, review or dispatch; ``seconds`` covers everything
    the step did (the store's facts, OPA, the tool, the records), so beside the OPA
    exchange alone (:class:`~capgate.gateway.policy.client.Exchange`) it shows where
    a slow call spent its time. ``result`` is ``ok``, ``denied`` (a policy said no:
    a CapabilityViolation) or ``error`` (anything else raised).
    """

    step: str
    seconds: float
    result: str


def _step(
    name: str,
) -> Callable[[Callable[Concatenate[Gateway, _P], _R]], Callable[Concatenate[Gateway, _P], _R]]:
    """The decorated method is the step ``name``: inside the span ``capgate.<name>``
    (:mod:`capgate.gateway.tracing`) and timed for the gateway's ``on_step``."""

    def decorate(
        method: Callable[Concatenate[Gateway, _P], _R],
    ) -> Callable[Concatenate[Gateway, _P], _R]:
        in_span = traced(f"capgate.{name}")(method)

        @functools.wraps(method)
        def wrapper(self: Gateway, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            if self._on_step is None:
                return in_span(self, *args, **kwargs)
            started = time.perf_counter()
            result = "error"
            try:
                answer = in_span(self, *args, **kwargs)
                result = "ok"
                return answer
            except CapabilityViolation:
                result = "denied"
                raise
            finally:
                self._on_step(StepTiming(name, time.perf_counter() - started, result))

        return wrapper

    return decorate


class Gateway:
    """The stateful front: store-backed facts, the life cycle, the ledger.

    ``policy`` is normally a :class:`~capgate.gateway.policy.client.PolicyClient`;
    ``registry`` holds the adapters (attached before the gateway is built: the pins of
    those that run upstream definitions are read with every call's facts); ``store``
    the state (see :func:`capgate.gateway.state.open_store`); ``credentials``
    resolves a connection's secret at dispatch only. Each step of the life cycle is
    the job of one module of this package; this class wires them and is the way in.
    ``observer`` hears each decision (:class:`~capgate.gateway.enforce.dispatcher.DecisionEvent`)
    and ``on_step`` how long each step took (:class:`StepTiming`): the metrics.
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
        on_step: Callable[[StepTiming], None] | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.policy = policy
        self.store = store
        self.registry = registry
        self.credentials: CredentialResolver = credentials or NoCredentials()
        self.dispatcher = Dispatcher(catalogue, policy, registry, observer=observer)
        self._facts = FactReader(catalogue, registry, store)
        #: Logs, once per name, a role, task type or environment the catalogue lacks.
        self._names = UndeclaredWatch(catalogue)
        self._proposals = Proposals(store, catalogue, policy, approval_ttl=approval_ttl)
        self._operations = Operations(
            store, self.dispatcher, self.credentials, lease=lease, duplicate_wait=duplicate_wait
        )
        self._recovery = Recovery(store, catalogue, registry, self.dispatcher, self.credentials)
        #: Renews the leases of the operations this gateway runs.
        self._leases = self._operations.leases
        self._on_step = on_step

    @property
    def approval_ttl(self) -> timedelta:
        """How long an approval given now stays usable (reviewers are shown it)."""
        return self._proposals.approval_ttl

    # -- the facts and what an agent may see ---------------------------------------------

    def compose_facts(self, request: AgentRequest) -> ComposeInput:
        """The compose input: the request's facts plus the tenant's, from the store now."""
        request = _request(request)
        self._names.check(request.principal.role, request.task.type, request.environment)
        return self._facts.compose_now(request.principal, request.task, request.environment)

    def visible(self, request: AgentRequest) -> frozenset[str]:
        """The tools the caller may see now, asked of OPA without a ledger row.

        For fronts that poll whether a session's tools changed (an MCP server's
        ``list_changed``): a row per poll would drown the ledger. What an agent is
        shown to use is recorded by :meth:`compose`.
        """
        return frozenset(self.dispatcher.compose(self.compose_facts(request)).visible)

    @_step("compose")
    def compose(self, request: AgentRequest, *, reasons: bool = False) -> ComposeDecision:
        """Which tools may this agent see now? Connection state is read from the store.

        An agent's compose carries the visible names only. With ``reasons`` (for
        people: a reviewer, an operator, the demo) ``excluded`` also says why each
        other tool is hidden, from the policy's explain entrypoint.
        """
        request = _request(request)
        facts = self.compose_facts(request)
        decision = self.dispatcher.compose(facts, reasons=reasons)
        append(
            self.store,
            LedgerEntry(
                kind="compose",
                tenant=request.tenant,
                principal=who(request.principal),
                decision_id=decision.decision_id,
                policy_revision=policy_revision(decision.bundle_revisions),
                outcome="composed",
                detail={"task": request.task_id, "visible": sorted(decision.visible)},
            ),
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
        append(
            self.store,
            LedgerEntry(
                kind="decision",
                tenant=request.tenant,
                principal=who(request.principal),
                tool=name,
                outcome="denied",
                reason_codes=["unknown_tool"],
                detail={
                    "task": request.task_id,
                    "stage": "unseen",
                    **({} if name else {"tool_digest": text_digest(tool)}),
                },
            ),
        )

    # -- call, propose, review, dispatch ----------------------------------------------------

    @_step("execute")
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
        self._names.check(request.principal.role, request.task.type, request.environment)
        operation_id = _operation_id(operation_id)
        annotate(operation_id=operation_id)
        prepared = self.dispatcher.prepare(tool, params)
        contract = prepared.contract
        stage = Stage.PROPOSE if contract is not None and contract.needs_review else Stage.CALL
        facts, authorised = self._ask(request, prepared, stage, operation_id)
        if stage is Stage.PROPOSE:
            return self._proposals.propose(authorised, request)
        return self._operations.run(authorised, request.task_id, facts, proposal=None, review=None)

    @_step("review")
    def review(
        self,
        proposal_id: str,
        reviewer: Reviewer,
        verdict: ReviewVerdict | str,
        *,
        ttl: timedelta | None = None,
        comment: str | None = None,
    ) -> ReviewRecord:
        """A reviewer approves or rejects a pending proposal, if OPA says they may.

        ``reviewer`` is the identity a front authenticated (a token, an OIDC ID
        token, the operator at the command line; :mod:`capgate.adapters.fronts.people`),
        never a name a request carries. Raises UnknownProposal, CapabilityViolation
        (the review policy's reasons, e.g. self_review or reviewer_not_permitted) or
        PolicyUnavailable; an approval binds the proposal's digest, operation and
        tenant and expires after ``ttl``. ``comment``, the reviewer's own words, is
        kept with the review and shown back, never sent to OPA
        (:mod:`capgate.gateway.model.comments`: InvalidInput before OPA is asked).
        """
        return self._proposals.review(proposal_id, reviewer, verdict, ttl=ttl, comment=comment)

    def migrate(self, proposal_id: str, *, by: Reviewer) -> ProposalRecord:
        """Move a pending or approved proposal made under an earlier version of its
        contract to today's version: its parameters checked against today's schema,
        its call proposed again as its proposer, with the facts of now, and asked of
        OPA (stage ``propose``); on an allow, in one transaction, the old proposal is
        blocked (``proposal_migrated``: its approvals go with it) and the new one is
        pending a review of its own, with a ``migration`` ledger row naming ``by``, the
        operator as a front authenticated them.

        InvalidInput naming why for a proposal that is not pending or approved, is
        under today's version already, or whose parameters no longer fit;
        CapabilityViolation for a call today's policy refuses (recorded; nothing
        else changes); ProposalStale when the proposal changed meanwhile;
        UnknownProposal for another tenant's, as for one that does not exist."""
        proposal = read_proposal(self.store, proposal_id)
        if proposal.tenant != by.tenant:
            raise UnknownProposal(proposal.id)  # the same answer as for no such proposal
        contract = self.catalogue.tools.get(proposal.tool)
        if proposal.status not in (ProposalStatus.PENDING, ProposalStatus.APPROVED):
            raise InvalidInput(
                f"proposal {proposal.id} is {proposal.status.value}: only a pending or "
                "approved proposal is migrated"
            )
        if contract is None:
            raise InvalidInput(
                f"proposal {proposal.id}: the catalogue has no tool {quote(proposal.tool)} "
                "any more, so there is no version to migrate it to"
            )
        if proposal.contract_version == contract.version:
            raise InvalidInput(
                f"proposal {proposal.id} is under version {contract.version} of "
                f"{proposal.tool} already, the catalogue's"
            )
        request = AgentRequest.model_validate(
            {
                "principal": proposal.proposer,
                "task": proposal.task,
                "environment": proposal.environment,
                "authenticated_by": f"migration:{proposal.id}",
            }
        )
        prepared = self.dispatcher.prepare(proposal.tool, proposal.params)
        _, authorised = self._ask(request, prepared, Stage.PROPOSE, _operation_id(None))
        return self._proposals.migrate(proposal, authorised, request, by=by)

    @_step("dispatch")
    def dispatch(self, proposal_id: str) -> Outcome:
        """Run a reviewed proposal, asking OPA first with the facts as they are now.

        A deny (connection revoked, approval expired or used, content altered, the
        contract or the role changed, budget spent...) sends nothing, records why and
        marks an approved proposal blocked, then raises CapabilityViolation (a pending
        one stays pending: it was dispatched before its review). Dispatching a
        proposal that was dispatched already returns its operation's outcome.
        """
        proposal = read_proposal(self.store, proposal_id)
        if proposal.status is ProposalStatus.DISPATCHED:
            # Dispatched before: a final outcome is returned as it is; an unknown or
            # retryable one continues the same operation (asked again below, then
            # looked up before anything is sent again).
            previous = read_operation(self.store, proposal.tenant, proposal.operation_id)
            if previous is not None and previous.outcome is not None:
                outcome = Outcome.model_validate(previous.outcome)
                if outcome.status not in _UNSETTLED:
                    return outcome
        approvals = approvals_of(self.store, proposal.id)
        review = approvals[-1] if approvals else None
        facts = self._facts.call(
            proposal.proposer,
            Task.model_validate(proposal.task),
            proposal.environment,
            proposal.task_id,
            proposal.operation_id,
        )
        # The stored parameters, hashed again now: content altered since the approval
        # gives another digest, and OPA denies it as approval_mismatch. The version is
        # the one that was proposed and approved, not the catalogue's of today: it
        # dispatches under that contract while the catalogue keeps it (retained.yaml),
        # and is denied (version_mismatch) once it does not.
        prepared = self.dispatcher.prepare(
            proposal.tool, proposal.params, version=proposal.contract_version
        )
        execute = execute_input(
            self.dispatcher,
            facts,
            prepared,
            stage=Stage.DISPATCH,
            operation_id=proposal.operation_id,
            approval=approval_fact(review, proposal, approvals),
            proposal=ProposalRef(id=proposal.id, status=proposal.status.value),
            version=proposal.contract_version,
        )
        try:
            authorised = self._authorise(prepared, execute, proposal.proposer, proposal.id)
        except CapabilityViolation as denial:
            if (
                proposal.status is not ProposalStatus.DISPATCHED
                and read_proposal(self.store, proposal.id).status is ProposalStatus.DISPATCHED
            ):
                # A concurrent dispatch claimed it between the reads above (so this
                # one saw its approval used): join that dispatch instead. Once only:
                # the proposal read again is DISPATCHED.
                return self.dispatch(proposal_id)
            block(self.store, proposal, denial.reason_codes, denial.decision_id, denial.revision)
            raise
        return self._operations.run(
            authorised, proposal.task_id, facts, proposal=proposal, review=review
        )

    def _ask(
        self, request: AgentRequest, prepared: Prepared, stage: Stage, operation_id: str
    ) -> tuple[CallFacts, Authorised]:
        """An agent's call (or proposal) at ``stage``, asked of OPA with the store's
        facts of now: those facts, and what the allow authorised. The refusals of
        :meth:`_authorise`, recorded."""
        facts = self._facts.call(
            request.principal, request.task, request.environment, request.task_id, operation_id
        )
        execute = execute_input(
            self.dispatcher, facts, prepared, stage=stage, operation_id=operation_id
        )
        return facts, self._authorise(prepared, execute, request.principal, None)

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
            append(
                self.store,
                LedgerEntry(
                    kind="decision",
                    tenant=principal.tenant,
                    principal=who(principal),
                    tool=prepared.tool,
                    contract_version=prepared.contract.version if prepared.contract else None,
                    operation_id=execute.call.operation_id,
                    proposal_id=proposal_id,
                    decision_id=denial.decision_id,
                    policy_revision=denial.revision,
                    outcome="deny",
                    reason_codes=denial.reason_codes,
                    detail={"stage": execute.stage.value},
                ),
            )
            raise
        except PolicyUnavailable as failure:
            append(
                self.store,
                LedgerEntry(
                    kind="decision",
                    tenant=principal.tenant,
                    principal=who(principal),
                    tool=prepared.tool,
                    operation_id=execute.call.operation_id,
                    proposal_id=proposal_id,
                    outcome="policy_unavailable",
                    reason_codes=[failure.code],
                    detail={"stage": execute.stage.value},
                ),
            )
            raise

    # -- recovery --------------------------------------------------------------------------

    def reconcile(self) -> list[OperationRecord]:
        """Settle what crashes and lost answers left open; return the operations changed
        (see :meth:`capgate.gateway.service.recovery.Recovery.reconcile`)."""
        return self._recovery.reconcile()

    def look_up(self, tenant: str, operation_id: str, *, by: str) -> Outcome | None:
        """Ask the provider what an ``unknown`` operation did, and record the answer; no
        allow needed, nothing sent (see
        :meth:`capgate.gateway.service.recovery.Recovery.look_up`)."""
        return self._recovery.look_up(tenant, operation_id, by=by)

    # -- operators ---------------------------------------------------------------------------

    def revoke_connection(self, tenant: str, alias: str, *, by: str) -> ConnectionRecord:
        """Revoke a connection: its tools vanish from the next compose, and every
        queued proposal that acts through it is blocked (``connection_revoked``)."""
        return set_connection(self.store, self.catalogue, tenant, alias,
                              ConnectionStatus.REVOKED, by=by)  # fmt: skip

    def restore_connection(self, tenant: str, alias: str, *, by: str) -> ConnectionRecord:
        """Make a revoked or disabled connection active again (blocked proposals stay
        blocked: their facts changed, so they must be proposed again)."""
        return set_connection(self.store, self.catalogue, tenant, alias,
                              ConnectionStatus.ACTIVE, by=by)  # fmt: skip

    def link_resource(
        self, tenant: str, task_id: str, resource: ResourceRef | dict[str, Any], *, by: str
    ) -> tuple[TaskLinkRecord, bool]:
        """Link a resource to a tenant's task, ledgered, naming ``by``: the link and
        whether this call made it (:func:`capgate.gateway.service.links.link_resource`)."""
        return link_resource(self.store, tenant, task_id, resource, by=by)

    def unlink_resource(
        self, tenant: str, task_id: str, resource: ResourceRef | dict[str, Any], *, by: str
    ) -> TaskLinkRecord | None:
        """Remove a task's link, ledgered, naming ``by``; the link removed, or None."""
        return unlink_resource(self.store, tenant, task_id, resource, by=by)

    def agent_link(
        self,
        request: AgentRequest,
        action: Literal["link", "unlink"],
        task_id: str,
        resource: ResourceRef | dict[str, Any],
    ) -> AgentLink:
        """An agent changes another task's links, if the link policy lets it: the
        link and whether this call changed anything; a refusal is a ledger row and a
        CapabilityViolation (:func:`capgate.gateway.service.links.agent_link`)."""
        return agent_link(self.store, self.policy, _request(request), action, task_id, resource)

    def task_links(self, tenant: str, task_id: str) -> list[TaskLinkRecord]:
        """The resources linked to a tenant's task, by type and id."""
        return task_links(self.store, tenant, task_id)

    def _proposal(self, proposal_id: str) -> ProposalRecord:
        return read_proposal(self.store, proposal_id)


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
