"""capgate's JSON Schema dialect: draft 2020-12, where what a schema says is what passes.

Tool schemas are part of the security boundary (a ``pattern`` on an IBAN, a
``format: email`` on a recipient), so a schema must not be looser than it reads.
Stock jsonschema is, in three ways, and this module closes each:

1. **Patterns are ECMA-262.** JSON Schema defines ``pattern`` and
   ``patternProperties`` as ECMA-262 regular expressions; Python's :mod:`re` is
   another dialect, in which ``^[A-Z]{3}$`` accepts ``"EUR\\n"`` (``$`` matches
   before a final newline) and ``\\d`` matches Arabic-Indic digits. Here both
   keywords, and ``additionalProperties`` and ``unevaluatedProperties`` (which
   decide what ``patternProperties`` covered), run on ``regress``, a Rust ECMA-262
   engine, with the ``u`` flag. Every pattern must compile when the catalogue loads.
2. **Formats are checked strictly or refused.** jsonschema's own ``email`` check is
   ``"@" in value``, and formats it has no checker for pass silently. capgate checks
   the formats in :data:`capgate.gateway.schema.formats.FORMATS` with its own code, and a
   schema naming any other format is refused at load.
3. **Unknown keywords are refused.** Validators ignore a keyword they do not know,
   so a typo (``maxLenght: 20``) silently removes the limit. Only the keywords of
   the 2020-12 core, applicator, unevaluated, validation, format-annotation, content
   and meta-data vocabularies are accepted, wherever a schema can appear.

And because a schema is evaluated recursively, on every call, from this process:

4. **References stay inside the schema.** Every ``$ref`` and ``$dynamicRef`` must
   resolve, at load, to a subschema of the same document: jsonschema would
   otherwise fetch a remote ``$ref`` over the network at call time, and an
   unresolvable one would fail in the middle of a call.
5. **No reference loops that consume no input.** ``{"$ref": "#"}`` (or a chain of
   ``allOf``/``$ref`` back to itself) would recurse until Python's stack runs out.
6. **``$schema`` is 2020-12 or absent,** and only at the root: a subschema naming
   another draft would be evaluated by another draft's rules.

Content keywords (``contentEncoding``, ``contentMediaType``, ``contentSchema``) are
accepted as the annotations 2020-12 defines them to be: they are not checked.

:func:`check_schema` runs all load-time checks; :func:`schema_validator` builds the
validator the dispatcher uses for input and output alike (:class:`SchemaValidator`).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, cast

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
import regress
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from capgate.gateway.digest import plain_json
from capgate.gateway.errors import InvalidInput, cut, quote
from capgate.gateway.schema.formats import FORMATS, compile_ecma_regex

__all__ = [
    "DIALECT",
    "FORMAT_CHECKER",
    "KEYWORDS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "SchemaValidator",
    "check_schema",
    "schema_validator",
]

#: The only ``$schema`` a catalogue schema may name (at its root).
DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

#: Nesting of objects and arrays a schema document may have. jsonschema checks a
#: schema against the meta-schema recursively, about eight Python frames per level,
#: so this keeps that check (and validation) well inside Python's default limit of
#: 1000 frames. Deeper parameters are described with a recursive ``$ref`` or ``{}``.
MAX_SCHEMA_DEPTH: Final = 64
#: Largest canonical JSON of one schema, in bytes (1 MiB).
MAX_SCHEMA_BYTES: Final = 1024 * 1024

# Keywords whose value is one subschema, a list of them, or a map of name -> subschema.
_ONE: Final = frozenset(
    {
        "additionalProperties",
        "contains",
        "contentSchema",
        "else",
        "if",
        "items",
        "not",
        "propertyNames",
        "then",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
_LIST: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP: Final = frozenset({"$defs", "dependentSchemas", "patternProperties", "properties"})
# Applied to the same instance, not to a part of it: a loop through these never ends.
_IN_PLACE_ONE: Final = ("not", "if", "then", "else")
_IN_PLACE_LIST: Final = ("allOf", "anyOf", "oneOf")

#: Every keyword a catalogue schema may use: draft 2020-12's vocabularies.
KEYWORDS: Final = frozenset(
    {
        # core
        "$schema",
        "$id",
        "$ref",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$vocabulary",
        "$comment",
        "$defs",
        # validation
        "type",
        "const",
        "enum",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "uniqueItems",
        "maxContains",
        "minContains",
        "maxProperties",
        "minProperties",
        "required",
        "dependentRequired",
        # format-annotation (asserted by capgate)
        "format",
        # content (annotations only)
        "contentEncoding",
        "contentMediaType",
        # meta-data (annotations)
        "title",
        "description",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "examples",
    }
    | _ONE
    | _LIST
    | _MAP
)


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
    for keyword in _IN_PLACE_LIST:
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


# --------------------------------------------------------------- load-time checks


def _pointer(path: tuple[str | int, ...]) -> str:
    """A schema path for a message, ``properties/recipient/format``; ``(root)`` for the
    whole schema. Catalogue text, not caller data, but still cut short."""
    return cut("/".join(str(p) for p in path) or "(root)", 120)


def _subschemas(
    schema: Any, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], Any]]:
    """Every subschema of ``schema`` (itself first) with its path; iterative.

    Follows only the keywords whose values are schemas, so ``enum``, ``const``,
    ``default`` and ``examples`` (data) and the names under ``properties`` (names)
    are never mistaken for schemas. Values of the wrong type are skipped here and
    reported by the meta-schema check.
    """
    stack = [(path, schema)]
    while stack:
        where, node = stack.pop()
        yield where, node
        if not isinstance(node, dict):
            continue
        found: list[tuple[tuple[str | int, ...], Any]] = []
        for keyword, value in node.items():
            if keyword in _ONE:
                found.append(((*where, keyword), value))
            elif keyword in _LIST and isinstance(value, list):
                found += [((*where, keyword, i), item) for i, item in enumerate(value)]
            elif keyword in _MAP and isinstance(value, dict):
                found += [((*where, keyword, name), item) for name, item in value.items()]
        stack.extend(reversed(found))


def _suggest(keyword: str) -> str:
    lowered = {k.lower(): k for k in KEYWORDS}
    close = difflib.get_close_matches(keyword.lower(), lowered, n=1, cutoff=0.6)
    return f" (did you mean {quote(lowered[close[0]])}?)" if close else ""


def _keyword_problems(path: tuple[str | int, ...], node: dict[str, Any]) -> list[str]:
    where = _pointer(path)
    problems = [
        f"schema path {where}: unknown keyword {quote(keyword)}{_suggest(keyword)}; "
        "JSON Schema 2020-12 does not define it, so nothing would check it"
        for keyword in node
        if keyword not in KEYWORDS
    ]
    if "$schema" in node:
        value = node["$schema"]
        if path:
            problems.append(
                f"schema path {where}: '$schema' is only allowed at the root of a schema"
            )
        elif not isinstance(value, str) or value.rstrip("#") != DIALECT:
            problems.append(
                f"schema path {where}: '$schema' must be {DIALECT!r} (or be left out); "
                f"got {quote(value)}"
            )
    if "$id" in node and isinstance(node["$id"], str) and "json-schema.org" in node["$id"]:
        problems.append(
            f"schema path {where}: '$id' {quote(node['$id'])} claims a json-schema.org "
            "address; give the schema an address of your own"
        )
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in FORMATS:
        problems.append(
            f"schema path {_pointer((*path, 'format'))}: format {quote(fmt)} is not one capgate "
            f"checks, so it would pass anything; supported: {', '.join(sorted(FORMATS))}"
        )
    patterns: list[tuple[str, Any]] = []
    if "pattern" in node:
        patterns.append((_pointer((*path, "pattern")), node["pattern"]))
    if isinstance(node.get("patternProperties"), dict):
        patterns += [
            (_pointer((*path, "patternProperties")), key) for key in node["patternProperties"]
        ]
    for at, pattern in patterns:
        if not isinstance(pattern, str):
            continue
        try:
            compile_ecma_regex(pattern)
        except Exception as exc:  # regress.RegressError (or a UnicodeError)
            problems.append(
                f"schema path {at}: pattern {quote(pattern)} is not an ECMA-262 "
                f"regular expression ({cut(str(exc), 120)})"
            )
    return problems


def _reference_problems(schema: Any) -> list[str]:
    """Every ``$ref``/``$dynamicRef`` resolves inside the schema, to a schema, and no
    chain of references and in-place applicators loops back on itself."""
    problems: list[str] = []
    spec = referencing.jsonschema.DRAFT202012
    root = (
        {k: v for k, v in schema.items() if k != "$schema"} if isinstance(schema, dict) else schema
    )
    # An empty registry: nothing but the schema itself can be looked up.
    empty: referencing.Registry[Any] = referencing.Registry()
    resolvers = {id(root): empty.resolver_with_root(spec.create_resource(root))}
    edges: dict[int, list[int]] = {}
    where_of: dict[int, str] = {}
    referenced_from: dict[int, str] = {}
    for path, node in _subschemas(root, ()):
        if not isinstance(node, dict):
            continue
        where_of[id(node)] = _pointer(path)
        resolver = resolvers.get(id(node))
        if resolver is None:  # pragma: no cover - parents are visited before children
            continue
        resolver = resolver.in_subresource(spec.create_resource(node))
        targets: list[int] = []
        for keyword, value in node.items():
            if keyword in _ONE | _LIST | _MAP:
                children = (
                    [value]
                    if keyword in _ONE
                    else list(value)
                    if keyword in _LIST and isinstance(value, list)
                    else list(value.values())
                    if isinstance(value, dict)
                    else []
                )
                for child in children:
                    if isinstance(child, dict):
                        resolvers[id(child)] = resolver
                if keyword in _IN_PLACE_ONE or keyword in _IN_PLACE_LIST:
                    targets += [id(c) for c in children if isinstance(c, dict)]
                if keyword == "dependentSchemas":
                    targets += [id(c) for c in children if isinstance(c, dict)]
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if not isinstance(ref, str):
                continue
            at = f"{_pointer(path)}/{keyword}"
            try:
                resolved = resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                problems.append(
                    f"schema path {at}: {quote(ref)} does not resolve inside this "
                    "schema (remote and meta-schema references are not followed)"
                )
                continue
            if isinstance(resolved.contents, dict):
                resolvers.setdefault(id(resolved.contents), resolved.resolver)
                targets.append(id(resolved.contents))
                referenced_from.setdefault(id(resolved.contents), at)
            elif not isinstance(resolved.contents, bool):
                problems.append(f"schema path {at}: {quote(ref)} does not point at a schema")
        edges[id(node)] = targets
    for target in {t for ts in edges.values() for t in ts} - set(edges):
        # A $ref into data (enum, const, default, examples) or at a name map itself.
        problems.append(
            f"schema path {referenced_from.get(target, '(root)')}: the reference points "
            "at something that is not a subschema (e.g. into 'enum', or at 'properties' itself)"
        )
        edges[target] = []
    loop = _find_loop(edges)
    if loop is not None:
        problems.append(
            f"schema path {where_of.get(loop, '(root)')}: a loop of references and "
            "in-place keywords (allOf, anyOf, oneOf, not, if/then/else, dependentSchemas) "
            "leads back here without consuming any input; it would never end"
        )
    return problems


def _find_loop(edges: dict[int, list[int]]) -> int | None:
    """A node on a cycle of ``edges``, or None (iterative depth-first search)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in edges:
        if start in state:
            continue
        stack = [(start, iter(edges[start]))]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                return child
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(edges.get(child, []))))
    return None


