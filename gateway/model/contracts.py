"""Typed tool contracts and the catalogue that holds them.

A tool contract describes what a tool *does to the world* (its mode, the connection
and business object it touches, the evidence and approval it needs, how to recover
from an uncertain outcome), not only its call signature: two tools that share a
provider account can carry very different authority, and the policy can only tell
them apart if the contract says so.

Every model forbids unknown fields and is frozen. A typo such as ``aproval:`` must
fail loudly instead of silently leaving a tool without its approval requirement, and
a contract that was checked once must not change afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from capgate.gateway.errors import quote
from capgate.gateway.model.facts import Identifier
from capgate.gateway.model.fixtures import Fixture
from capgate.gateway.schema.load_check import check_schema

__all__ = [
    "DEFAULT_COST_UNITS",
    "ApprovalKind",
    "BudgetClassSpec",
    "Catalogue",
    "CostClass",
    "CurrencyTable",
    "Derivation",
    "Idempotency",
    "LimitSpec",
    "Mode",
    "ProducedEvidence",
    "QuorumRule",
    "RequiredEvidence",
    "RoleSpec",
    "TaskLinks",
    "TaskTypeSpec",
    "ToolContract",
    "UpstreamRef",
    "ValueSpec",
    "ValueType",
]


class Mode(StrEnum):
    """The effect a tool has, from the agent's point of view.

    ``propose_write`` prepares a change that a separate, reviewed action carries
    out; ``write`` changes the world directly. Keeping the two apart lets a policy
    grant drafting without granting dispatch.
    """

    READ = "read"
    PROPOSE_WRITE = "propose_write"
    WRITE = "write"


class ApprovalKind(StrEnum):
    """The human approval a call needs before it may run.

    ``exact_content_and_recipient`` binds the approval to the digest of the call's
    parameters, so an approved message cannot be reused for other content or
    another recipient.
    """

    NONE = "none"
    EXACT_CONTENT_AND_RECIPIENT = "exact_content_and_recipient"


class Idempotency(StrEnum):
    """What happens when the same call is sent twice.

    The dispatcher relies on it when an outcome is uncertain: an ``idempotent`` call
    may simply be retried, an ``idempotent_with_key`` call must carry the same key
    again, and a ``not_idempotent`` call must be looked up before any retry.
    """

    IDEMPOTENT = "idempotent"
    IDEMPOTENT_WITH_KEY = "idempotent_with_key"
    NOT_IDEMPOTENT = "not_idempotent"


class CostClass(StrEnum):
    """Coarse expected cost of one call, ordered ``free < low < medium < high``.

    Budget classes admit every cost class up to a ceiling, so the members compare
    by rank (not alphabetically as plain strings would). Comparing with a string
    converts it first, so ``CostClass.LOW < "high"`` holds and an unknown name
    raises ``ValueError`` instead of quietly comparing letters.
    """

    FREE = "free"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"

    @property
    def rank(self) -> int:
        """Position in the order, ``free`` being 0."""
        return list(CostClass).index(self)

    def up_to(self) -> list[CostClass]:
        """Every cost class from ``free`` up to and including this one."""
        return [c for c in CostClass if c.rank <= self.rank]

    def __lt__(self, other: str) -> bool:
        return self.rank < CostClass(other).rank

    def __le__(self, other: str) -> bool:
        return self.rank <= CostClass(other).rank

    def __gt__(self, other: str) -> bool:
        return self.rank > CostClass(other).rank

    def __ge__(self, other: str) -> bool:
        return self.rank >= CostClass(other).rank


#: Budget units a call of each cost class reserves unless its contract says ``cost``.
DEFAULT_COST_UNITS: dict[CostClass, int] = {
    CostClass.FREE: 0,
    CostClass.LOW: 1,
    CostClass.MEDIUM: 5,
    CostClass.HIGH: 20,
}


def _check_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Reject a schema that capgate would not evaluate exactly as written.

    Schemas are checked when the catalogue loads, not when the first call arrives,
    so a broken schema cannot let parameters through unchecked later. Beyond the
    2020-12 meta-schema this refuses unknown keywords, unchecked formats, patterns
    that are not ECMA-262 and references that leave the schema
    (:func:`capgate.gateway.schema.load_check.check_schema`). The contract keeps the plain copy
    that was checked.
    """
    return check_schema(schema)


