"""Strategies the fuzz properties share: names, JSON, hostile values, tool parameters.

:func:`parameters` draws parameters for a contract: values that fit its input
schema, with planted secrets wherever a schema has room for one
(:func:`secret_value`), or, when ``hostile``, broken on purpose: wrong types,
values too deep, too long or not JSON, mappings that lie or raise.

:data:`identifiers` draws any capgate name (tenant, alias, ...), and
:func:`look_alike` another name that differs from it only where people and old
code tend not to look: a letter's case, one of ``_ . - : /`` for another (issue
#17: such names once read one tenant's secret variable).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from hypothesis import strategies as st

from capgate.gateway.digest import MAX_PARAMS_BYTES
from capgate.gateway.model.contracts import ToolContract
from tests.fuzz.harness import secret_emails, secret_names, secret_texts

__all__ = [
    "Long",
    "LyingDict",
    "LyingStr",
    "RaisingMapping",
    "Unrepresentable",
    "emails",
    "hostile_values",
    "identifiers",
    "json_leaves",
    "json_values",
    "look_alike",
    "names",
    "nested",
    "one_in",
    "parameters",
    "plain_names",
    "secret_value",
    "valid_value",
]


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in ``n`` draws (hypothesis favours the first choice)."""
    return st.sampled_from([False] * (n - 1) + [True])


names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,24}", fullmatch=True)
#: Names as most tenants and aliases are written: lower case, single inner ``_``.
plain_names = st.from_regex(r"[a-z0-9]{1,8}(_[a-z0-9]{1,8}){0,3}", fullmatch=True)
#: Any capgate name (gateway.model.facts.Identifier): 1 to 128 characters, mostly
#: short ones, the usual forms often, and the longest there is at times.
identifiers = st.one_of(
    plain_names,
    names,
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}", fullmatch=True),
    st.integers(0, 9).map(lambda n: str(n) + "-_."[n % 3] * 127),
)
#: The characters a name may hold besides letters and digits.
_SEPARATORS: Final = "_.-:/"


@st.composite
def look_alike(draw: st.DrawFn, name: str) -> str:
    """Another capgate name that differs from ``name`` only in the case of letters and
    in which of ``_ . - : /`` stands where one does (``acme.eu``: ``acme-eu``,
    ``ACME_eu``); ``name`` and a ``_`` (within 128) when it has neither."""
    chars = []
    for char in name:
        if char in _SEPARATORS:
            char = draw(st.sampled_from(_SEPARATORS))
        elif char.isalpha() and draw(st.booleans()):
            char = char.swapcase()
        chars.append(char)
    other = "".join(chars)
    if other == name:  # nothing changed: change the first thing that can change
        at = next((i for i, c in enumerate(name) if c.isalpha() or c in _SEPARATORS), None)
        if at is None:
            return name[:127] + "_"
        char = name[at]
        changed = char.swapcase() if char.isalpha() else "_" if char != "_" else "-"
        other = name[:at] + changed + name[at + 1 :]
    return other


emails = st.from_regex(r"[a-z]{1,12}(\.[a-z]{1,8})?@[a-z]{1,12}\.(test|example)", fullmatch=True)
json_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = {"n": value} if level % 2 else [value]
    return value


class Long(str):
    """A long string that a failing example prints by its length, not in full."""

    def __repr__(self) -> str:
        return f"<{len(self)} characters of {str.__str__(self[:1])!r}>"


class LyingStr(str):
    """A str whose own methods tell another story than its contents."""

    def __str__(self) -> str:
        return "benign"

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


class LyingDict(dict[str, Any]):
    def items(self) -> Any:
        return iter([("harmless", "yes")])

    def keys(self) -> Any:
        return iter(["harmless"])


class RaisingMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("no items here")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("no iteration here")

    def __len__(self) -> int:
        return 1


class Unrepresentable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


