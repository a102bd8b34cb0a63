"""Plain JSON copies of untrusted values, canonical JSON, and the parameter digest.

The dispatcher computes the digest from the parameters it is about to pass to the
tool, so an agent cannot present one text for approval and send another. Canonical
JSON (sorted keys, no insignificant whitespace, UTF-8) makes the digest independent
of key order; a recipient is a parameter like any other, so it is covered too.

Parameters and tool output come from outside, and everything that later reads them
(``json``, jsonschema, pydantic) recurses once per level of nesting: a value nested
a thousand deep would end in ``RecursionError`` (not a capgate error) half-way
through a check. :func:`plain_json` therefore walks a value *iteratively*, before
any recursive code sees it, and refuses it with :class:`~capgate.gateway.errors.InvalidInput`
unless it is plain JSON within the limits below. It returns a fresh copy made only
of ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` and ``None``: what the
caller does to its own objects afterwards, and whatever their subclasses override,
cannot change what was checked.

Limits (documented in ``docs/catalogue.md``):

* :data:`MAX_DEPTH` levels of nesting (objects and arrays), for parameters and
  tool output alike; the top-level parameters object is level 1.
* :data:`MAX_PARAMS_BYTES` of canonical JSON for a call's parameters and
  :data:`MAX_OUTPUT_BYTES` for a tool's output.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import InvalidInput, quote

__all__ = [
    "MAX_DEPTH",
    "MAX_OUTPUT_BYTES",
    "MAX_PARAMS_BYTES",
    "canonical_json",
    "digest_of",
    "email_digest",
    "params_digest",
    "plain_json",
    "plain_params",
]

#: Deepest nesting of objects and arrays accepted in parameters and tool output.
#: Real tool parameters are a few levels deep; 64 leaves room for nested documents
#: while keeping every recursive reader (json, jsonschema with ``$ref`` recursion)
#: far below Python's default recursion limit of 1000 frames.
MAX_DEPTH: Final = 64
#: Largest canonical JSON of one call's parameters, in bytes (1 MiB).
MAX_PARAMS_BYTES: Final = 1024 * 1024
#: Largest canonical JSON of one tool's output, in bytes (16 MiB).
MAX_OUTPUT_BYTES: Final = 16 * 1024 * 1024

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# About 4,300 decimal digits: Python's default limit for printing an integer.
_MAX_INT_BITS: Final = 14_000


class _Path:
    """Where a value sits, as a linked list to its parent (built only on error)."""

    __slots__ = ("key", "parent")

    def __init__(self, parent: _Path | None, key: str | int) -> None:
        self.parent = parent
        self.key = key

    def render(self) -> str:
        parts: list[str] = []
        node: _Path | None = self
        while node is not None:
            parts.append(str(node.key))
            node = node.parent
        return "/".join(reversed(parts))


def _where(path: _Path | None) -> str:
    return "the top level" if path is None else f"field {quote(path.render())}"


def _not_json(what: str, path: _Path | None, detail: str) -> InvalidInput:
    return InvalidInput(f"{what}: not plain JSON: {_where(path)} {detail}")


def plain_json(
    value: Any,
    *,
    what: str = "value",
    max_depth: int = MAX_DEPTH,
    max_bytes: int | None = None,
) -> Any:
    """A plain-JSON copy of ``value``, or InvalidInput saying which rule it breaks.

    Iterative, so no nesting can exhaust the stack. Refuses: nesting deeper than
    ``max_depth``; more than ``max_bytes`` of canonical JSON (when given); keys that
    are not strings (``json`` would silently turn ``1`` into ``"1"``, and ``1`` and
    ``"1"`` would then collide); NaN and infinities; integers of more than about
    4,300 digits (Python will not print them); strings holding lone surrogates (not
    UTF-8); and any other type. Types are read with ``type()`` and containers through
    the built-in methods, so a subclass cannot show one content to the check and
    another to the copy. Messages name the field path and the rule, never a value;
    ``what`` names the whole ("parameters", "tool output").
    """
    root: list[Any] = [None]
    # (source, container to fill, slot in it, depth of source, its path)
    stack: list[tuple[Any, Any, Any, int, _Path | None]] = [(value, root, 0, 1, None)]
    size = 0  # a lower bound of the canonical length, exact for ASCII
    while stack:
        source, target, slot, depth, path = stack.pop()
        kind = type(source)
        copy: Any
        if issubclass(kind, dict | list | tuple):
            if depth > max_depth:
                raise InvalidInput(
                    f"{what}: nested deeper than the limit of {max_depth} levels "
                    "of objects and arrays"
                )
            if issubclass(kind, dict):
                copy = {}
                size += 1 + len(dict.keys(source))  # braces, colons and commas
                for key, item in dict.items(source):
                    if not issubclass(type(key), str):
                        raise _not_json(
                            what, path, f"has a key that is a {type(key).__name__}, not a string"
                        )
                    key = str.__str__(key)
                    if _SURROGATE.search(key):
                        raise _not_json(what, path, "has a key with a lone surrogate (not UTF-8)")
                    size += len(key) + 2
                    copy[key] = None
                    stack.append((item, copy, key, depth + 1, _Path(path, key)))
            else:
                items = list.copy(source) if issubclass(kind, list) else [*tuple.__iter__(source)]
                copy = [None] * len(items)
                size += 1 + len(items)
                stack.extend(
                    (item, copy, index, depth + 1, _Path(path, index))
                    for index, item in enumerate(items)
                )
        elif issubclass(kind, str):
            copy = str.__str__(source)
            if _SURROGATE.search(copy):
                raise _not_json(what, path, "holds a lone surrogate (not UTF-8 text)")
            size += len(copy) + 2
        elif source is None or issubclass(kind, bool):
            copy = None if source is None else bool(int.__int__(source))
            size += 5 if copy is False else 4  # false; null, true
        elif issubclass(kind, int):
            copy = int.__int__(source)
            # bit_length is O(1): never turn a huge integer into digits to measure it.
            if copy.bit_length() > _MAX_INT_BITS:
                raise _not_json(what, path, "is an integer too long to write as JSON")
            size += copy.bit_length() * 3 // 10 + 1
        elif issubclass(kind, float):
            copy = float.__float__(source)
            if not math.isfinite(copy):
                raise _not_json(
                    what, path, "is not a finite number (NaN and infinity are not JSON)"
                )
            size += len(float.__repr__(copy))  # what json writes for it
        else:
            raise _not_json(what, path, f"holds a {kind.__name__}, which JSON has no type for")
        if max_bytes is not None and size > max_bytes:
            raise _too_big(what, max_bytes)
        target[slot] = copy
    return root[0]


def plain_params(params: object) -> tuple[dict[str, Any], bytes]:
    """A call's parameters as a private plain-JSON copy and its canonical bytes.

    ``params`` must be a mapping with string keys; a mapping that fails while being
    read (it is the caller's object) is refused as InvalidInput like any other.
    The digest is :func:`digest_of` the bytes: hashed from exactly the copy.
    """
    if not isinstance(params, Mapping):
        raise InvalidInput(f"parameters: must be a mapping of names to values, not {_kind(params)}")
    if not isinstance(params, dict):
        try:
            params = dict(params.items())
        except Exception as exc:  # the caller's own Mapping class failed
            raise InvalidInput(
                f"parameters: could not be read as a mapping ({type(exc).__name__})"
            ) from None
    copy: dict[str, Any] = plain_json(params, what="parameters", max_bytes=MAX_PARAMS_BYTES)
    canonical = _serialise(copy)
    if len(canonical) > MAX_PARAMS_BYTES:
        raise _too_big("parameters", MAX_PARAMS_BYTES)
    return copy, canonical


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` canonically; raise InvalidInput if it is not plain JSON.

    The nesting is checked iteratively first (:func:`plain_json`), so a deep value is
    an InvalidInput, never a RecursionError.
    """
    return _serialise(plain_json(value))


def _serialise(plain: Any) -> bytes:
    """The canonical bytes of a value :func:`plain_json` returned (not checked again)."""
    try:
        text = json.dumps(
            plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        return text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # pragma: no cover - plain_json refused these
        # The kind of problem only: the offending value may be a secret.
        raise InvalidInput(f"value: not plain JSON ({type(exc).__name__})") from None


def digest_of(canonical: bytes) -> str:
    """``sha256:<hex>`` of bytes already produced by :func:`canonical_json`."""
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def params_digest(params: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``params``, as the dispatcher computes it.

    The same checks and limits as a call's parameters: a value the dispatcher would
    refuse has no digest either.
    """
    return digest_of(plain_params(params)[1])


def email_digest(address: str) -> str:
    """``sha256:<hex>`` of an email address, trimmed and lower-cased: one spelling of
    one address, so that evidence about it (``verified_recipient``) can name the
    address without storing it or sending it to OPA. The demo's desk computes the
    same digest (:class:`~capgate.gateway.model.contracts.Derivation`)."""
    return digest_of(address.strip().lower().encode("utf-8"))


def _too_big(what: str, limit: int) -> InvalidInput:
    return InvalidInput(f"{what}: larger than the limit of {limit} bytes of canonical JSON")


def _kind(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
