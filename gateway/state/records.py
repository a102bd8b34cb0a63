"""What the gateway's store holds: typed, frozen records.

The store is the source of every fact that grants something at decision time
(connection status, budget, evidence, approvals, operation history), so a caller
can never assert one. These records are what the store returns; the store never
holds a secret (credentials are resolved from a connection's alias at dispatch).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from capgate.gateway.digest import canonical_json, digest_of
from capgate.gateway.model.comments import ReviewComment
from capgate.gateway.model.contracts import UpstreamToolName
from capgate.gateway.model.facts import (
    ConnectionStatus,
    EvidencePiece,
    EvidenceSubject,
    Identifier,
    Principal,
    ResourceRef,
    Reviewer,
)

__all__ = [
    "MAX_AMOUNT",
    "Amount",
    "BeginResult",
    "BeginStatus",
    "BudgetState",
    "ConnectionRecord",
    "ContractPin",
    "Digest",
    "DispatchJob",
    "DispatchStatus",
    "EvidenceRecord",
    "LedgerEntry",
    "LedgerRow",
    "NoticeAttempt",
    "NoticeCursor",
    "NoticeDelivery",
    "NoticeStatus",
    "OperationRecord",
    "OperationStatus",
    "PinRecord",
    "PinStatus",
    "ProposalRecord",
    "ProposalStatus",
    "ReviewRecord",
    "ReviewVerdict",
    "TaskLinkRecord",
    "TenantRecord",
    "VerifyReport",
    "definition_digest",
]


#: A parameter digest as the dispatcher computes it (``capgate.gateway.digest``).
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
#: Largest budget amount (limit, cost, reservation): far beyond any real budget, and
#: inside the 64-bit integers both backends store.
MAX_AMOUNT: Final = 2**62
#: A budget amount in cost units.
Amount = Annotated[int, Field(ge=0, le=MAX_AMOUNT)]


class _Record(BaseModel):
    """Records are frozen and forbid unknown fields; every time is timezone-aware
    (the store returns UTC), so no naive datetime can be compared with a stored one."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TenantRecord(_Record):
    """A tenant and its spending settings.

    ``budget_class`` is the compose fact (which cost classes the tenant's agents
    may see); ``budget_limit`` is the amount, in cost units, its calls may spend in
    all (``None``: no limit).
    """

    tenant: Identifier
    budget_class: Identifier
    budget_limit: Amount | None = None


class BudgetState(_Record):
    """A tenant's budget now, or one task's (``task_id`` set) when it has its own limit.

    ``remaining`` is None when there is no limit; it can be negative after a limit
    was lowered below what is already reserved and spent.
    """

    tenant: Identifier
    task_id: Identifier | None = None
    limit: int | None
    reserved: int
    spent: int

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else self.limit - self.reserved - self.spent


class ConnectionRecord(_Record):
    """One tenant connection: alias, status and the provider account it acts as.

    ``account`` is the provider account identity (e.g. ``sales@acme.example``),
    kept for logs and the ledger; the credential itself never enters the store.
    """

    tenant: Identifier
    alias: Identifier
    status: ConnectionStatus
    account: str = Field(min_length=1, max_length=256)
    updated_at: AwareDatetime


class ContractPin(_Record):
    """The content a tool's contract version was first served with: the digest of
    its compiled contract (what the policies read of it), kept so that the same
    version number can never come back meaning something else."""

    tool: Identifier
    version: int = Field(ge=1)
    digest: Digest
    pinned_at: AwareDatetime


class TaskLinkRecord(_Record):
    """A resource linked to a task, and who linked it when: a fact the gateway holds,
    which a request may narrow and never widen (``docs/lifecycle.md``)."""

    tenant: Identifier
    task_id: Identifier
    resource: ResourceRef
    #: Who linked it, as the ledger names people and agents (never a secret).
    linked_by: str = Field(min_length=1, max_length=256)
    linked_at: AwareDatetime


class EvidenceRecord(_Record):
    """A piece of evidence the gateway recorded for a task, and what produced it.

    ``subject``: what it is about (None: nothing in particular, as every piece
    recorded before schema version 8); ``expires_at``: when it stops being evidence
    (None: never).
    """

    tenant: Identifier
    task_id: Identifier
    name: Identifier
    source: str = Field(min_length=1, max_length=256)  # e.g. "operation:op-17", "review:rv-3"
    recorded_at: AwareDatetime
    subject: EvidenceSubject | None = None
    expires_at: AwareDatetime | None = None

    def piece(self) -> EvidencePiece:
        """The piece as the execute policy reads it (``input.evidence_about``)."""
        return EvidencePiece(name=self.name, subject=self.subject, expires_at=self.expires_at)


class ProposalStatus(StrEnum):
    PENDING = "pending"  # waiting for a review
    APPROVED = "approved"  # a reviewer approved it; not dispatched yet
    REJECTED = "rejected"  # a reviewer rejected it; final
    DISPATCHED = "dispatched"  # the execution action ran (see the operation's outcome)
    BLOCKED = "blocked"  # dispatch was denied (facts changed since the proposal); final


