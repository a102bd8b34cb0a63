"""Running an authorised call, and reading what came back as an Outcome.

The tool has been entered from here on: whatever happens is an
:class:`~capgate.gateway.model.outcomes.Outcome`, never an exception. The adapter's
signals (refused, retryable, unknown) map to their statuses; any other failure of a
tool that changes the world is unknown (only the adapter can say nothing happened).
Output is untrusted: copied within the output limits, checked against the output
schema and the contract's receipt field, and returned as data, never interpreted;
output that breaks any of that is an unknown outcome.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from jsonschema.protocols import Validator

from capgate.gateway.digest import MAX_OUTPUT_BYTES, plain_json
from capgate.gateway.enforce.arguments import Unevaluable, schema_problem
from capgate.gateway.enforce.verify import Grant
from capgate.gateway.errors import InvalidInput, cut, quote
from capgate.gateway.model.contracts import Mode, ToolContract
from capgate.gateway.model.outcomes import (
    Outcome,
    OutcomeStatus,
    ToolRefused,
    ToolRetryable,
    ToolUnknown,
)
from capgate.gateway.tools.contract import Adapter, CallContext

__all__ = ["MAX_ERROR_TEXT", "error_text", "interpret", "outcome_of", "retry_after", "run_tool"]

#: Characters of a tool's own error text kept in an Outcome.
MAX_ERROR_TEXT: Final = 2000
#: The longest wait a tool may ask for; a provider asking for more is asked again later.
_MAX_RETRY_AFTER_SECONDS = 86_400.0


def retry_after(value: object) -> float | None:
    """The tool's suggested wait, if it is a usable number of seconds.

    A tool's exception is untrusted output like its result: a wait that is not a
    finite, non-negative number (NaN, infinity, a string) is dropped rather than
    allowed to break the outcome's record after the tool already ran.
    """
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return min(float(value), _MAX_RETRY_AFTER_SECONDS)


def outcome_of(
    contract: ToolContract, grant: Grant, status: OutcomeStatus, **fields: Any
) -> Outcome:
    return Outcome(
        tool=contract.name,
        version=contract.version,
        operation_id=grant.operation_id,
        status=status,
        decision_id=grant.decision_id,
        **fields,
    )


def run_tool(
    adapter: Adapter,
    action: str,
    contract: ToolContract,
    output_validator: Validator,
    params: dict[str, Any],
    context: CallContext,
    grant: Grant,
) -> Outcome:
    try:
        raw = adapter.run(action, params, context)
    except ToolRefused as exc:
        return outcome_of(contract, grant, OutcomeStatus.REFUSED, error=error_text(exc))
    except ToolRetryable as exc:
        return outcome_of(
            contract,
            grant,
            OutcomeStatus.RETRYABLE,
            error=error_text(exc),
            retry_after_seconds=retry_after(exc.retry_after_seconds),
        )
    except ToolUnknown as exc:  # the request may have left: say so, never guess
        return outcome_of(
            contract,
            grant,
            OutcomeStatus.UNKNOWN,
            error=error_text(exc),
            recovery=contract.recovery,
            retry_after_seconds=retry_after(getattr(exc, "retry_after_seconds", None)),
        )
    except Exception as exc:  # the tool's own failure: contain it, never crash the agent
        # Only the adapter can say "nothing happened" (ToolRetryable). Any other
        # failure of a tool that changes the world (a timeout, a crash half-way) may
        # have come after its effect: unknown, looked up before any retry, its budget
        # still held. Idempotency does not make it retryable: an agent that repeats
        # it without the operation id sends again under a new key, and a retryable
        # outcome would hand back the budget of a spend that happened. A read has no
        # effect to lose, so it may simply be tried again.
        status = OutcomeStatus.RETRYABLE if contract.mode is Mode.READ else OutcomeStatus.UNKNOWN
        error = f"{type(exc).__name__}: {error_text(exc)}"
        return outcome_of(contract, grant, status, error=error, recovery=contract.recovery)
    return interpret(contract, output_validator, raw, grant)


def interpret(
    contract: ToolContract, output_validator: Validator, raw: object, grant: Grant
) -> Outcome:
    """The outcome of a result the tool (or a lookup) returned.

    The tool has run: whatever goes wrong here must still be an Outcome with the
    recovery procedure, because the external effect may have happened. A contract
    with a ``receipt_field`` is a success only with a non-empty receipt there.
    """
    try:
        result = _checked_output(output_validator, raw)
    except _BadOutput as exc:
        return outcome_of(
            contract, grant, OutcomeStatus.UNKNOWN, error=str(exc), recovery=contract.recovery
        )
    receipt = None
    if contract.receipt_field is not None:
        receipt = result.get(contract.receipt_field)
        if not isinstance(receipt, str) or not receipt:
            return outcome_of(
                contract,
                grant,
                OutcomeStatus.UNKNOWN,
                error=f"tool output has no provider receipt in {quote(contract.receipt_field)}",
                recovery=contract.recovery,
            )
        receipt = cut(receipt, 256)
    return outcome_of(
        contract, grant, OutcomeStatus.SUCCESS, result=result, provider_receipt=receipt
    )


def error_text(exc: BaseException) -> str:
    """``str(exc)`` cut to :data:`MAX_ERROR_TEXT`, even when ``__str__`` itself fails."""
    try:
        text = str(exc)
    except Exception:
        return f"<{type(exc).__name__} with an unprintable message>"
    return cut(text, MAX_ERROR_TEXT)


class _BadOutput(Exception):
    """Tool output that breaks the contract; the message holds no output values."""


def _checked_output(validator: Validator, raw: object) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _BadOutput(f"tool returned {type(raw).__name__}, not a JSON object")
    try:
        if not isinstance(raw, dict):
            raw = dict(raw.items())
        result: dict[str, Any] = plain_json(raw, what="tool output", max_bytes=MAX_OUTPUT_BYTES)
    except InvalidInput as exc:
        raise _BadOutput(str(exc)) from None
    except Exception as exc:  # the tool's own Mapping class failed while being read
        raise _BadOutput(f"tool output could not be read ({type(exc).__name__})") from None
    try:
        problem = schema_problem(validator, result)
    except Unevaluable as exc:
        raise _BadOutput(f"tool output: {exc}") from None
    if problem is not None:
        raise _BadOutput(f"tool output breaks its schema at {problem}")
    return result
