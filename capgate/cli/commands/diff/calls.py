"""The execute questions ``capgate diff`` asks of the tools both sides show.

In every scenario with all connections active, each tool visible at both sides is
called (:data:`CALL_VARIANTS`): once as a complete call (the stage its review needs,
a matching approval of an approved proposal, the evidence it requires, a linked
subject, budget to spare), then with one thing wrong (no approval, a used one, one
for other parameters, a pending proposal, no review, evidence missing, an unlinked
subject, too little budget, another version). A variant that does not apply to one
side's contract is that side's complete call, so a requirement dropped from a
contract shows as a call denied -> allowed. Over ``--call-limit`` calls, a sample is
drawn with ``--seed``. ``--no-calls`` skips this.

A module of its own because the calls are built from the compose answers and each
side's contracts, not from the matrix alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from capgate.cli.commands.diff.matrix import Matrix, Scenario
from capgate.cli.commands.diff.sides import Side
from capgate.gateway.digest import digest_of
from capgate.gateway.model.contracts import ABOUT_SUBJECT, ToolContract
from capgate.gateway.model.facts import ExecuteInput

__all__ = ["CALL_VARIANTS", "Ask", "call_input", "calls_to_ask"]

#: The calls asked of each tool visible at both sides, with every connection active:
#: a complete call (the stage its review needs, a matching unused approval of an
#: approved proposal, the evidence it requires, a subject linked to the task, budget
#: to spare, its version), then that call with one thing wrong. A variant that does
#: not apply to a side's contract (evidence missing, for a tool that requires none)
#: is the complete call there, so a requirement dropped shows as denied -> allowed.
CALL_VARIANTS: Final = (
    "complete",
    "no approval",
    "approval used",
    "approval of other parameters",
    "proposal pending",
    "called without review",
    "evidence missing",
    "subject not linked",
    "budget short",
    "other version",
)

_SUBJECT_ID: Final = "capgate-diff-subject"
_OPERATION: Final = "capgate-diff-operation"
_VALUE: Final = "capgate-diff-value"
_DIGEST: Final = digest_of(b"{}")


def _applies(contract: ToolContract, variant: str) -> bool:
    if variant in {
        "no approval",
        "approval used",
        "approval of other parameters",
        "proposal pending",
        "called without review",
    }:
        return contract.needs_review
    if variant == "evidence missing":
        return bool(contract.requires)
    if variant == "subject not linked":
        return contract.subject_type is not None
    if variant == "budget short":
        return contract.cost_units > 0
    return True


def call_input(
    matrix: Matrix, scenario: Scenario, contract: ToolContract, variant: str, now: datetime
) -> dict[str, Any]:
    """The execute input of ``variant`` of a call of ``contract`` in ``scenario``."""
    wrong = variant if _applies(contract, variant) else "complete"
    facts = matrix.compose_input(scenario)
    subject = None
    if contract.subject_type is not None:
        facts["task"]["linked_resources"] = [{"type": contract.subject_type, "id": _SUBJECT_ID}]
        subject = {
            "type": contract.subject_type,
            "id": "not-linked" if wrong == "subject not linked" else _SUBJECT_ID,
        }
    reviewed = contract.needs_review
    approval: dict[str, Any] | None = None
    if reviewed and wrong not in {"no approval", "called without review"}:
        approval = {
            "kind": contract.approval.value,
            "tool": contract.name,
            "operation_id": _OPERATION,
            "tenant": facts["principal"]["tenant"],
            "digest": digest_of(b"[]") if wrong == "approval of other parameters" else _DIGEST,
            "expires_at": now + timedelta(hours=1),
            "approved_by": "capgate-diff",
            "used": wrong == "approval used",
        }
    cost = contract.cost_units
    # Evidence about the call's subject or a value of it: the complete call brings a
    # piece about exactly that.
    values: dict[str, Any] = {}
    pieces = []
    for required in contract.requires:
        if required.about is None:
            continue
        if required.about == ABOUT_SUBJECT:
            about = {"type": contract.subject_type, "id": _SUBJECT_ID}
        else:
            values[required.about] = _VALUE
            about = {"type": contract.evidence_kind(required.about), "id": _VALUE}
        pieces.append({"name": required.name, "subject": about})
    call = ExecuteInput.model_validate(
        {
            **facts,
            "call": {
                "tool": contract.name,
                "version": contract.version + (1 if wrong == "other version" else 0),
                "operation_id": _OPERATION,
                "subject": subject,
                "values": values,
                "params_digest": _DIGEST,
            },
            "stage": "dispatch" if reviewed and wrong != "called without review" else "call",
            "approval": approval,
            "proposal": {
                "id": "capgate-diff-proposal",
                "status": "pending" if wrong == "proposal pending" else "approved",
            }
            if reviewed
            else None,
            "evidence": [] if wrong == "evidence missing" else contract.required_names,
            "evidence_about": [] if wrong == "evidence missing" else pieces,
            "budget": {"remaining": cost - 1 if wrong == "budget short" else None, "cost": cost},
            "operation": {"status": "none"},
        }
    )
    return call.to_opa()


@dataclass(frozen=True, slots=True)
class Ask:
    """One call asked of both sides: the scenario (by index), the tool, the variant."""

    scenario: int
    tool: str
    variant: str


def calls_to_ask(
    base: Side, head: Side, scenarios: Sequence[Scenario], limit: int, seed: int
) -> tuple[list[Ask], int]:
    """Every variant of every tool visible at both sides in the scenarios with every
    connection active, or ``limit`` of them drawn with ``seed``; and how many there were."""
    asks = [
        Ask(index, tool, variant)
        for index, scenario in enumerate(scenarios)
        if scenario.connections == "all active"
        for tool in sorted(base.results[index][0] & head.results[index][0])
        if tool in base.catalogue.tools and tool in head.catalogue.tools
        for variant in CALL_VARIANTS
        if _applies(base.catalogue.tools[tool], variant)
        or _applies(head.catalogue.tools[tool], variant)
    ]
    if len(asks) <= limit:
        return asks, len(asks)
    draw = random.Random(seed)  # noqa: S311 (a reproducible sample, not a secret)
    return [asks[i] for i in sorted(draw.sample(range(len(asks)), limit))], len(asks)