class ProposalRecord(_Record):
    """A proposed action: the exact content and recipient, frozen when proposed."""

    id: Identifier
    tenant: Identifier
    task_id: Identifier
    proposer: Principal
    environment: Identifier
    task: dict[str, Any]  # the Task facts at proposal time (type, needs, linked resources)
    tool: Identifier
    contract_version: int = Field(ge=1)
    execution_action: Identifier
    params: dict[str, Any]
    params_digest: Digest
    operation_id: Identifier
    decision_id: str | None
    status: ProposalStatus
    reason_codes: list[str] = Field(default_factory=list)
    created_at: AwareDatetime
    updated_at: AwareDatetime
    #: When proposed: the tenant's operations of the same tool with exactly this
    #: content that were still running or ended ``unknown``. Approving this one may
    #: do the same thing twice (a payment paid again); reviewers are told.
    unsettled_twins: list[Identifier] = Field(default_factory=list)


class ReviewVerdict(StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"


class ReviewRecord(_Record):
    """A reviewer's verdict on one proposal; an approval is consumed exactly once."""

    id: Identifier
    proposal_id: Identifier
    #: The authenticated identity that gave the verdict, as the front established it.
    reviewer: Reviewer
    verdict: ReviewVerdict
    kind: Identifier  # the approval kind the reviewer granted
    tenant: Identifier
    tool: Identifier
    operation_id: Identifier
    digest: Digest
    expires_at: AwareDatetime
    consumed_at: AwareDatetime | None = None
    decision_id: str | None
    created_at: AwareDatetime
    #: What the reviewer wrote beside the verdict, for people (never sent to OPA, never
    #: logged): :data:`~capgate.gateway.model.comments.ReviewComment`'s rule.
    comment: ReviewComment = None


class DispatchStatus(StrEnum):
    """Where an approved proposal stands in the execution workers' queue."""

    QUEUED = "queued"  # waiting for a worker (or held by one: see claimed_by)
    DONE = "done"  # nothing more to do: a final outcome, or blocked
    GIVEN_UP = "given_up"  # the worker stopped trying; a person (or a lookup) decides


class DispatchJob(_Record):
    """One approved proposal in the queue the execution workers take their work from.

    Queued in the transaction that approves the proposal. A worker claims it
    (``claimed_by``, until ``claim_until``, renewed while it works), dispatches it,
    and settles it: done, queued again for ``not_before`` (a retry, with backoff), or
    given up. A claim past ``claim_until`` belongs to a worker that died: any worker
    may take it. ``tries`` counts the claims; ``last_result`` is a short,
    secret-free code of what the last one came to (an outcome status, reason codes,
    an error code).
    """

    proposal_id: Identifier
    tenant: Identifier
    status: DispatchStatus
    not_before: AwareDatetime
    claimed_by: str | None = Field(default=None, max_length=256)
    claim_until: AwareDatetime | None = None
    tries: int = Field(ge=0)
    last_result: str | None = Field(default=None, max_length=512)
    created_at: AwareDatetime
    updated_at: AwareDatetime


class OperationStatus(StrEnum):
    RUNNING = "running"  # intent recorded; the tool may be running (or the process died)
    DONE = "done"  # an outcome is recorded


class OperationRecord(_Record):
    """One operation id of a tenant: what it was for and what came of it.

    ``task_id`` is the task whose budget the cost was reserved against (with the
    tenant's), so whoever settles or reconciles the operation settles the same
    budgets, even in another process.
    """

    tenant: Identifier
    operation_id: Identifier
    tool: Identifier
    params_digest: Digest
    task_id: Identifier | None = None
    status: OperationStatus
    outcome: dict[str, Any] | None  # Outcome.model_dump(mode="json") once DONE
    cost: Amount
    attempts: int = Field(ge=1)
    lease_until: AwareDatetime | None  # a RUNNING operation past its lease may be reconciled
    created_at: AwareDatetime
    updated_at: AwareDatetime
    #: Whether the current attempt holds a budget reservation of ``cost``. A retry
    #: of an operation whose earlier attempt ended unknown was charged then and
    #: reserves nothing; whoever settles or reconciles it must not charge it again.
    reserved: bool = True


def definition_digest(definition: dict[str, Any]) -> str:
    """``sha256:<hex>`` of an upstream tool definition's canonical JSON (sorted keys, no
    whitespace: :func:`capgate.gateway.digest.canonical_json`), as pins record it."""
    return digest_of(canonical_json(definition))


class PinStatus(StrEnum):
    """Where an upstream tool's definition stands with the people who review them.

    Only ``accepted`` lets the catalogue tool mapped to it run; every other status
    quarantines it (``tool_quarantined``).
    """

    PENDING = "pending"  # discovered, never accepted: waiting for a review
    ACCEPTED = "accepted"  # the server shows the definition a person accepted
    CHANGED = "changed"  # the server shows another definition, or none: quarantined
    REJECTED = "rejected"  # the server shows a definition a person rejected: quarantined


class PinRecord(_Record):
    """One tool of one upstream MCP server, as reviewed.

    ``observed_*`` is what the server showed last (its name, title, description,
    schemas and annotations, as canonical JSON, and that JSON's digest); ``None``
    when the server no longer lists the tool. ``accepted_*`` is the definition a
    person accepted and the catalogue tool they accepted it as; ``rejected_*`` the
    last definition a person rejected. The server's annotations are kept as shown,
    never read as authority: what the tool may do is its catalogue contract's.
    """

    server: Identifier
    tool: UpstreamToolName
    status: PinStatus
    observed_digest: Digest | None
    observed_definition: dict[str, Any] | None
    observed_at: AwareDatetime
    catalogue_tool: Identifier | None = None
    accepted_digest: Digest | None = None
    accepted_definition: dict[str, Any] | None = None
    accepted_by: str | None = Field(default=None, max_length=128)
    accepted_at: AwareDatetime | None = None
    rejected_digest: Digest | None = None
    rejected_by: str | None = Field(default=None, max_length=128)
    rejected_at: AwareDatetime | None = None
    updated_at: AwareDatetime

    @property
    def quarantined(self) -> bool:
        """Whether the catalogue tool mapped to it may not run now."""
        return self.status is not PinStatus.ACCEPTED


class NoticeStatus(StrEnum):
    """Where one webhook notice stands."""

    SENDING = "sending"  # attempted, not delivered yet (retrying, or its sender died)
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # given up: a permanent refusal, or the last attempt failed


class NoticeCursor(_Record):
    """How far a tenant's notices have gone: every ledger row up to ``after_seq`` has
    been delivered, recorded as failed, or was not a notice. A notifier holds it
    (``claimed_by`` until ``claim_until``, renewed while it works) so that one
    process at a time sends a tenant's notices, in ledger order."""

    tenant: Identifier
    after_seq: int = Field(ge=0)
    claimed_by: str | None = Field(default=None, max_length=256)
    claim_until: AwareDatetime | None = None
    updated_at: AwareDatetime


class NoticeDelivery(_Record):
    """One notice (an event derived from ledger row ``seq``) and what came of it.
    ``last_result`` is ``http_<status>`` or an error's class name: never a body, a
    header or the secret."""

    event_id: str = Field(min_length=1, max_length=64)
    tenant: Identifier
    seq: int = Field(ge=1)
    event: str = Field(max_length=64)
    proposal_id: Identifier
    status: NoticeStatus
    attempts: int = Field(ge=0)
    last_result: str | None = Field(default=None, max_length=128)
    created_at: AwareDatetime
    updated_at: AwareDatetime


class NoticeAttempt(_Record):
    """One delivery attempt of a notice: when, and what the receiver (or the network)
    answered."""

    event_id: str = Field(min_length=1, max_length=64)
    attempt: int = Field(ge=1)
    at: AwareDatetime
    result: str = Field(max_length=128)
    status_code: int | None = None


class BeginStatus(StrEnum):
    NEW = "new"  # this caller owns the operation now; the budget is reserved
    DONE = "done"  # already finished with the same parameters: return its outcome
    RUNNING = "running"  # another caller is running it now
    CONFLICT = "conflict"  # the id was used with other parameters (or another tool)
    NO_BUDGET = "no_budget"  # not enough budget left; nothing was reserved or recorded


class BeginResult(_Record):
    status: BeginStatus
    operation: OperationRecord | None = None


class LedgerEntry(_Record):
    """What a caller appends; the store adds sequence, time and the hash chain."""

    kind: str  # compose, decision, proposal, review, intent, dispatch, outcome, ...
    tenant: str | None = None
    principal: str | None = None  # "agent/role" or a reviewer's id: never a secret
    tool: str | None = None
    contract_version: int | None = None
    operation_id: str | None = None
    proposal_id: str | None = None
    decision_id: str | None = None
    policy_revision: str | None = None
    outcome: str | None = None
    reason_codes: list[str] = Field(default_factory=list)
    detail: dict[str, Any] = Field(default_factory=dict)  # small, secret-free facts


class LedgerRow(LedgerEntry):
    """A stored ledger row: ``seq`` counts from 1 without gaps; ``hash`` is
    :func:`capgate.gateway.state.ledger.row_hash` of every other field."""

    seq: int = Field(ge=1)
    at: AwareDatetime
    prev_hash: str
    hash: str


class VerifyReport(_Record):
    """What :meth:`Store.verify_ledger` found.

    ``rows`` counts the rows checked (up to and including the first bad one);
    ``last_hash`` is the hash of the last row when the chain is whole: keep it
    somewhere else (a log, another system) to detect later that rows were cut off
    the end or the chain was rewritten from some row on, which no chain can show
    by itself.
    """

    ok: bool
    rows: int
    first_bad_seq: int | None = None
    problem: str | None = None
    last_hash: str | None = None
