"""The facts Python gathers and sends to OPA: the input documents of both questions.

Every model forbids unknown fields and checks identifiers, so malformed facts are
rejected here with the bad field named, before they reach OPA. The JSON shape of
these models *is* the policy input contract documented in ``docs/policy-interface.md``.

Names that are dict *keys* (an unknown field, a connection alias) are checked before
pydantic sees them: pydantic puts a bad key into the error's location whole, so a
megabyte-long alias would come back as a megabyte-long message. Here it is quoted
cut short (:func:`capgate.gateway.errors.quote`).
"""

from __future__ import annotations

import functools
import re
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
    field_validator,
    model_validator,
)

from capgate.gateway.errors import InvalidInput, quote

__all__ = [
    "Approval",
    "Budget",
    "Call",
    "ComposeInput",
    "ConnectionStatus",
    "EvidencePiece",
    "EvidenceSubject",
    "ExecuteInput",
    "Identifier",
    "LinkInput",
    "LinkRequest",
    "LinkingTask",
    "OperationState",
    "Principal",
    "ProposalRef",
    "ResourceRef",
    "ReviewInput",
    "ReviewProposal",
    "Reviewer",
    "ReviewerKind",
    "Stage",
    "Task",
    "checked_identifier",
]

#: Names of tools, roles, aliases, environments ...: short, printable, no spaces.
Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$")
]
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
_NAME_RULE: Final = "1 to 128 letters, digits and _ . : / -, starting with a letter or digit"


def checked_identifier(value: object, what: str) -> str:
    """``value`` if it is an :data:`Identifier`, else InvalidInput naming ``what``:
    the one check of a bare name (a tenant, a task id) before anything reads it."""
    if isinstance(value, str) and _IDENTIFIER.fullmatch(value):
        return value
    raise InvalidInput(
        f"{what}: {quote(value)} is not an identifier (1 to 128 of A-Z a-z 0-9 _ . : / -, "
        "starting with a letter or digit)"
    )


@functools.cache
def _field_names(model: type[BaseModel]) -> frozenset[str]:
    # Once per model class: reading model_fields on every validation costs more than
    # the check (it runs for each nested fact model of every call).
    return frozenset(model.model_fields)


class _Facts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_fields(cls, data: Any) -> Any:
        # extra="forbid" would say the same, with the whole unknown key in the message.
        if isinstance(data, dict):
            fields = _field_names(cls)
            unknown = [key for key in data if key not in fields]
            if unknown:
                names = ", ".join(quote(key, 40) for key in unknown[:3])
                more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
                raise ValueError(
                    f"unknown field(s) {names}{more}; the fields are {', '.join(cls.model_fields)}"
                )
        return data


class ConnectionStatus(StrEnum):
    """State of one tenant connection, as the connection store reports it."""

    ACTIVE = "active"
    DISABLED = "disabled"
    REVOKED = "revoked"


class Principal(_Facts):
    """Who is asking: the agent, the role it acts in, and the tenant it acts for.

    ``acts_for`` names the person an agent works for, when it works for one: the
    review policy counts a review by that person (or by another agent acting for
    them) of this agent's proposal as a self-review.
    """

    agent: Identifier
    role: Identifier
    tenant: Identifier
    acts_for: Identifier | None = None


#: How a reviewer's identity was established, as a front records it.
ReviewerKind = Literal["person", "agent", "operator"]


class Reviewer(_Facts):
    """Who gives a verdict on a proposal: an identity a front authenticated.

    ``id`` is the identity the gateway knows (a person's id from the configuration,
    an agent's name, an operator's id), the only name the review policy compares:
    the same person under two display names is one id, so still a self-review.
    ``authenticated_by`` says how the front established it (``token:<binding>``,
    ``oidc:<issuer>``, ``os-user:<name>``, or what a service that authenticated
    its users itself says), and the ledger records it with every review. No front
    takes a reviewer from a request's arguments: an identity comes from a
    credential (:mod:`capgate.adapters.fronts.people`).
    """

    id: Identifier
    role: Identifier
    tenant: Identifier
    kind: ReviewerKind = "person"
    #: The person an agent reviewer works for (as :attr:`Principal.acts_for`).
    acts_for: Identifier | None = None
    #: How people see the reviewer; never compared, never an identity.
    display_name: str | None = Field(default=None, min_length=1, max_length=200)
    authenticated_by: str = Field(min_length=1, max_length=300, pattern=r"^[\x21-\x7e]+$")

    @classmethod
    def of_agent(cls, principal: Principal, authenticated_by: str) -> Reviewer:
        """An agent principal as a reviewer (an MCP binding whose role may review)."""
        return cls(
            id=principal.agent,
            role=principal.role,
            tenant=principal.tenant,
            kind="agent",
            acts_for=principal.acts_for,
            authenticated_by=authenticated_by,
        )


