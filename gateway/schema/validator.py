"""capgate's call-time JSON Schema validator: draft 2020-12, where what a schema says is
what passes.

Tool schemas are part of the security boundary (a ``pattern`` on an IBAN, a
``format: email`` on a recipient), so the validator must not be looser than the
schema reads. Stock jsonschema is, in two ways this module closes (the load-time
checks in :mod:`capgate.gateway.schema.load_check` close the others):

1. **Patterns are ECMA-262.** JSON Schema defines ``pattern`` and
   ``patternProperties`` as ECMA-262 regular expressions; Python's :mod:`re` is
   another dialect, in which ``^[A-Z]{3}$`` accepts ``"EUR\\n"`` (``$`` matches
   before a final newline) and ``\\d`` matches Arabic-Indic digits. Here both
   keywords, and ``additionalProperties`` and ``unevaluatedProperties`` (which
   decide what ``patternProperties`` covered), run on ``regress``, a Rust ECMA-262
   engine, with the ``u`` flag.
2. **Formats are checked strictly.** jsonschema's own ``email`` check is
   ``"@" in value``, and formats it has no checker for pass silently. capgate checks
   the formats in :data:`capgate.gateway.schema.formats.FORMATS` with its own code,
   and fails closed on any other (which the load-time checks refuse first).

:func:`schema_validator` builds the validator the enforcement step uses for input
and output alike (:class:`SchemaValidator`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import jsonschema
import referencing
import regress
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from capgate.gateway.errors import quote
from capgate.gateway.schema.dialect import IN_PLACE_LISTS
from capgate.gateway.schema.formats import FORMATS, compile_ecma_regex

__all__ = ["FORMAT_CHECKER", "SchemaValidator", "schema_validator"]


# --------------------------------------------------------------------- patterns


_COMPILED: dict[str, regress.Regex] = {}


def _regex(pattern: str) -> regress.Regex:
    """The compiled ECMA-262 pattern, cached: the same few patterns run on every call."""
    compiled = _COMPILED.get(pattern)
    if compiled is None:
        compiled = compile_ecma_regex(pattern)
        if len(_COMPILED) < 4096:
            _COMPILED[pattern] = compiled
    return compiled


def _search(pattern: str, text: str) -> bool:
    """Whether ECMA-262 ``pattern`` matches anywhere in ``text`` (unanchored, as JSON
    Schema says). A text the engine cannot read fails closed, as a non-match."""
    try:
        return _regex(pattern).find(text) is not None
    except UnicodeError:  # pragma: no cover - plain_json refuses lone surrogates first
        return False


# ------------------------------------------------------- keyword implementations
# Messages name the rule, never the instance: parameters and output may hold secrets.


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"does not match the schema's pattern {quote(pattern)}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """The keys neither ``properties`` nor (ECMA-262) ``patternProperties`` cover."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        key
        for key in instance
        if key not in properties and not any(_search(p, key) for p in patterns)
    ]


def _listed(keys: list[str]) -> str:
    shown = ", ".join(quote(k, 40) for k in sorted(keys)[:5])
    return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        yield ValidationError(f"unexpected field(s) {_listed(extras)}; the schema allows no others")


def _evaluated_keys(validator: Any, instance: Any, schema: Any) -> set[str]:
    """The keys of ``instance`` that ``schema`` evaluates, for ``unevaluatedProperties``.

    jsonschema's own version (``_utils.find_evaluated_property_keys_by_schema``)
    matches ``patternProperties`` with Python's :mod:`re`; this is the same walk with
    ECMA-262 patterns. It follows ``$ref`` through the validator's resolver, as
    jsonschema's does (``_resolver`` is private to jsonschema: revisit on upgrade;
    the unevaluatedProperties tests fail loudly if it changes).
    """
    if validator.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    for keyword in ("$ref", "$dynamicRef"):
        ref = schema.get(keyword)
        if ref is not None:
            resolved = validator._resolver.lookup(ref)  # jsonschema-private; see above
            evolved = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(evolved, instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        subschema = schema.get(keyword)
        if subschema is not None:
            keys |= {
                key
                for key, value in instance.items()
                if next(validator.descend(value, subschema), None) is None
            }
    for pattern in schema.get("patternProperties", {}):
        keys |= {key for key in instance if _search(pattern, key)}
    for name, subschema in schema.get("dependentSchemas", {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, subschema)
    for keyword in IN_PLACE_LISTS:
        for subschema in schema.get(keyword, []):
            if next(validator.descend(instance, subschema), None) is None:
                keys |= _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(
    validator: Any, unevaluated: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    failing = [
        key
        for key in instance
        if key not in evaluated
        and next(validator.descend(instance[key], unevaluated, path=key), None) is not None
    ]
    if failing and unevaluated is False:
        yield ValidationError(
            f"unexpected field(s) {_listed(failing)}; the schema allows no others"
        )
    elif failing:
        yield ValidationError(f"field(s) {_listed(failing)} fail the schema for other fields")


def _format(validator: Any, format: Any, instance: Any, schema: Any) -> Iterator[Any]:
    check = FORMATS.get(format) if isinstance(format, str) else None
    if check is None:  # refused at load; fail closed if a schema skipped that check
        yield ValidationError(f"format {quote(format)} is not one capgate checks")
    elif validator.is_type(instance, "string") and not check(instance):
        yield ValidationError(f"is not a valid {format}")


def _strings_only(check: Callable[[str], bool]) -> Callable[[object], bool]:
    def checked(value: object) -> bool:
        return not isinstance(value, str) or check(value)

    return checked


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name, check in FORMATS.items():
        checker.checks(name)(_strings_only(check))
    return checker


#: The strict format checks, also used for the meta-schema's own ``format: regex``.
FORMAT_CHECKER: Final = _format_checker()

#: Draft 2020-12 with ECMA-262 patterns and strict formats; see the module docstring.
SchemaValidator: Final[type[Validator]] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "unevaluatedProperties": _unevaluated_properties,
        "format": _format,
    },
    format_checker=FORMAT_CHECKER,
)


def schema_validator(schema: Mapping[str, Any] | bool) -> Validator:
    """The validator for one checked catalogue schema (input or output alike).

    The registry is empty (no network, no meta-schemas beyond jsonschema's own), and
    the root ``$schema`` is left out so that jsonschema never swaps this class for
    the stock 2020-12 one when it re-enters the root through a ``$ref``.
    """
    if isinstance(schema, Mapping):
        schema = {k: v for k, v in schema.items() if k != "$schema"}
    registry: referencing.Registry[Any] = referencing.Registry()
    return SchemaValidator(schema, format_checker=FORMAT_CHECKER, registry=registry)
