"""Typed decisions read back from OPA.

The policy client validates every answer against these models; anything that does
not fit raises :class:`gateway.errors.PolicyUnavailable`, so a malformed decision can
never be read as an allow.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ComposeDecision", "ExecuteDecision", "Obligation", "Reason"]


class _Decision(BaseModel):
    # Strict: OPA must send exactly the types the policy promises (no "true" for true).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Reason(_Decision):
    """One deny reason: a stable ``code`` to match on and a ``message`` for people."""

    code: str = Field(min_length=1)
    message: str


class Obligation(_Decision):
    """A condition attached to an allow that the dispatcher must carry out."""

    code: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class ComposeDecision(_Decision):
    """Answer of ``capgate/compose``: the visible tools and why each other tool is not."""

    visible: list[str]
    excluded: dict[str, list[Reason]]
    decision_id: str | None = None

    def reasons_for(self, tool: str) -> list[str]:
        """Sorted reason codes that hid ``tool`` (empty when it is visible)."""
        return sorted(r.code for r in self.excluded.get(tool, []))


class ExecuteDecision(_Decision):
    """Answer of ``capgate/execute`` for one exact call."""

    allow: bool
    reasons: list[Reason]
    obligations: list[Obligation]
    decision_id: str | None = None

    @property
    def reason_codes(self) -> list[str]:
        return sorted(r.code for r in self.reasons)