class ResourceRef(_Facts):
    """A typed reference to a business object, e.g. ``{"type": "repository", "id": "R"}``."""

    type: Identifier
    id: Identifier


class Task(_Facts):
    """The task the agent works on.

    ``needs`` narrows the task type's tool list for this one task; when it is
    omitted the task type's list applies. ``linked_resources`` are the only
    subjects that subject-scoped tools may touch.
    """

    type: Identifier
    #: Which task this is. The gateway keys evidence and task budgets by it, so the
    #: gateway's entry points require it; the policies do not read it.
    id: Identifier | None = None
    needs: list[Identifier] | None = None
    linked_resources: list[ResourceRef] = Field(default_factory=list)


class ComposeInput(_Facts):
    """Input of ``capgate/compose``: which tools may this agent see now?"""

    principal: Principal
    task: Task
    connections: dict[Identifier, ConnectionStatus] = Field(default_factory=dict)
    environment: Identifier
    budget_class: Identifier
    #: Catalogue tools that run on an MCP server whose current definition of them a
    #: person has not accepted (never accepted, changed upstream since, or rejected):
    #: hidden and denied as ``tool_quarantined``. From the gateway's store (its pins of
    #: upstream definitions), never from the caller.
    quarantined: list[Identifier] = Field(default_factory=list)

    @field_validator("connections", mode="before")
    @classmethod
    def _aliases_are_names(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for alias in value:
                if not isinstance(alias, str) or not _IDENTIFIER.fullmatch(alias):
                    raise ValueError(
                        f"connection alias {quote(alias, 40)} is not a name ({_NAME_RULE})"
                    )
        return value


#: One value of a call a policy may read: a JSON scalar, bounded (see
#: :func:`capgate.gateway.enforce.arguments.values_of`), or null when absent.
CallValue = (
    StrictBool | StrictInt | StrictFloat | Annotated[str, StringConstraints(max_length=1024)] | None
)


class Call(_Facts):
    """One exact call. ``params_digest`` is computed by the dispatcher, never the agent."""

    tool: Identifier
    version: int = Field(ge=1)
    operation_id: Identifier
    subject: ResourceRef | None = None
    #: The values the contract declares (``values:``), read from the parameters by the
    #: dispatcher: what a rule on the amount or the recipient's domain compares.
    values: dict[Identifier, CallValue] = Field(default_factory=dict, max_length=64)
    params_digest: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]


class Approver(_Facts):
    """One approving review of a proposal, as the quorum counts it."""

    by: Identifier
    expires_at: AwareDatetime


class Approval(_Facts):
    """A person's approval of one operation: exact content and recipient, one tenant.

    ``digest`` binds it to the parameters (content and recipient alike),
    ``operation_id`` to one operation, whose id is also the idempotency key the tool
    receives, and ``tenant`` to the tenant it was given for. So an approval cannot be
    reused for other content, replayed as a new operation, or borrowed by another
    tenant.
    """

    kind: Identifier
    tool: Identifier
    operation_id: Identifier
    tenant: Identifier
    digest: Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
    expires_at: AwareDatetime
    approved_by: Identifier
    #: Whether the approval was already consumed by a dispatch. From the store; an
    #: approval is good for exactly one dispatch. Required, so that a gatherer that
    #: forgets it fails validation rather than sending a fresh-looking approval.
    used: bool
    #: Every approving review of the proposal (this one among them), for a contract
    #: whose quorum asks for more than one distinct reviewer: the policy counts the
    #: distinct, unexpired ones.
    approvers: list[Approver] = Field(default_factory=list, max_length=64)


class Stage(StrEnum):
    """Which step of the life cycle a call is (see docs/lifecycle.md).

    ``call`` runs a tool that needs no review; ``propose`` records a call that
    does, without running anything; ``dispatch`` runs a reviewed proposal.
    """

    CALL = "call"
    PROPOSE = "propose"
    DISPATCH = "dispatch"


class Budget(_Facts):
    """The tenant's (or task's) budget as the store has it, and what this call costs.

    ``remaining`` is None when there is no limit. The gateway reserves ``cost``
    atomically after the allow; the policy's check is the explainable early no.
    """

    remaining: int | None
    cost: int = Field(ge=0)


