"""Typed decisions read back from OPA.

The policy client validates every answer against these models; anything that does
not fit raises :class:`capgate.gateway.errors.PolicyUnavailable`, so a malformed decision can
never be read as an allow.

Each decision also says what it was made under. ``catalogue_digest`` is set by the
policy itself (from ``data.capgate.catalogue.meta.digest``), so it travels inside
the very document that allows or denies, and an OPA that lost or swapped the
catalogue cannot answer without showing it. ``decision_id``, ``bundle_revisions``
and ``opa_version`` come from OPA's envelope around the result and are attached by
the client; a policy that set them itself would be refused.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ATTACHED_FIELDS",
    "MAX_PARAMS_DEPTH",
    "Check",
    "ComposeDecision",
    "ComposeExplanation",
    "ExecuteDecision",
    "ExecuteExplanation",
    "LinkDecision",
    "Obligation",
    "Reason",
    "ReviewDecision",
    "ToolExplanation",
    "policy_revision",
]

#: Fields the client fills from OPA's answer envelope, never from the policy's result.
ATTACHED_FIELDS: Final = ("decision_id", "bundle_revisions", "opa_version")

#: How deeply an obligation's ``params`` may nest. The only obligation known today is
#: one level deep; the limit keeps a hostile answer from reaching code (logging,
#: ``json.dumps``, the CLI) that would recurse past Python's stack limit.
MAX_PARAMS_DEPTH: Final = 32

# The catalogue digest as gateway.catalogue.compile writes it. A pattern, not just a
# non-empty string: error messages quote a mismatching digest, and this keeps
# whatever else an impostor might send out of them.
_DIGEST_PATTERN: Final = r"^sha256:[0-9a-f]{64}$"


class _Decision(BaseModel):
    # Strict: OPA must send exactly the types the policy promises (no "true" for true).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Reason(_Decision):
    """One deny reason: a stable ``code`` to match on and a ``message`` for people."""

    code: str = Field(min_length=1)
    message: str


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value, iteratively: it must not recurse itself."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: list[Any] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        if deepest > MAX_PARAMS_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


class Obligation(_Decision):
    """A condition attached to an allow that the dispatcher must carry out."""

    code: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _not_too_deep(cls, params: dict[str, Any]) -> dict[str, Any]:
        if _depth(params) > MAX_PARAMS_DEPTH:
            raise ValueError(f"params nest deeper than {MAX_PARAMS_DEPTH} levels")
        return params


class _Provenance(_Decision):
    """What a decision was made under; see the module docstring."""

    #: The digest of the compiled catalogue the policy read, set by the policy.
    catalogue_digest: str = Field(pattern=_DIGEST_PATTERN)
    #: OPA's decision id (None when OPA runs without decision logging).
    decision_id: str | None = None
    #: Revision of every bundle OPA had activated, by bundle name, from OPA's
    #: ``provenance``; a bundle without a revision maps to "".
    bundle_revisions: dict[str, str] = Field(default_factory=dict)
    #: The OPA version that answered, from OPA's ``provenance``.
    opa_version: str | None = None


class ComposeDecision(_Provenance):
    """Answer of ``capgate/compose``: the tools this agent may see.

    OPA answers with ``visible`` (and the digest) only. ``excluded`` holds, for every
    other tool, the reasons that hide it, and is filled only when the caller asked
    for reasons (``compose(facts, reasons=True)``), from ``capgate/explain/compose``
    with messages rendered by :mod:`capgate.gateway.model.reasons`; otherwise it is empty.
    """

    visible: list[str]
    excluded: dict[str, list[Reason]] = Field(default_factory=dict)

    def reasons_for(self, tool: str) -> list[str]:
        """Sorted reason codes that hid ``tool``: empty when it is visible, or when the
        decision was asked for without reasons."""
        return sorted(r.code for r in self.excluded.get(tool, []))


class Check(_Decision):
    """One check of an explanation: did it pass, its reason code if not, what it read."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)

    check: str = Field(min_length=1)
    #: ``pass`` in OPA's answer (a Python keyword, hence the name).
    passed: bool = Field(alias="pass")
    code: str | None
    facts: dict[str, Any]

    @field_validator("facts")
    @classmethod
    def _not_too_deep(cls, facts: dict[str, Any]) -> dict[str, Any]:
        if _depth(facts) > MAX_PARAMS_DEPTH:
            raise ValueError(f"facts nest deeper than {MAX_PARAMS_DEPTH} levels")
        return facts

    @model_validator(mode="after")
    def _code_iff_failed(self) -> Check:
        if self.passed != (self.code is None) or self.code == "":
            raise ValueError("a check has a reason code exactly when it fails")
        return self