#: A JSON Schema (draft 2020-12, capgate's dialect) held as a plain dict, checked on load.
JSONSchema = Annotated[dict[str, Any], AfterValidator(_check_json_schema)]

#: Free text meant for people and for the model's prompt; blank text is refused.
Description = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def _default_schema() -> dict[str, Any]:
    return {"type": "object"}


class CatalogueProblems(ValueError):
    """The cross-checks of a catalogue that failed, one message each.

    A ValueError, so pydantic reports it as the model's validation error; the
    loader reads ``problems`` from it instead of splitting the joined text, since a
    problem's own wording may contain any separator.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: A tool's name on an MCP server: MCP allows letters, digits, ``_``, ``-`` and ``.``
#: (1 to 128); ``/`` and ``:`` are accepted too, as some servers use them.
UpstreamToolName = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
]


class UpstreamRef(_Spec):
    """Where a catalogue tool runs when an MCP server provides it.

    ``server`` is the id of a configured upstream server (``MCP_SERVERS``, see
    ``docs/mcp-upstreams.md``), ``tool`` the tool's name on that server. The mapping
    is the catalogue's, so reviewed with it; what the server says about the tool
    (description, schemas, annotations) grants nothing: a person accepts each
    definition (``capgate mcp accept``) before the tool can run, and a definition
    that changes upstream is quarantined until accepted again.
    """

    server: Identifier
    tool: UpstreamToolName


class ValueType(StrEnum):
    """The JSON type of a value a policy may read; a value of another type is refused
    before OPA is asked (a boolean is never a number, as in JSON Schema)."""

    INTEGER = "integer"
    NUMBER = "number"
    STRING = "string"
    BOOLEAN = "boolean"


class Derivation(StrEnum):
    """What the gateway computes from a parameter before a policy reads it.

    ``email_domain``: the part of an email address after its last ``@``, lower-cased
    (``Ada@Example.TEST`` gives ``example.test``), so that a rule on the recipient's
    domain need not parse addresses in Rego, and one spelling is compared.
    """

    EMAIL_DOMAIN = "email_domain"
    #: ``email_digest``: the digest (``sha256:...``) of the whole address, trimmed and
    #: lower-cased, so that evidence about an address (``verified_recipient``) can be
    #: bound to one recipient without the address itself being stored or sent to OPA
    #: (:func:`capgate.gateway.digest.email_digest`).
    EMAIL_DIGEST = "email_digest"
    #: ``converted``: a numeric parameter (an amount) converted into the catalogue's
    #: base currency by its currency table (``currencies.yaml``), from the currency
    #: that the value's ``currency:`` parameter names, so that a limit or a quorum
    #: threshold compares one unit whatever currency a call is in.
    CONVERTED = "converted"


#: The value types a limit or a quorum's threshold compares.
_NUMERIC = frozenset({ValueType.INTEGER, ValueType.NUMBER})

#: The largest magnitude of a number sent to OPA: beyond 2**53 a JSON number loses
#: integers, and a limit compared against a rounded amount would be wrong.
MAX_VALUE_MAGNITUDE = 2**53


class ValueSpec(_Spec):
    """One value of a call that the policies may read (``input.call.values``).

    A contract names each value it sends, the top-level parameter it comes from, its
    type and, optionally, what is derived from it. Nothing else of the parameters
    reaches OPA (it gets their digest): a value is declared because a rule needs it,
    and reviewed with the catalogue like every other grant. An absent optional
    parameter gives ``null``.
    """

    param: Identifier
    type: ValueType
    derive: Derivation | None = None
    #: For ``derive: converted``, the parameter naming the amount's currency (a code
    #: of the catalogue's currency table); no other derivation takes one.
    currency: Identifier | None = None

    @model_validator(mode="after")
    def _derivation_fits(self) -> ValueSpec:
        if self.derive is Derivation.CONVERTED:
            if self.type not in _NUMERIC:
                raise ValueError("derive: converted gives a number (type: integer or number)")
            if self.currency is None:
                raise ValueError(
                    "derive: converted needs currency: the parameter naming the currency"
                )
        elif self.currency is not None:
            raise ValueError("currency: goes only with derive: converted")
        elif self.derive is not None and self.type is not ValueType.STRING:
            raise ValueError(f"derive: {self.derive.value} gives a string (type: string)")
        return self

    @property
    def kind(self) -> str:
        """What evidence about this value is about (the type of its subject): the
        derivation (``email_digest``), else ``value``."""
        return self.derive.value if self.derive is not None else "value"


#: ``about:`` naming the call's subject rather than one of its values.
ABOUT_SUBJECT = "subject"

#: The longest life a piece of evidence may be given: ten years.
MAX_EVIDENCE_TTL_SECONDS = 10 * 366 * 24 * 3600


def _plain_name(entry: Any) -> Any:
    """A plain name in ``produces``/``requires`` is the entry ``{name: ...}``."""
    return {"name": entry} if isinstance(entry, str) else entry


class ProducedEvidence(_Spec):
    """A piece of evidence a successful call records for its task, and what it is about.

    ``about`` absent: the call's subject (``{type: invoice, id: inv-9}``) when the
    contract has a subject type, else nothing; ``subject``: the call's subject, which
    the contract must then have; any other name: that declared value of the call
    (``values:``, a string), e.g. the digest of the verified address. ``ttl_seconds``:
    the evidence expires that long after it is recorded (expired evidence is not
    evidence); absent, it never expires. A plain name in ``produces`` is this with
    neither.
    """

    name: Identifier
    about: Identifier | None = None
    ttl_seconds: int | None = Field(default=None, ge=1, le=MAX_EVIDENCE_TTL_SECONDS, strict=True)


class RequiredEvidence(_Spec):
    """Evidence a call needs, and what it must be about.

    ``about`` absent: evidence of that name about anything (a plain name in
    ``requires`` means this, as before subjects existed); ``subject``: about the
    call's own subject; any other name: about that declared value of the call (a
    string), e.g. ``recipient_digest``. In every case only unexpired evidence counts.
    """

    name: Identifier
    about: Identifier | None = None


class LimitSpec(_Spec):
    """The most a numeric value may be in one call, for some roles or for all.

    ``roles`` absent: every role the tool grants. A call over a limit that applies to
    its role is denied with ``value_over_limit``, one reason per limit it exceeds;
    a value that is null (an absent optional parameter) is never over a limit.
    """

    value: Identifier
    # Strict: a YAML "5000" (a string) is a typo, not a limit.
    max: Annotated[StrictInt | StrictFloat, Field(ge=-MAX_VALUE_MAGNITUDE, le=MAX_VALUE_MAGNITUDE)]
    roles: list[Identifier] | None = Field(default=None, min_length=1)


class QuorumRule(_Spec):
    """How many distinct reviewers must approve a call, always or above a value.

    ``value`` and ``above`` together: the rule applies to a call whose value is over
    ``above`` (a value that is not a number applies it too: a malformed fact never
    lowers a quorum); neither: it always applies. The quorum of a call is the
    largest ``approvals`` of the rules that apply, else one.
    """

    approvals: int = Field(ge=2, le=10, strict=True)
    value: Identifier | None = None
    above: Annotated[
        StrictInt | StrictFloat | None,
        Field(default=None, ge=-MAX_VALUE_MAGNITUDE, le=MAX_VALUE_MAGNITUDE),
    ] = None

    @model_validator(mode="after")
    def _value_and_threshold_together(self) -> QuorumRule:
        if (self.value is None) != (self.above is None):
            raise ValueError("value and above go together (or neither, for every call)")
        return self


#: A currency code as ISO 4217 writes them: three capital letters.
CurrencyCode = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]

#: A conversion rate: how many units of the base currency one unit is worth.
Rate = Annotated[StrictInt | StrictFloat, Field(gt=0, le=1_000_000)]


class CurrencyTable(_Spec):
    """The rates a ``derive: converted`` value is converted by (``currencies.yaml``).

    ``base`` is the currency limits and quorum thresholds are written in; ``rates``
    says what one unit of each other currency is worth in it. The rate multiplies the
    number as the call gives it, so amounts in minor units (cents) stay in minor
    units; a currency whose minor unit differs (yen have none) takes a rate that
    says so. A currency the table does not name is refused before OPA is asked:
    an amount that cannot be converted cannot be compared with a limit.
    """

    base: CurrencyCode
    rates: dict[CurrencyCode, Rate] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _base_is_one(self) -> CurrencyTable:
        if self.base in self.rates and self.rates[self.base] != 1:
            raise ValueError(f"rates[{self.base!r}]: the base currency's rate is 1")
        return self

    def rate(self, currency: str) -> int | float | None:
        """What one unit of ``currency`` is worth in the base; None if unknown."""
        return 1 if currency == self.base else self.rates.get(currency)


class ToolContract(_Spec):
    """Everything the policy and the dispatcher need to know about one tool.

    The policy reads the authority fields (mode, roles, connection, subject,
    evidence, approval, environments, cost); the dispatcher reads the operational
    ones (schemas, idempotency, recovery); the description goes into the prompt.
    """

    name: Identifier
    # Strict: a YAML "1" or 1.5 is a typo, not a version.
    version: int = Field(ge=1, strict=True)
    description: Description
    mode: Mode
    roles: list[Identifier] = Field(min_length=1)
    #: The tenant connection the tool acts through; ``None`` for pure functions.
    connection_alias: Identifier | None
    #: The business object type a call must name; ``None`` when it acts on none.
    subject_type: Identifier | None
    #: The parameter that holds the subject's id; ``None`` means ``<subject_type>_id``.
    #: The dispatcher reads the subject from the parameters, so the object the
    #: policy checks is the object the tool touches.
    subject_param: Identifier | None = None
    #: The evidence a call needs (:class:`RequiredEvidence`; a plain name is evidence
    #: of that name about anything).
    requires: list[RequiredEvidence] = Field(default_factory=list)
    approval: ApprovalKind = ApprovalKind.NONE
    # validate_default: the propose_write rule must also run when the key is absent.
    execution_action: Identifier | None = Field(default=None, validate_default=True)
    recovery: Identifier
    idempotency: Idempotency
    cost_class: CostClass
    input_schema: JSONSchema = Field(default_factory=_default_schema)
    output_schema: JSONSchema = Field(default_factory=_default_schema)
    environments: list[Identifier] = Field(min_length=1)
    #: Evidence the gateway records for the task when a call (or the dispatch of a
    #: proposal) of this tool succeeds (:class:`ProducedEvidence`; a plain name is
    #: about the call's subject, if it has one, and never expires); other tools may
    #: ``require`` it.
    produces: list[ProducedEvidence] = Field(default_factory=list)
    #: Budget units one call reserves; ``None`` means the cost class's default
    #: (:data:`DEFAULT_COST_UNITS`), unless ``cost_value`` names a value to count.
    cost: int | None = Field(default=None, ge=0, le=1_000_000_000, strict=True)
    #: The values of a call the policies may read (:class:`ValueSpec`), by name.
    values: dict[Identifier, ValueSpec] = Field(default_factory=dict)
    #: Limits on numeric values (:class:`LimitSpec`), checked by the execute policy.
    limits: list[LimitSpec] = Field(default_factory=list)
    #: An integer value whose amount is the call's cost in budget units (an amount in
    #: cents, say), instead of a fixed cost: a budget then counts money, not calls.
    cost_value: Identifier | None = None
    #: How many distinct reviewers must approve a call (:class:`QuorumRule`); one
    #: unless a rule applies. Only for a tool whose calls are reviewed.
    quorum: list[QuorumRule] = Field(default_factory=list)
    #: The output field holding the provider's receipt (e.g. ``payment_id``). When
    #: set, a result without a non-empty string there is not a success: a loose
    #: output schema cannot pass a provider's failure off as one.
    receipt_field: Identifier | None = None
    #: Roles whose members may review this tool's proposals (each must also hold
    #: the approval kind, see RoleSpec.approves). Required when the tool needs
    #: review, so that, say, a sales manager who approves quotes cannot approve a
    #: payment merely because both need the same kind of approval.
    reviewers: list[Identifier] = Field(default_factory=list)
    #: The MCP server tool that runs this contract (run by ``capgate.adapters.tools.mcp``), or None
    #: for a tool some other adapter runs. Never part of the compiled policy data: the
    #: policy learns whether the upstream definition is accepted from the
    #: ``quarantined`` fact.
    upstream: UpstreamRef | None = None

    @field_validator("requires", "produces", mode="before")
    @classmethod
    def _plain_names(cls, value: Any) -> Any:
        return [_plain_name(entry) for entry in value] if isinstance(value, list) else value

    @field_validator("execution_action")
    @classmethod
    def _proposal_names_its_executor(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A proposal is only safe if the action that later carries it out is a
        # separate, reviewed thing; without a name there is nothing to review.
        if value is None and info.data.get("mode") is Mode.PROPOSE_WRITE:
            raise ValueError(
                "a propose_write tool must name the reviewed action that executes "
                "the proposal (execution_action)"
            )
        return value

    @model_validator(mode="after")
    def _proposals_are_reviewed(self) -> ToolContract:
        # A proposal exists to be reviewed: one that needs no approval would be a
        # write by another name, dispatched without anyone looking at it.
        if self.mode is Mode.PROPOSE_WRITE and self.approval is ApprovalKind.NONE:
            raise ValueError(
                "a propose_write tool must name the approval its proposals need "
                "(approval: exact_content_and_recipient)"
            )
        if self.receipt_field is not None and self.mode is Mode.READ:
            raise ValueError("a read tool has no provider receipt (receipt_field)")
        if self.needs_review and not self.reviewers:
            raise ValueError(
                "a tool whose calls are reviewed must name the roles that may review "
                "them (reviewers)"
            )
        if self.reviewers and not self.needs_review:
            raise ValueError("reviewers: this tool's calls are never reviewed")
        self._check_values()
        self._check_evidence()
        return self

    def _check_evidence(self) -> None:
        """Each piece of evidence named once, about the subject only if there is one,
        and about a value only if it is a declared string value."""
        entries: list[tuple[str, int, ProducedEvidence | RequiredEvidence]] = [
            ("produces", position, entry) for position, entry in enumerate(self.produces)
        ]
        entries += [("requires", position, entry) for position, entry in enumerate(self.requires)]
        seen: set[tuple[str, str]] = set()
        for field, position, entry in entries:
            where = f"{field}[{position}]"
            if (field, entry.name) in seen:
                raise ValueError(f"{where}: evidence {quote(entry.name)} is listed twice")
            seen.add((field, entry.name))
            if entry.about is None:
                continue
            if entry.about == ABOUT_SUBJECT:
                if self.subject_type is None:
                    raise ValueError(
                        f"{where}.about: tool {quote(self.name)} has no subject (subject_type)"
                    )
                continue
            spec = self.values.get(entry.about)
            if spec is None:
                raise ValueError(
                    f"{where}.about: {quote(entry.about)} is neither 'subject' nor one "
                    "of the values (declare it under values)"
                )
            if spec.type is not ValueType.STRING:
                raise ValueError(
                    f"{where}.about: value {quote(entry.about)} is a {spec.type.value}; "
                    "evidence is about a string value"
                )

    def evidence_kind(self, about: str | None) -> str | None:
        """The type of the subject of evidence about ``about`` in a call of this tool:
        the subject type, a value's kind (:attr:`ValueSpec.kind`), or None for
        evidence about nothing."""
        if about is None:
            return None
        if about == ABOUT_SUBJECT:
            return self.subject_type
        return self.values[about].kind

    def produced_about(self, evidence: ProducedEvidence) -> str | None:
        """What ``evidence`` of this tool is about: ``subject``, a value, or None."""
        if evidence.about is None and self.subject_type is not None:
            return ABOUT_SUBJECT
        return evidence.about

    @property
    def produced_names(self) -> list[str]:
        """The names of the evidence this tool produces."""
        return [evidence.name for evidence in self.produces]

    @property
    def required_names(self) -> list[str]:
        """The names of the evidence this tool requires."""
        return [evidence.name for evidence in self.requires]

    def _check_values(self) -> None:
        """Each value from a parameter the input schema has; each limit and the cost
        value on a declared value of the right type."""
        properties = self.input_schema.get("properties")
        for name, declared in self.values.items():
            for field, param in (("param", declared.param), ("currency", declared.currency)):
                if isinstance(properties, dict) and param is not None and param not in properties:
                    raise ValueError(
                        f"values[{quote(name)}].{field}: parameter {quote(param)} is not in "
                        "the input schema's properties"
                    )
        for position, limit in enumerate(self.limits):
            spec = self.values.get(limit.value)
            if spec is None:
                raise ValueError(
                    f"limits[{position}]: {quote(limit.value)} is not one of the values "
                    "(declare it under values)"
                )
            if spec.type not in _NUMERIC:
                raise ValueError(
                    f"limits[{position}]: value {quote(limit.value)} is a {spec.type.value}; "
                    "a limit applies to an integer or a number"
                )
            for role in limit.roles or ():
                if role not in self.roles:
                    raise ValueError(
                        f"limits[{position}].roles: tool {quote(self.name)} does not grant "
                        f"role {quote(role)}"
                    )
        if self.quorum and not self.needs_review:
            raise ValueError("quorum: this tool's calls are never reviewed")
        for position, rule in enumerate(self.quorum):
            if rule.value is None:
                continue
            known = self.values.get(rule.value)
            if known is None or known.type not in _NUMERIC:
                raise ValueError(
                    f"quorum[{position}]: {quote(rule.value)} must be one of the values, "
                    "an integer or a number"
                )
        if self.cost_value is not None:
            counted = self.values.get(self.cost_value)
            if counted is None or counted.type is not ValueType.INTEGER:
                raise ValueError(
                    f"cost_value: {quote(self.cost_value)} must be one of the values, of "
                    "type integer"
                )
            if self.cost is not None:
                raise ValueError("cost and cost_value: give one (a fixed cost or a counted value)")

    @property
    def needs_review(self) -> bool:
        """Whether a call becomes a proposal that a person reviews before dispatch."""
        return self.mode is Mode.PROPOSE_WRITE or self.approval is not ApprovalKind.NONE

    @property
    def dispatch_action(self) -> str:
        """The runnable name a reviewed proposal dispatches: the execution action, or
        the tool itself for a write tool that needs approval."""
        return self.execution_action or self.name

    @property
    def cost_units(self) -> int:
        """Budget units one call reserves, when the cost is fixed (for a cost counted
        from a value, :meth:`cost_of` the call's values; this is then 0)."""
        if self.cost_value is not None:
            return 0
        return DEFAULT_COST_UNITS[self.cost_class] if self.cost is None else self.cost

    def cost_of(self, values: Mapping[str, Any]) -> int:
        """Budget units this call reserves: the fixed cost, or the ``cost_value``
        (an absent optional one counts 0; a negative one is refused before, by
        :func:`~capgate.gateway.enforce.arguments.values_of`)."""
        if self.cost_value is None:
            return self.cost_units
        counted = values.get(self.cost_value)
        return counted if isinstance(counted, int) and not isinstance(counted, bool) else 0


class RoleSpec(_Spec):
    """A role an agent (or a person reviewing proposals) can act in.

    Tools grant themselves to roles by name. ``approves`` lists the approval kinds
    someone in this role may give when reviewing a proposal; the review policy
    reads it, and a role without it approves nothing. ``links`` lists the resource
    types an agent in this role may link to (or unlink from) another task than its
    own, over MCP (``capgate.tasks.link``); the link policy reads it, and a role
    without it links nothing.
    """

    description: Description
    approves: list[ApprovalKind] = Field(default_factory=list)
    links: list[Identifier] = Field(default_factory=list, max_length=64)

    @field_validator("approves")
    @classmethod
    def _approves_something_real(cls, kinds: list[ApprovalKind]) -> list[ApprovalKind]:
        if ApprovalKind.NONE in kinds:
            raise ValueError("'none' is not an approval a reviewer can give")
        return kinds


class TaskLinks(StrEnum):
    """Where a task's linked resources come from."""

    #: The request's ``task.linked_resources``, as the caller (a service, a
    #: binding's configuration) asserts them.
    REQUEST = "request"
    #: The links the gateway recorded for the task (``capgate tasks link``); a
    #: request's own list may only narrow them.
    RECORDED = "recorded"


class TaskTypeSpec(_Spec):
    """A kind of task and the tools it may need; the ceiling of what a task sees."""

    description: Description
    tools: list[Identifier] = Field(default_factory=list)
    links: TaskLinks = TaskLinks.REQUEST


class BudgetClassSpec(_Spec):
    """A spending tier: it admits every cost class up to ``max_cost_class``."""

    description: Description
    max_cost_class: CostClass

    @property
    def admitted(self) -> list[CostClass]:
        """The cost classes this budget class admits, cheapest first."""
        return self.max_cost_class.up_to()

    def admits(self, cost_class: CostClass) -> bool:
        """Whether a tool of ``cost_class`` fits within this budget class."""
        return cost_class <= self.max_cost_class


class Catalogue(_Spec):
    """The whole, cross-checked catalogue: tools, roles, task types, budget classes.

    A ``Catalogue`` is always internally consistent: every tool is filed under its
    own name, every role a tool grants exists and every tool a task type lists
    exists. :func:`capgate.gateway.catalogue.load_catalogue` reports the same problems
    per file; the check here also guards catalogues built in code.
    """

    tools: dict[Identifier, ToolContract]
    roles: dict[Identifier, RoleSpec]
    task_types: dict[Identifier, TaskTypeSpec]
    budget_classes: dict[Identifier, BudgetClassSpec]
    #: The currency table of ``derive: converted`` values; None when none is needed.
    currencies: CurrencyTable | None = None
    #: Earlier versions of reviewed tools, kept for the proposals made under them
    #: (``retained.yaml``): by tool name, then version. A proposal dispatches under
    #: the version it was proposed and approved under while it is kept here.
    retained: dict[Identifier, dict[int, ToolContract]] = Field(default_factory=dict)
    #: Sample calls with the decisions they must get (``fixtures.yaml``): asked of
    #: OPA before the catalogue is served, and by ``capgate diff``. Not policy data.
    fixtures: list[Fixture] = Field(default_factory=list, max_length=1000)

    @model_validator(mode="after")
    def _references_resolve(self) -> Catalogue:
        problems = [
            f"tools[{quote(key)}] holds the contract of {quote(tool.name)}"
            for key, tool in self.tools.items()
            if key != tool.name
        ]
        problems += [
            f"tool {quote(tool.name)} grants unknown role {quote(role)}"
            for tool in self.tools.values()
            for role in tool.roles
            if role not in self.roles
        ]
        problems += [
            f"task type {quote(name)} lists unknown tool {quote(tool)}"
            for name, spec in self.task_types.items()
            for tool in spec.tools
            if tool not in self.tools
        ]
        problems += self._review_problems() + self._evidence_problems()
        problems += self._upstream_problems() + self._currency_problems()
        problems += self._retained_problems()
        problems += [
            f"fixture {quote(fixture.name, 80)}: field 'tool': unknown tool {quote(fixture.tool)}"
            for fixture in self.fixtures
            if fixture.tool not in self.tools
        ]
        if problems:
            raise CatalogueProblems(problems)
        return self

    def _reviewer_problems(self, tool: ToolContract, where: str) -> list[str]:
        """Each reviewer role of ``tool`` is declared and approves its kind of approval
        (``where`` names the contract: today's, or a kept version)."""
        problems = []
        for position, role in enumerate(tool.reviewers):
            field = f"{where}: field 'reviewers[{position}]'"
            spec = self.roles.get(role)
            if spec is None:
                problems.append(f"{field}: unknown role {quote(role)}")
            elif tool.approval not in spec.approves:
                problems.append(
                    f"{field}: role {quote(role)} does not approve "
                    f"{tool.approval.value!r} (add it to the role's approves)"
                )
        return problems

    def _review_problems(self) -> list[str]:
        problems = []
        for tool in self.tools.values():
            problems += self._reviewer_problems(tool, f"tool {quote(tool.name)}")
            if tool.needs_review and tool.execution_action in self.tools:
                problems.append(
                    f"tool {quote(tool.name)}: field 'execution_action': "
                    f"{quote(tool.execution_action)} is an agent-facing tool; an "
                    "execution action is run only for a reviewed proposal"
                )
        return problems

    def _evidence_problems(self) -> list[str]:
        # The gateway records evidence only when a tool that produces it succeeds, so
        # a requirement nothing produces could never be met: almost always a typo. A
        # requirement about something must have a producer about the same kind of
        # thing (an invoice, an email digest): evidence about a contact can never be
        # about an invoice.
        kinds: dict[str, set[str | None]] = {}
        for tool in self.tools.values():
            for produced in tool.produces:
                kind = tool.evidence_kind(tool.produced_about(produced))
                kinds.setdefault(produced.name, set()).add(kind)
        problems = []
        for tool in self.tools.values():
            for position, required in enumerate(tool.requires):
                where = f"tool {quote(tool.name)}: field 'requires[{position}]'"
                if required.name not in kinds:
                    problems.append(
                        f"{where}: no tool produces evidence {quote(required.name)} (list it "
                        "in some tool's produces)"
                    )
                    continue
                kind = tool.evidence_kind(required.about)
                if kind is not None and kind not in kinds[required.name]:
                    problems.append(
                        f"{where}: no tool produces evidence {quote(required.name)} about a "
                        f"{quote(kind)} (what requires[{position}].about is)"
                    )
        return problems

    def _currency_problems(self) -> list[str]:
        # A converted value without a table could never be computed: every call of
        # its tool would be refused. Said at load instead.
        if self.currencies is not None:
            return []
        return [
            f"tool {quote(tool.name)}: field 'values.{name}': derive: converted needs the "
            "catalogue's currency table (currencies.yaml)"
            for tool in self.tools.values()
            for name, spec in sorted(tool.values.items())
            if spec.derive is Derivation.CONVERTED
        ]

    def _upstream_problems(self) -> list[str]:
        # One contract per upstream tool: acceptance maps an upstream definition to
        # exactly one contract, so two contracts there would share one review.
        seen: dict[tuple[str, str], str] = {}
        problems = []
        for tool in self.tools.values():
            if tool.upstream is None:
                continue
            key = (tool.upstream.server, tool.upstream.tool)
            if key in seen:
                problems.append(
                    f"tool {quote(tool.name)}: field 'upstream': tool {quote(key[1])} of server "
                    f"{quote(key[0])} already runs tool {quote(seen[key])}"
                )
            else:
                seen[key] = tool.name
        return problems

    def _retained_problems(self) -> list[str]:
        # A kept version stands for proposals made under it: of a tool the catalogue
        # has, one that is reviewed (only proposals wait), older than today's, and
        # under the same roles' rules as any contract.
        problems = []
        for name, versions in self.retained.items():
            current = self.tools.get(name)
            for version, kept in versions.items():
                where = f"retained tool {quote(name)} version {version}"
                if kept.name != name or kept.version != version:
                    problems.append(f"{where} holds the contract of {quote(kept.name)} "
                                    f"version {kept.version}")  # fmt: skip
                elif current is None:
                    problems.append(f"{where}: tools.yaml has no tool {quote(name)} to keep "
                                    "an earlier version of")  # fmt: skip
                elif version >= current.version:
                    problems.append(
                        f"{where}: field 'version': a kept version is older than the "
                        f"catalogue's, version {current.version}"
                    )
                elif not kept.needs_review:
                    problems.append(
                        f"{where}: only a reviewed tool's versions are kept (its proposals "
                        "wait for their dispatch; a direct call never does)"
                    )
                problems += [
                    f"{where}: field 'roles[{position}]': unknown role {quote(role)}"
                    for position, role in enumerate(kept.roles)
                    if role not in self.roles
                ]
                problems += self._reviewer_problems(kept, where)
        return problems

    def contract_at(self, name: str, version: int | None) -> ToolContract | None:
        """The contract of tool ``name`` at ``version``: today's, or a kept one; today's
        for a version the catalogue does not keep (whose calls the policy denies as
        ``version_mismatch``), and None for a tool it does not have."""
        current = self.tools.get(name)
        if current is None or version is None or version == current.version:
            return current
        return self.retained.get(name, {}).get(version, current)

    def upstream_tools(self) -> dict[str, ToolContract]:
        """The contracts an MCP server runs, by name."""
        return {name: t for name, t in sorted(self.tools.items()) if t.upstream is not None}

    def runnable_names(self) -> set[str]:
        """Every name an adapter may run: the tools and their execution actions."""
        kept = {t.dispatch_action for versions in self.retained.values() for t in versions.values()}
        return set(self.tools) | {t.dispatch_action for t in self.tools.values()} | kept

    def tool(self, name: str) -> ToolContract:
        """The contract of tool ``name``; ``KeyError`` naming it if there is none."""
        try:
            return self.tools[name]
        except KeyError:
            raise KeyError(f"unknown tool {quote(name)}") from None

    def task_tools(self, task_type: str) -> list[ToolContract]:
        """The contracts a task type lists, in its order; ``KeyError`` if unknown."""
        try:
            spec = self.task_types[task_type]
        except KeyError:
            raise KeyError(f"unknown task type {quote(task_type)}") from None
        return [self.tools[name] for name in spec.tools]

    def tools_for_role(self, role: str) -> list[ToolContract]:
        """The contracts that grant ``role``, sorted by name (role check only)."""
        return [t for _, t in sorted(self.tools.items()) if role in t.roles]
