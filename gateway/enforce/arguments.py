"""A call's arguments, checked before anything is asked: nothing malformed reaches OPA.

The facts a caller (or the gateway) hands over are validated again from a plain dump
(a model built with ``model_construct`` skipped validation); the evidence names, the
approval, and the parameters against the tool's input schema are checked here, and
the subject the policy judges is read from the parameters themselves. Every problem
is an :class:`~capgate.gateway.errors.InvalidInput` naming the field and the rule,
never the value (parameters may hold secrets).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Final

from jsonschema.protocols import Validator
from pydantic import ValidationError

from capgate.gateway.digest import email_digest
from capgate.gateway.errors import InvalidInput, cut, quote
from capgate.gateway.model.contracts import (
    MAX_VALUE_MAGNITUDE,
    CurrencyTable,
    Derivation,
    ToolContract,
    ValueSpec,
    ValueType,
)
from capgate.gateway.model.facts import Approval, ComposeInput, EvidencePiece

__all__ = [
    "MAX_EVIDENCE",
    "Schemas",
    "Unevaluable",
    "checked_approval",
    "checked_evidence",
    "checked_facts",
    "checked_pieces",
    "dumped_facts",
    "schema_problem",
    "subject_of",
    "validate_params",
    "values_of",
]

_COMPOSE_FIELDS: Final = frozenset(ComposeInput.model_fields)
#: Evidence names accepted per call; a contract requires a handful.
MAX_EVIDENCE: Final = 256
#: The longest string value sent to OPA: a rule compares a domain or a code, never
#: a text, and an input bounded in size stays cheap to evaluate.
MAX_VALUE_CHARS: Final = 1024
#: Schema errors collected before giving up on listing them all.
_MAX_ERRORS: Final = 100


def checked_facts(facts: object) -> ComposeInput:
    """The facts as a validated ComposeInput, whatever model object was passed.

    Always validated again, from a plain dump: a ComposeInput made with pydantic's
    ``model_construct`` or ``model_copy(update=...)`` skipped validation, and a
    richer model (an ExecuteInput) is cut down to the compose fields. Dumping
    without serialisation warnings: those would quote the fact values.
    """
    try:
        return ComposeInput.model_validate(dumped_facts(facts))
    except ValidationError as exc:
        raise InvalidInput.from_validation(exc, "facts") from None


def dumped_facts(facts: object) -> dict[str, Any]:
    """The compose fields of ``facts`` as plain data, to be validated by the caller."""
    if not isinstance(facts, ComposeInput):
        raise InvalidInput(f"facts must be a ComposeInput, not a {type(facts).__name__}")
    try:
        return facts.model_dump(include=set(_COMPOSE_FIELDS), warnings=False)
    except Exception as exc:  # a field holding something that cannot be dumped at all
        raise InvalidInput(f"facts could not be read ({type(exc).__name__})") from None


def checked_approval(approval: object) -> Approval | None:
    if approval is None or isinstance(approval, Approval):
        return approval
    raise InvalidInput(f"approval must be an Approval or None, not a {type(approval).__name__}")


def checked_evidence(evidence: object) -> list[str]:
    """The evidence names as a list of strings, or InvalidInput.

    A single string is refused: iterating it would present its letters as evidence.
    """
    if isinstance(evidence, str | bytes) or not isinstance(evidence, Iterable):
        raise InvalidInput(
            f"evidence must be a collection of names, not a {type(evidence).__name__}"
        )
    try:
        names = list(itertools.islice(evidence, MAX_EVIDENCE + 1))
    except Exception as exc:  # the caller's own iterable failed
        raise InvalidInput(f"evidence could not be read ({type(exc).__name__})") from None
    if len(names) > MAX_EVIDENCE:
        raise InvalidInput(f"evidence: more than the limit of {MAX_EVIDENCE} names")
    for position, name in enumerate(names):
        if not isinstance(name, str):
            raise InvalidInput(
                f"evidence[{position}] must be a name (a string), not a {type(name).__name__}"
            )
    return [str.__str__(name) for name in names]


def checked_pieces(pieces: object) -> list[dict[str, Any]]:
    """The pieces of evidence (:class:`EvidencePiece`), dumped to be validated again
    with the rest of the input, or InvalidInput; at most :data:`MAX_EVIDENCE`."""
    if isinstance(pieces, str | bytes | Mapping) or not isinstance(pieces, Iterable):
        raise InvalidInput(
            f"evidence_about must be a collection of EvidencePiece, not a {type(pieces).__name__}"
        )
    try:
        listed = list(itertools.islice(pieces, MAX_EVIDENCE + 1))
    except Exception as exc:  # the caller's own iterable failed
        raise InvalidInput(f"evidence_about could not be read ({type(exc).__name__})") from None
    if len(listed) > MAX_EVIDENCE:
        raise InvalidInput(f"evidence_about: more than the limit of {MAX_EVIDENCE} pieces")
    dumped = []
    for position, piece in enumerate(listed):
        if not isinstance(piece, EvidencePiece):
            raise InvalidInput(
                f"evidence_about[{position}] must be an EvidencePiece, not a {type(piece).__name__}"
            )
        dumped.append(piece.model_dump(warnings=False))
    return dumped


@dataclass(frozen=True, slots=True)
class Schemas:
    input: Validator
    output: Validator


def schema_problem(validator: Validator, value: Any) -> str | None:
    """Where ``value`` breaks the schema and which rule it breaks, or None.

    Names the path and the schema keyword only: jsonschema's own messages quote the
    offending value, and parameters or tool output may hold secrets. The keywords
    capgate implements itself (``required``, ``additionalProperties``,
    ``unevaluatedProperties``, ``pattern``, ``format``) word their messages without
    values, so those are shown. Raises Unevaluable if the schema itself cannot be
    evaluated (a stack too deep for it, or a reference gone wrong).
    """
    try:
        errors = list(itertools.islice(validator.iter_errors(value), _MAX_ERRORS))
    except RecursionError:
        raise Unevaluable("too deeply nested for the schema to be evaluated") from None
    except Exception as exc:  # e.g. an unresolvable $ref that escaped the load checks
        raise Unevaluable(f"the schema could not be evaluated ({type(exc).__name__})") from None
    if not errors:
        return None
    errors.sort(key=lambda e: [str(p) for p in e.absolute_path])
    first = errors[0]
    where = quote("/".join(str(p) for p in first.absolute_path) or "(top level)")
    rule = first.validator
    if rule == "required":
        required = first.validator_value if isinstance(first.validator_value, list) else []
        instance = first.instance if isinstance(first.instance, dict) else {}
        missing = [name for name in required if name not in instance]
        detail = "missing required field(s) " + ", ".join(quote(m, 40) for m in missing[:5])
    elif rule in {"additionalProperties", "unevaluatedProperties", "pattern", "format"}:
        detail = cut(first.message, 200)  # our own wording: names and rules only
    else:
        detail = f"fails the schema's {quote(str(rule), 40)} rule"
    count = len(errors)
    more = ""
    if count > 1:
        more = f" (and {'more than ' if count >= _MAX_ERRORS else ''}{count - 1} more problem(s))"
    return f"{where}: {detail}{more}"


class Unevaluable(Exception):
    """The schema could not be evaluated on this value; the message holds no values."""


def validate_params(contract: ToolContract, validator: Validator, params: dict[str, Any]) -> None:
    try:
        problem = schema_problem(validator, params)
    except Unevaluable as exc:
        raise InvalidInput(f"tool {quote(contract.name)}: parameters: {exc}") from None
    if problem is not None:
        raise InvalidInput(f"tool {quote(contract.name)}: parameter {problem}")


def subject_of(contract: ToolContract, params: Mapping[str, Any]) -> dict[str, str] | None:
    """The business object the call acts on, read from the parameters themselves.

    Deriving it from the parameters (not from a separate argument) means the subject
    the policy checks is the one the tool will actually touch.
    """
    if contract.subject_type is None:
        return None
    field = contract.subject_param or f"{contract.subject_type}_id"
    value = params.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidInput(
            f"tool {quote(contract.name)}: parameter {quote(field)} must name "
            f"the {contract.subject_type}"
        )
    return {"type": contract.subject_type, "id": value}


def values_of(
    contract: ToolContract,
    params: Mapping[str, Any],
    currencies: CurrencyTable | None = None,
) -> dict[str, Any]:
    """The values the contract declares (``values:``), read and derived from the
    parameters (already validated against the input schema), for ``input.call.values``.

    Only declared values go, each checked against its declared type here, so that a
    loose input schema cannot send a policy a string where it compares a number; an
    absent parameter gives None. Raises InvalidInput naming the value and the
    parameter, never the parameter's content.
    """
    values: dict[str, Any] = {}
    for name, spec in sorted(contract.values.items()):
        where = f"tool {quote(contract.name)}: value {quote(name)} (parameter {quote(spec.param)})"
        raw = params.get(spec.param)
        if raw is None:
            values[name] = None
            continue
        if not _is_type(raw, spec.type):
            raise InvalidInput(f"{where} must be of type {spec.type.value}")
        if spec.type is ValueType.INTEGER and isinstance(raw, float):
            raw = int(raw)  # 5.0 is the integer 5, as in JSON Schema
        if spec.derive is Derivation.CONVERTED:
            raw = _converted(raw, spec, params, currencies, where)
        elif spec.derive is not None:  # both other derivations read an email address
            local, at, domain = str(raw).rpartition("@")
            if not at or not local or not domain:
                raise InvalidInput(f"{where} must be an email address (name@domain)")
            raw = (
                domain.lower() if spec.derive is Derivation.EMAIL_DOMAIN else email_digest(str(raw))
            )
        if isinstance(raw, str) and len(raw) > MAX_VALUE_CHARS:
            raise InvalidInput(f"{where} must be at most {MAX_VALUE_CHARS} characters")
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            if not -MAX_VALUE_MAGNITUDE <= raw <= MAX_VALUE_MAGNITUDE:
                raise InvalidInput(f"{where} must be at most 2**53 in magnitude")
            if name == contract.cost_value and raw < 0:
                raise InvalidInput(f"{where} is the call's cost and must not be negative")
        values[name] = raw
    return values


def _converted(
    amount: int | float,
    spec: ValueSpec,
    params: Mapping[str, Any],
    currencies: CurrencyTable | None,
    where: str,
) -> int | float:
    """``amount`` in the base currency, by the table's rate for the currency the
    call names. Decimal arithmetic on the numbers as written, so that 0.1 of a rate
    is a tenth, and an integer value is rounded half to even (as accountants round)
    back to an integer. An unknown or absent currency is refused: a limit cannot be
    compared with an amount of unknown worth."""
    currency = params.get(spec.currency or "")
    rate = (
        currencies.rate(currency) if currencies is not None and isinstance(currency, str) else None
    )
    if rate is None:  # the code itself is the caller's text, not repeated
        raise InvalidInput(
            f"{where}: the currency its parameter {quote(spec.currency or '')} names has no "
            "rate in the catalogue's currency table"
        )
    product = Decimal(str(amount)) * Decimal(str(rate))
    if spec.type is ValueType.INTEGER:
        return int(product.to_integral_value(rounding=ROUND_HALF_EVEN))
    return float(product)


def _is_type(value: Any, kind: ValueType) -> bool:
    if kind is ValueType.BOOLEAN:
        return isinstance(value, bool)
    if isinstance(value, bool):  # JSON Schema's rule: a boolean is not a number
        return False
    if kind is ValueType.INTEGER:
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind is ValueType.NUMBER:
        return isinstance(value, int | float) and value == value  # NaN is no number
    return isinstance(value, str)