hostile_values = st.one_of(
    secret_texts,
    secret_names,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.just(10**5000),  # past the digit limit for printing an integer
    st.floats(),  # NaN and infinities included
    st.binary(max_size=8),
    st.none(),
    st.booleans(),
    st.lists(json_values, max_size=3),
    st.tuples(json_leaves, json_leaves),
    st.frozensets(st.integers(), max_size=2),
    st.integers(0xD800, 0xDFFF).map(lambda c: "lone " + chr(c)),  # not UTF-8
    st.integers(55, 75).flatmap(lambda d: secret_texts.map(lambda s: nested(d, s))),
    st.just(Long("x" * (MAX_PARAMS_BYTES + 1))),
    st.dictionaries(st.integers(), st.text(max_size=4), min_size=1, max_size=2),
    secret_names.map(LyingStr),
    st.builds(lambda s: LyingDict(inner=s), secret_texts),
    st.just(RaisingMapping()),
    st.just(Unrepresentable()),
    st.just(object()),
)


#: Values of the string formats :func:`valid_value` knows.
_FORMATTED: Final = {"email": emails, "date": st.dates().map(str), "uuid": st.uuids().map(str)}


def valid_value(schema: Any) -> st.SearchStrategy[Any]:
    """Values that fit the simple schemas of the demo catalogue's parameters (and the
    output schemas ``test_serve_answer_properties`` draws)."""
    if not isinstance(schema, dict):
        return json_values
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        if schema.get("format") in _FORMATTED:
            return _FORMATTED[schema["format"]]
        low, high = schema.get("minLength", 0), schema.get("maxLength", 10**9)
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$"):
            return st.from_regex(pattern[1:-1], fullmatch=True).filter(
                lambda text: low <= len(text) <= high
            )
        return st.text(min_size=low, max_size=max(low, min(high, 60)))
    if kind == "integer":
        return st.integers(schema.get("minimum", -(10**9)), schema.get("maximum", 10**12))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {name: valid_value(sub) for name, sub in properties.items() if name in required},
            optional={
                name: valid_value(s) for name, s in properties.items() if name not in required
            },
        )
    if kind == "array":
        return st.lists(valid_value(schema.get("items", {})), max_size=schema.get("maxItems", 3))
    return json_values


def secret_value(schema: Any) -> st.SearchStrategy[Any]:
    """A secret shaped to pass ``schema`` where it can be, so it reaches OPA and the tool."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return valid_value(schema)
    if schema.get("format") == "email":
        return secret_emails
    pattern = schema.get("pattern", "")
    if pattern.startswith("^[A-Za-z0-9]"):
        return secret_names
    if pattern:
        return valid_value(schema)
    return secret_texts


@st.composite
def parameters(draw: st.DrawFn, contract: ToolContract, hostile: bool = False) -> Any:
    """Parameters for ``contract``: valid (secrets where they fit), or broken on purpose."""
    schema = contract.input_schema
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    params: dict[str, Any] = {}
    for name, sub in properties.items():
        if name in required or draw(st.booleans()):
            params[name] = draw(st.one_of(valid_value(sub), secret_value(sub)))
    if not hostile:
        return params
    for _ in range(draw(st.integers(1, 3))):
        change = draw(st.sampled_from(["replace", "replace", "drop", "extra"]))
        key = draw(st.sampled_from(sorted(params))) if params else "anything"
        if change == "replace":
            params[key] = draw(hostile_values)
        elif change == "drop":
            params.pop(key, None)
        else:
            params[draw(names)] = draw(st.one_of(secret_texts, hostile_values))
    whole = draw(st.sampled_from(["as is"] * 9 + ["not a mapping", "raising", "lying"]))
    if whole == "not a mapping":
        return draw(st.sampled_from([None, [], "contact_id=c-1", 42]))
    if whole == "raising":
        return RaisingMapping()
    if whole == "lying":
        return LyingDict(params)
    return params