def check_schema(schema: Any) -> dict[str, Any]:
    """A checked, plain copy of ``schema``, or ValueError listing what is wrong.

    Checks, in order: plain JSON within :data:`MAX_SCHEMA_DEPTH` and
    :data:`MAX_SCHEMA_BYTES`; known keywords, ``$schema``, supported formats and
    ECMA-262 patterns everywhere a schema can appear; the 2020-12 meta-schema;
    references that resolve inside the schema without loops. Every problem names its
    schema path; the caller names the tool and field.
    """
    try:
        copy = plain_json(
            schema, what="schema", max_depth=MAX_SCHEMA_DEPTH, max_bytes=MAX_SCHEMA_BYTES
        )
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(copy, dict):
        raise ValueError("a schema must be a mapping")
    problems: list[str] = []
    for path, node in _subschemas(copy, ()):
        if isinstance(node, dict):
            problems += _keyword_problems(path, node)
    if not problems:
        try:
            # The meta-schema's own ``format: regex`` must be ECMA-262 too.
            cast(Any, SchemaValidator).check_schema(copy, format_checker=FORMAT_CHECKER)
        except RecursionError:  # pragma: no cover - MAX_SCHEMA_DEPTH keeps well clear
            problems.append("schema: nested too deeply to check against the meta-schema")
        except SchemaError as exc:
            where = _pointer(tuple(exc.absolute_path))
            problems.append(
                f"schema path {where}: not a valid JSON Schema: {cut(exc.message, 200)}"
            )
    if not problems:
        problems = _reference_problems(copy)
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError("; ".join(problems[:5]) + more)
    return cast(dict[str, Any], copy)