def _all_pass(checks: list[Check]) -> bool:
    return all(check.passed for check in checks)


class ToolExplanation(_Decision):
    """One tool in ``capgate/explain/compose``: its verdict and every check behind it."""

    visible: bool
    checks: list[Check]

    @model_validator(mode="after")
    def _verdict_is_the_checks(self) -> ToolExplanation:
        if not self.checks or self.visible != _all_pass(self.checks):
            raise ValueError("visible must be true exactly when every check passes")
        return self


class ComposeExplanation(_Provenance):
    """Answer of ``capgate/explain/compose``: every tool, check by check."""

    #: The message template of every compose reason code, as the policies declare it:
    #: what :mod:`capgate.gateway.model.reasons` renders the reasons from.
    templates: dict[str, str]
    tools: dict[str, ToolExplanation]

    @property
    def visible(self) -> list[str]:
        """The names explain calls visible, sorted."""
        return sorted(name for name, tool in self.tools.items() if tool.visible)


class ExecuteExplanation(_Provenance):
    """Answer of ``capgate/explain/execute``: execute's allow and every check behind it."""

    allow: bool
    checks: list[Check]

    @model_validator(mode="after")
    def _verdict_is_the_checks(self) -> ExecuteExplanation:
        if not self.checks or self.allow != _all_pass(self.checks):
            raise ValueError("allow must be true exactly when every check passes")
        return self


class ExecuteDecision(_Provenance):
    """Answer of ``capgate/execute`` for one exact call."""

    allow: bool
    reasons: list[Reason]
    obligations: list[Obligation]

    @property
    def reason_codes(self) -> list[str]:
        return sorted(r.code for r in self.reasons)


class ReviewDecision(_Provenance):
    """Answer of ``capgate/review``: may this reviewer give this verdict on this proposal?

    ``approvals_required`` is how many distinct reviewers must approve the proposal
    before it is approved (its contract's quorum, from the proposal's values), and
    ``quorum_met`` whether they have, this verdict counted: the policy decides it,
    and an approval it does not complete is recorded while the proposal stays
    pending. False unless said: an answer that omits it never approves.
    """

    allow: bool
    reasons: list[Reason]
    approvals_required: int = Field(default=1, ge=1, le=64)
    quorum_met: bool = False

    @property
    def reason_codes(self) -> list[str]:
        return sorted(r.code for r in self.reasons)


class LinkDecision(_Provenance):
    """Answer of ``capgate/link``: may this agent change this task's links?"""

    allow: bool
    reasons: list[Reason]

    @property
    def reason_codes(self) -> list[str]:
        return sorted(r.code for r in self.reasons)


def policy_revision(revisions: object) -> str | None:
    """The policy revision a decision was made under, for traces and the ledger.

    The non-empty bundle revisions OPA reported, sorted and joined by commas. Bundle
    *names* are left out: for an embedded OPA they are temporary folder paths,
    which differ on every start and say nothing about the policy.
    """
    if not isinstance(revisions, dict):
        return None
    shown = sorted({rev for rev in revisions.values() if isinstance(rev, str) and rev})
    return ",".join(shown) or None
