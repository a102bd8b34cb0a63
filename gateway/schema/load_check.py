"""What a catalogue schema must pass when it loads, before any call can use it.

The call-time validator (:mod:`capgate.gateway.schema.validator`) trusts a schema
to mean what it reads; these checks make that true, each closing a way stock
jsonschema would silently be looser or fail in the middle of a call:

1. **Unknown keywords are refused.** Validators ignore a keyword they do not know,
   so a typo (``maxLenght: 20``) silently removes the limit. Only the keywords of
   the 2020-12 core, applicator, unevaluated, validation, format-annotation, content
   and meta-data vocabularies (:data:`capgate.gateway.schema.dialect.KEYWORDS`) are
   accepted, wherever a schema can appear.
2. **Formats capgate does not check are refused**, and every pattern must compile
   as ECMA-262.
3. **References stay inside the schema.** Every ``$ref`` and ``$dynamicRef`` must
   resolve to a subschema of the same document: jsonschema would otherwise fetch a
   remote ``$ref`` over the network at call time, and an unresolvable one would fail
   in the middle of a call.
4. **No reference loops that consume no input.** ``{"$ref": "#"}`` (or a chain of
   ``allOf``/``$ref`` back to itself) would recurse until Python's stack runs out.
5. **``$schema`` is 2020-12 or absent,** and only at the root: a subschema naming
   another draft would be evaluated by another draft's rules.

Content keywords (``contentEncoding``, ``contentMediaType``, ``contentSchema``) are
accepted as the annotations 2020-12 defines them to be: they are not checked.
:func:`check_schema` runs them all.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any, cast

import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema.exceptions import SchemaError

from capgate.gateway.digest import plain_json
from capgate.gateway.errors import InvalidInput, cut, quote
from capgate.gateway.schema.dialect import (
    DIALECT,
    IN_PLACE_LISTS,
    IN_PLACE_ONE,
    KEYWORDS,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    ONE_SCHEMA,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
)
from capgate.gateway.schema.formats import FORMATS, compile_ecma_regex
from capgate.gateway.schema.validator import FORMAT_CHECKER, SchemaValidator

__all__ = ["check_schema"]


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
            if keyword in ONE_SCHEMA:
                found.append(((*where, keyword), value))
            elif keyword in SCHEMA_LISTS and isinstance(value, list):
                found += [((*where, keyword, i), item) for i, item in enumerate(value)]
            elif keyword in SCHEMA_MAPS and isinstance(value, dict):
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
            if keyword in ONE_SCHEMA | SCHEMA_LISTS | SCHEMA_MAPS:
                children = (
                    [value]
                    if keyword in ONE_SCHEMA
                    else list(value)
                    if keyword in SCHEMA_LISTS and isinstance(value, list)
                    else list(value.values())
                    if isinstance(value, dict)
                    else []
                )
                for child in children:
                    if isinstance(child, dict):
                        resolvers[id(child)] = resolver
                if keyword in IN_PLACE_ONE or keyword in IN_PLACE_LISTS:
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
