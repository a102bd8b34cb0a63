"""A decider that stands in for OPA in unit tests, and decisions built for it.

The decision models grow fields over time (the catalogue digest a decision was
made under, OPA's provenance). ``execute_decision`` and ``compose_decision`` fill
in whatever the models currently require and the dispatcher does not look at, so
these tests state only what they are about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capgate.gateway.model.decisions import (
    ComposeDecision,
    ExecuteDecision,
    Obligation,
    Reason,
    ReviewDecision,
)
from capgate.gateway.model.facts import ComposeInput, ExecuteInput, ReviewInput, Stage

#: Any well-formed digest; the dispatcher leaves checking it to the policy client.
SOME_DIGEST = "sha256:" + "0" * 64


def _provenance(model: type[Any], fields: dict[str, Any]) -> dict[str, Any]:
    if "catalogue_digest" in model.model_fields:
        fields.setdefault("catalogue_digest", SOME_DIGEST)
    return fields


def execute_decision(
    allow: bool = True,
    reasons: list[Reason] | None = None,
    obligations: list[Obligation] | None = None,
    **fields: Any,
) -> ExecuteDecision:
    fields.update(allow=allow, reasons=reasons or [], obligations=obligations or [])
    return ExecuteDecision.model_validate(_provenance(ExecuteDecision, fields))


def compose_decision(
    visible: list[str], excluded: dict[str, list[Reason]] | None = None, **fields: Any
) -> ComposeDecision:
    fields.update(visible=visible, excluded=excluded or {})
    return ComposeDecision.model_validate(_provenance(ComposeDecision, fields))


def review_decision(
    allow: bool = True, reasons: list[Reason] | None = None, **fields: Any
) -> ReviewDecision:
    """A review answer; an allow meets its quorum unless ``quorum_met`` says not (as
    OPA answers for a tool with no quorum rule)."""
    fields.setdefault("quorum_met", allow and not reasons)
    fields.update(allow=allow, reasons=reasons or [])
    return ReviewDecision.model_validate(_provenance(ReviewDecision, fields))


def key_obligation(key: str) -> Obligation:
    return Obligation(code="pass_idempotency_key", params={"key": key})


@dataclass
class ScriptedDecider:
    """Answers with fixed decisions and records every input it was asked about.

    ``execute_answer`` may also be a function of the input, for answers that depend
    on the call (the idempotency key is the call's operation id). ``review_answer``
    (default: an allow) answers the gateway's review question.
    """

    execute_answer: Any = None
    compose_answer: Any = None
    review_answer: Any = None
    asked: list[ExecuteInput] = field(default_factory=list)
    composed: list[ComposeInput] = field(default_factory=list)
    reviewed: list[ReviewInput] = field(default_factory=list)
    error: BaseException | None = None

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        self.composed.append(facts)
        if self.error is not None:
            raise self.error
        if self.compose_answer is None:
            return compose_decision(["contact.read"])
        answer: ComposeDecision = self.compose_answer
        return answer

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        self.asked.append(facts)
        if self.error is not None:
            raise self.error
        answer = self.execute_answer
        if answer is None:
            return keyed_allow(facts)
        if callable(answer):
            answer = answer(facts)
        decision: ExecuteDecision = answer
        return decision

    def review(self, facts: ReviewInput) -> ReviewDecision:
        self.reviewed.append(facts)
        if self.error is not None:
            raise self.error
        answer = self.review_answer
        if answer is None:
            return review_decision(decision_id="r-1")
        if callable(answer):
            answer = answer(facts)
        decision: ReviewDecision = answer
        return decision


def keyed_allow(facts: ExecuteInput) -> ExecuteDecision:
    """The allow OPA gives a call: with the key obligation exactly when the contract
    of the demo catalogue says so (the sales tools with ``idempotent_with_key``), at
    the stages that run something (a proposal carries none)."""
    keyed = {"quote.prepare_send", "payment.execute"}
    runs = facts.stage is not Stage.PROPOSE
    obligations = (
        [key_obligation(facts.call.operation_id)] if runs and facts.call.tool in keyed else []
    )
    return execute_decision(obligations=obligations, decision_id="d-1")
