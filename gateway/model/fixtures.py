"""The representative calls of a catalogue (``fixtures.yaml``), as it declares them.

The model only: what a fixture says (a sample call, the facts it is made under, the
decision it must get). Building its execute input and asking OPA are
:mod:`capgate.gateway.catalogue.fixtures`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from capgate.gateway.model.facts import (
    ConnectionStatus,
    EvidenceSubject,
    Identifier,
    Principal,
    Stage,
    Task,
)

__all__ = ["Fixture", "FixtureEvidence", "FixtureOutcome"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FixtureEvidence(_Spec):
    """A piece of evidence the store would hold for the fixture's task."""

    name: Identifier
    subject: EvidenceSubject | None = None


class Fixture(_Spec):
    """One sample call and the decision it must get (``fixtures.yaml``)."""

    #: What it shows, in a few words: it names the fixture in every message.
    name: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    tool: Identifier
    params: dict[str, Any]
    principal: Principal
    task: Task
    environment: Identifier
    budget_class: Identifier
    #: Default: ``propose`` for a tool that needs review, else ``call``.
    stage: Stage | None = None
    #: Default: the tool's connection, active.
    connections: dict[Identifier, ConnectionStatus] | None = None
    evidence: list[FixtureEvidence] = Field(default_factory=list, max_length=64)
    #: Budget units left (None: no limit).
    budget_remaining: int | None = Field(default=None, ge=0)
    #: At ``dispatch``: the people whose approval of this exact call stands.
    approved_by: list[Identifier] = Field(default_factory=list, max_length=16)
    expect: Literal["allow", "deny"]
    #: For a deny, exactly the reason codes it gives.
    reasons: list[Identifier] = Field(default_factory=list, max_length=32)

    @model_validator(mode="after")
    def _reasons_fit(self) -> Fixture:
        if self.expect == "allow" and self.reasons:
            raise ValueError("an allowed call gives no reasons: leave 'reasons' out")
        if self.expect == "deny" and not self.reasons:
            raise ValueError("name the reason codes the denial must give in 'reasons'")
        return self

    @property
    def expected(self) -> FixtureOutcome:
        """The decision the fixture must get."""
        return FixtureOutcome(allow=self.expect == "allow", codes=tuple(sorted(set(self.reasons))))

    def holds(self, outcome: FixtureOutcome) -> bool:
        """Whether ``outcome`` is that decision: the same allow, and for a denial the
        same reason codes (a code the policy gives more than once counts once)."""
        expected = self.expected
        return (outcome.allow, set(outcome.codes)) == (expected.allow, set(expected.codes))


class FixtureOutcome(_Spec):
    """What a fixture got: the allow and the reason codes."""

    allow: bool
    codes: tuple[str, ...]

    def text(self) -> str:
        return "allowed" if self.allow else f"denied ({', '.join(self.codes)})"
