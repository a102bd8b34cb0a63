"""Typed decisions read back from OPA.

The policy client validates every answer against these models; anything that does
not fit raises :class:`gateway.errors.PolicyUnavailable`, so a malformed decision can
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

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ATTACHED_FIELDS",
    "MAX_PARAMS_DEPTH",
    "ComposeDecision",
    "ExecuteDecision",
    "Obligation",
    "Reason",
    "ReviewDecision",
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
    """Answer of ``capgate/compose``: the visible tools and why each other tool is not."""

    visible: list[str]
    excluded: dict[str, list[Reason]]

    def reasons_for(self, tool: str) -> list[str]:
        """Sorted reason codes that hid ``tool`` (empty when it is visible)."""
        return sorted(r.code for r in self.excluded.get(tool, []))


class ExecuteDecision(_Provenance):
    """Answer of ``capgate/execute`` for one exact call."""

    allow: bool
    reasons: list[Reason]
    obligations: list[Obligation]

    @property
    def reason_codes(self) -> list[str]:
        return sorted(r.code for r in self.reasons)


class ReviewDecision(_Provenance):
    """Answer of ``capgate/review``: may this reviewer give this verdict on this proposal?"""

    allow: bool
    reasons: list[Reason]

    @property
    def reason_codes(self) -> list[str]:
        return sorted(r.code for r in self.reasons)
