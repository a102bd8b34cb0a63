"""Whether an answer from OPA can be obeyed: the checks between a decision and a run.

OPA decides; Python does not re-answer the policy's questions. But an answer must
also fit what this process knows, the catalogue it loaded and the call it asked
about, before anything acts on it. A decision that does not fit means OPA and this
process disagree (another catalogue, a policy bug, an impostor), and then neither
is trusted: the answer is refused.

The :class:`~capgate.gateway.enforce.dispatcher.Dispatcher` and ``capgate eval`` both run
exactly these functions, so what the command line shows as an allow is what the
dispatcher would run, and the two cannot drift apart.

``verify_compose``
    every tool named (visible or excluded) is in the catalogue, and no tool is both
    visible and excluded, or visible twice.
``verify_execute``
    a deny raises :class:`~capgate.gateway.errors.CapabilityViolation`; an allow must carry
    no reasons, name a tool of the catalogue at its catalogue version, and carry
    exactly the obligations the tool's contract requires (:func:`required_obligations`),
    nothing missing, extra, repeated or altered. It returns the :class:`Grant` the
    dispatcher runs under.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

from capgate.gateway.errors import (
    CapabilityViolation,
    ObligationUnsupported,
    PolicyUnavailable,
    quote,
)
from capgate.gateway.model.contracts import Catalogue, Idempotency, ToolContract
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision, Obligation, Reason
from capgate.gateway.model.facts import ExecuteInput, Stage

__all__ = [
    "KNOWN_OBLIGATIONS",
    "PASS_IDEMPOTENCY_KEY",
    "Grant",
    "required_obligations",
    "verify_compose",
    "verify_execute",
]

#: The obligation that hands the call's operation id to the tool as its idempotency key.
PASS_IDEMPOTENCY_KEY: Final = "pass_idempotency_key"  # noqa: S105 - a code, not a secret
#: Every obligation code this dispatcher knows how to keep.
KNOWN_OBLIGATIONS: Final = frozenset({PASS_IDEMPOTENCY_KEY})


@dataclass(frozen=True, slots=True)
class Grant:
    """An allow that passed every check: the contract it runs under and what to keep."""

    contract: ToolContract
    operation_id: str
    #: The key the adapter must pass to the provider, or None when none is required.
    idempotency_key: str | None
    decision_id: str | None


def required_obligations(
    contract: ToolContract, operation_id: str, stage: Stage = Stage.CALL
) -> list[dict[str, Any]]:
    """The obligations an allow of this call must carry, derived from the contract.

    An ``idempotent_with_key`` tool must receive the operation id as its idempotency
    key when it runs (stages ``call`` and ``dispatch``); proposing runs nothing and
    carries none. Written as OPA writes them, so they compare directly.
    """
    if stage is Stage.PROPOSE:
        return []
    if contract.idempotency is Idempotency.IDEMPOTENT_WITH_KEY:
        return [{"code": PASS_IDEMPOTENCY_KEY, "params": {"key": operation_id}}]
    return []


def verify_compose(catalogue: Catalogue, decision: ComposeDecision) -> None:
    """Refuse (PolicyUnavailable) a compose answer that does not fit the catalogue."""
    if not isinstance(decision, ComposeDecision):
        raise PolicyUnavailable(
            f"the policy answered compose with a {type(decision).__name__}, not a ComposeDecision"
        )
    named = [*decision.visible, *decision.excluded]
    strangers = sorted({name for name in named if name not in catalogue.tools})
    if strangers:
        # OPA and this process disagree about the catalogue: trust neither.
        raise PolicyUnavailable(
            f"OPA named tools this dispatcher's catalogue lacks: {_names(strangers)}"
        )
    both = sorted(set(decision.visible) & set(decision.excluded))
    if both:
        raise PolicyUnavailable(
            f"OPA made tools both visible and excluded: {_names(both)}; refusing the answer"
        )
    twice = sorted(name for name, count in Counter(decision.visible).items() if count > 1)
    if twice:
        raise PolicyUnavailable(f"OPA made tools visible more than once: {_names(twice)}")


def verify_execute(catalogue: Catalogue, request: ExecuteInput, decision: ExecuteDecision) -> Grant:
    """The grant for an allow that fits the catalogue and the call; raise otherwise.

    Raises CapabilityViolation for a deny, PolicyUnavailable for an allow that
    contradicts itself or the catalogue, and ObligationUnsupported for an allow
    whose obligations are not exactly :func:`required_obligations`.
    """
    tool = request.call.tool
    if not isinstance(decision, ExecuteDecision):
        raise PolicyUnavailable(
            f"the policy answered execute with a {type(decision).__name__}, not an ExecuteDecision"
        )
    if not decision.allow:
        raise CapabilityViolation(tool, decision.reasons, decision_id=decision.decision_id)
    if decision.reasons:
        # An allow that also gives reasons contradicts the policy contract: refuse
        # rather than guess which half was meant.
        raise PolicyUnavailable(
            f"OPA returned an inconsistent allow for {quote(tool)}: it also gives reasons"
        )
    contract = catalogue.contract_at(tool, request.call.version)
    if contract is None:
        raise PolicyUnavailable(
            f"OPA returned an inconsistent allow for {quote(tool)}: "
            "the tool is not in this dispatcher's catalogue"
        )
    if request.call.version != contract.version:
        raise PolicyUnavailable(
            f"OPA returned an inconsistent allow for {quote(tool)}: the call names version "
            f"{request.call.version}, the catalogue's contract is version {contract.version}"
        )
    if contract is not catalogue.tools[tool] and request.stage is not Stage.DISPATCH:
        # A kept version stands for proposals in flight only; anything new is made
        # under today's contract.
        raise PolicyUnavailable(
            f"OPA returned an inconsistent allow for {quote(tool)}: version "
            f"{request.call.version} is kept for dispatches only, not at stage {request.stage}"
        )
    operation_id = request.call.operation_id
    problems = _obligation_problems(contract, operation_id, request.stage, decision.obligations)
    if problems:
        reasons = [Reason(code="obligation_unsupported", message=p) for p in problems]
        raise ObligationUnsupported(tool, reasons, decision_id=decision.decision_id)
    key = operation_id if required_obligations(contract, operation_id, request.stage) else None
    return Grant(
        contract=contract,
        operation_id=operation_id,
        idempotency_key=key,
        decision_id=decision.decision_id,
    )


def _obligation_problems(
    contract: ToolContract, operation_id: str, stage: Stage, obligations: list[Obligation]
) -> list[str]:
    """What differs between the allow's obligations and the contract's, one line each."""
    required = {o["code"]: o["params"] for o in required_obligations(contract, operation_id, stage)}
    problems: list[str] = []
    counts = Counter(o.code for o in obligations)
    for code, count in sorted(counts.items()):
        if code not in KNOWN_OBLIGATIONS:
            problems.append(f"obligation {quote(code, 40)} is not one this dispatcher knows")
        elif code not in required:
            problems.append(
                f"obligation {quote(code, 40)} is not required by the contract of "
                f"{quote(contract.name)} (idempotency: {contract.idempotency.value})"
            )
        elif count > 1:
            problems.append(f"obligation {quote(code, 40)} is given {count} times, not once")
    for code in sorted(set(required) - set(counts)):
        problems.append(
            f"obligation {quote(code, 40)} is missing; the contract of {quote(contract.name)} "
            f"requires it (idempotency: {contract.idempotency.value})"
        )
    for obligation in obligations:
        want = required.get(obligation.code)
        if want is not None and counts[obligation.code] == 1 and not _same(obligation.params, want):
            problems.append(
                f"obligation {quote(obligation.code, 40)} must have exactly the params "
                f"{{'key': <the call's operation_id>}}; the allow gives other params"
            )
    return problems


def _same(given: object, want: dict[str, Any]) -> bool:
    """Equal as JSON: ``True`` is not ``1``, and ``1.0`` is not ``"1"``."""
    try:
        return json.dumps(given, sort_keys=True) == json.dumps(want, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return False


def _names(names: list[str]) -> str:
    shown = ", ".join(quote(n, 60) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