class OperationState(_Facts):
    """What the store knows of the call's operation id before this call.

    ``none`` (never seen) or ``retryable`` (nothing happened): this call reserves
    the cost, so the budget is checked. ``running``, ``unknown``, ``success`` or
    ``refused``: the operation's cost is held or was charged already, and this call
    waits for it, continues it (looking it up first) or returns its outcome; one
    operation is charged once.
    """

    status: Literal["none", "running", "retryable", "unknown", "success", "refused"]


class ProposalRef(_Facts):
    """The proposal a dispatch carries out, with its status in the store."""

    id: Identifier
    status: Identifier


class EvidenceSubject(_Facts):
    """What a piece of evidence is about: a call's subject (``{type: invoice, id:
    inv-9}``) or one of its declared values, typed by its kind (``{type:
    email_digest, id: sha256:...}``, ``value`` for an underived one)."""

    type: Identifier
    id: Annotated[str, StringConstraints(min_length=1, max_length=1024)]


class EvidencePiece(_Facts):
    """One piece of evidence the task has, as the store recorded it.

    ``subject`` None: about nothing in particular (evidence recorded before
    subjects existed, or by a tool without one); it meets only requirements about
    anything. ``expires_at`` None: it never expires; else the policy counts it only
    while that time is later than OPA's clock, as for approvals.
    """

    name: Identifier
    subject: EvidenceSubject | None = None
    expires_at: AwareDatetime | None = None


class ExecuteInput(ComposeInput):
    """Input of ``capgate/execute``: the compose facts plus the call and its proofs.

    Everything beyond the compose facts and the call (stage, approval, evidence,
    budget, proposal) comes from the gateway's store, never from the caller.
    """

    call: Call
    stage: Stage = Stage.CALL
    approval: Approval | None = None
    #: The names of the evidence the task has that never expires, whatever it is
    #: about: what a requirement about anything reads (the stateless path's callers
    #: pass names only).
    evidence: list[Identifier] = Field(default_factory=list)
    #: Every piece of evidence the task has, with its subject and expiry: what a
    #: requirement about the call's subject or a value reads, and a requirement about
    #: anything too (for evidence that expires).
    evidence_about: list[EvidencePiece] = Field(default_factory=list, max_length=256)
    budget: Budget | None = None
    operation: OperationState | None = None
    proposal: ProposalRef | None = None

    def to_opa(self) -> dict[str, Any]:
        """JSON-ready input; datetimes become RFC 3339 strings that OPA parses."""
        return self.model_dump(mode="json")


class ReviewProposal(_Facts):
    """What the review policy reads of a proposal."""

    id: Identifier
    tenant: Identifier
    tool: Identifier
    #: The contract version it was proposed under: the review reads that version's
    #: contract while the catalogue keeps it (``retained.yaml``), else today's.
    version: int = Field(default=1, ge=1)
    #: The proposed call's declared values (as ``Call.values``), which a quorum may
    #: depend on (two approvers above an amount).
    values: dict[Identifier, CallValue] = Field(default_factory=dict, max_length=64)
    status: Identifier
    proposer: Principal
    #: The people whose approval of the proposal stands (unexpired, as the store's
    #: clock reads it), before this review: the policy adds the reviewer's and says
    #: whether the quorum is met. The gateway records the review only while the
    #: store still holds exactly these.
    approvers: list[Identifier] = Field(default_factory=list, max_length=64)


class ReviewInput(_Facts):
    """Input of ``capgate/review``: may this reviewer give this verdict on this proposal?"""

    reviewer: Reviewer
    proposal: ReviewProposal
    verdict: Identifier

    def to_opa(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class LinkRequest(_Facts):
    """The change an agent asks for: link (or unlink) ``resource`` to the task
    ``task_id`` of its own tenant (the gateway never links in another)."""

    action: Literal["link", "unlink"]
    task_id: Identifier
    resource: ResourceRef


class LinkingTask(_Facts):
    """The task the asking agent works in, as its binding says (never an argument):
    the link policy refuses a change to that task's own links."""

    id: Identifier
    type: Identifier


class LinkInput(_Facts):
    """Input of ``capgate/link``: may this agent make this change to a task's links?"""

    principal: Principal
    #: How the front established who the agent is (``token:<binding>``, ``stdio``).
    authenticated_by: str = Field(min_length=1, max_length=300, pattern=r"^[\x21-\x7e]+$")
    task: LinkingTask
    link: LinkRequest

    def to_opa(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
