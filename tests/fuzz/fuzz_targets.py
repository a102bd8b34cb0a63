"""Coverage-guided fuzz targets (atheris, libFuzzer) for capgate's parsers and name mappings.

Run one target::

    .venv/bin/python tests/fuzz/fuzz_targets.py answer -runs=30000 -seed=1
    .venv/bin/python tests/fuzz/fuzz_targets.py canonical -max_total_time=120 -seed=1

Everything after the target name goes to libFuzzer (``-help=1`` lists its options;
a folder argument is a corpus to read and grow). ``tests/fuzz/test_atheris.py`` runs
each briefly in ``make test``; ``make fuzz`` runs them for minutes.

``answer``
    What OPA (or whatever answers at its address) sends back: a status, an HTTP
    version, content type and encoding, and body bytes, through
    ``capgate.gateway.policy.answer.parse_answer`` and on to a decision: the pinned
    revision check, ``validate`` into ``ComposeDecision`` or ``ExecuteDecision`` and the
    catalogue digest check (``check_catalogue``). Each must return or
    raise ``PolicyUnavailable`` with a message of at most :data:`MESSAGE_CAP`
    characters; what is accepted must be an HTTP/1.1 200 ``application/json``
    answer that is strict JSON (every reading of it the same: no repeated key, no
    NaN), and a decision made under the expected catalogue digest and revision.
``canonical``
    Any Python value (plain JSON, or anything else a caller could pass: tuples, sets,
    bytes, non-string keys, subclasses, NaN, huge integers, lone surrogates, deep or
    self-containing nesting) through ``capgate.gateway.digest.plain_json`` and
    ``canonical_json``, and ``plain_params`` for mappings. Each must return or raise
    ``InvalidInput`` (short message), and the two must agree on what is JSON: a copy
    that ``plain_json`` returns serialises without a refusal. Canonical output must
    be a fixed point, ``canonical_json(json.loads(out)) == out``, equal to the
    canonical form of the plain copy, and the copy must be exactly what
    ``json.loads(out)`` gives back.
``credentials``
    A tenant and an alias (any text, often near a capgate name: ``acme.eu``,
    ``a__b``, upper case, non-ASCII) through ``EnvironmentCredentials.variable``, and
    any text (often near a variable: the prefix, ``__``, hex) through
    ``names_of``. A name that is not a capgate name is refused (``InvalidInput``,
    short message); any other pair's variable is made of ``A-Z``, ``0-9`` and ``_``
    and decodes to that very pair, which makes the mapping injective (two pairs of
    one variable would decode to one pair); text that decodes is exactly the
    variable of the pair it decodes to (issue #17).

The inputs are *structured*: the first bytes choose what to build (a well-formed
answer with one part swapped, a duplicated or escaped key, a NaN, deep nesting, cut
or garbled bytes, or plain raw bytes), so a short run reaches the deep checks
without a seed corpus. The ``answer`` target drives the pure steps of
``capgate.gateway.policy.answer`` (``Head``, ``parse_answer``, ``check_revision``,
``validate``, ``check_catalogue``) as the policy client chains them.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, not an install

with atheris.instrument_imports(include=["capgate.gateway"]):
    from capgate.gateway.digest import canonical_json, plain_json, plain_params
    from capgate.gateway.errors import InvalidInput, PolicyUnavailable
    from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision
    from capgate.gateway.policy.answer import (
        Head,
        check_catalogue,
        check_revision,
        parse_answer,
        validate,
    )
    from capgate.gateway.policy.client import CATALOGUE_DIGEST_PATH, COMPOSE_PATH, EXECUTE_PATH
    from capgate.gateway.service.credentials import VARIABLE_PREFIX, EnvironmentCredentials

#: The longest message a capgate error may carry (docs/security.md).
MESSAGE_CAP: Final = 1_000

EXPECTED_DIGEST: Final = "sha256:" + "7a" * 32
OTHER_DIGEST: Final = "sha256:" + "0b" * 32
EXPECTED_REVISION: Final = "rev-capgate-1"

#: The revision a client pins: none, or one.
PINNED: Final = (None, EXPECTED_REVISION)


# == building values from the fuzzer's bytes ============================================

KEYS: Final = (
    "result",
    "decision_id",
    "provenance",
    "version",
    "bundles",
    "revision",
    "visible",
    "excluded",
    "allow",
    "reasons",
    "obligations",
    "catalogue_digest",
    "code",
    "message",
    "params",
    "key",
    "bundle_revisions",
    "opa_version",
    "contact.read",
    "",
)
TEXTS: Final = (
    EXPECTED_DIGEST,
    OTHER_DIGEST,
    EXPECTED_REVISION,
    "contact.read",
    "payment.execute",
    "pass_idempotency_key",
    "role_not_granted",
    "1.22.4",
    "capgate",
    "",
    "true",
    "\u0000",
    "x" * 300,
)


def pick(fdp: atheris.FuzzedDataProvider, choices: tuple[Any, ...]) -> Any:
    return choices[fdp.ConsumeIntInRange(0, len(choices) - 1)]


def json_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """Any JSON value, small, with the vocabulary of OPA answers."""
    kind = fdp.ConsumeIntInRange(0, 9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-3, 3) if fdp.ConsumeBool() else fdp.ConsumeInt(9)
    if kind == 3:
        return fdp.ConsumeRegularFloat()
    if kind in (4, 5):
        return pick(fdp, TEXTS)
    if kind == 6:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if kind == 7:
        return [json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {pick(fdp, KEYS): json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}


def maybe(fdp: atheris.FuzzedDataProvider, good: Callable[[], Any]) -> Any:
    """Mostly the well-formed part, sometimes any JSON value in its place."""
    return good() if fdp.ConsumeIntInRange(0, 5) else json_value(fdp)


def reasons(fdp: atheris.FuzzedDataProvider) -> list[Any]:
    return [
        maybe(fdp, lambda: {"code": pick(fdp, TEXTS), "message": pick(fdp, TEXTS)})
        for _ in range(fdp.ConsumeIntInRange(0, 2))
    ]


def decision(fdp: atheris.FuzzedDataProvider, path: str) -> Any:
    if path == CATALOGUE_DIGEST_PATH:
        return maybe(fdp, lambda: pick(fdp, TEXTS))
    document: dict[str, Any] = {
        "catalogue_digest": maybe(fdp, lambda: pick(fdp, (EXPECTED_DIGEST, OTHER_DIGEST)))
    }
    if path == COMPOSE_PATH:
        document["visible"] = maybe(
            fdp, lambda: [pick(fdp, TEXTS) for _ in range(fdp.ConsumeIntInRange(0, 2))]
        )
        document["excluded"] = maybe(
            fdp,
            lambda: {pick(fdp, TEXTS): reasons(fdp) for _ in range(fdp.ConsumeIntInRange(0, 2))},
        )
    else:
        document["allow"] = maybe(fdp, fdp.ConsumeBool)
        document["reasons"] = maybe(fdp, lambda: reasons(fdp))
        document["obligations"] = maybe(
            fdp,
            lambda: [
                {"code": pick(fdp, TEXTS), "params": maybe(fdp, lambda: {"key": pick(fdp, TEXTS)})}
                for _ in range(fdp.ConsumeIntInRange(0, 2))
            ],
        )
    for _ in range(fdp.ConsumeIntInRange(0, 1) if fdp.ConsumeIntInRange(0, 3) == 0 else 0):
        document[pick(fdp, KEYS)] = json_value(fdp)  # an extra or clobbered field
    if fdp.ConsumeIntInRange(0, 9) == 0:
        document.pop(pick(fdp, tuple(document)), None)
    return document


def envelope(fdp: atheris.FuzzedDataProvider, path: str) -> Any:
    document: dict[str, Any] = {}
    if fdp.ConsumeIntInRange(0, 7):
        document["result"] = maybe(fdp, lambda: decision(fdp, path))
    if fdp.ConsumeIntInRange(0, 3):
        document["decision_id"] = maybe(fdp, lambda: "4f0c2a5e-0000-4000-8000-00000000000a")
    if fdp.ConsumeIntInRange(0, 3):
        document["provenance"] = maybe(
            fdp,
            lambda: {
                "version": maybe(fdp, lambda: "1.22.4"),
                "bundles": maybe(
                    fdp,
                    lambda: {
                        pick(fdp, ("capgate", "other", "")): maybe(
                            fdp, lambda: {"revision": pick(fdp, TEXTS)}
                        )
                        for _ in range(fdp.ConsumeIntInRange(0, 2))
                    },
                ),
            },
        )
    if fdp.ConsumeIntInRange(0, 9) == 0:
        return json_value(fdp)  # not even an object
    return document


def garble(fdp: atheris.FuzzedDataProvider, text: str) -> bytes:
    """The serialised answer, possibly made ambiguous, non-strict, deep or broken."""
    how = fdp.ConsumeIntInRange(0, 11)
    if how == 1 and "{" in text:  # the same key twice in one object
        at = pick(fdp, tuple(i for i, c in enumerate(text) if c == "{"))
        key = pick(fdp, KEYS)
        text = f'{text[: at + 1]}"{key}":{json.dumps(json_value(fdp))},{text[at + 1 :]}'
        text = text.replace(",}", "}")
    elif how == 2:  # a key spelled with an escape: the same key to a parser
        key = pick(fdp, ("allow", "result", "catalogue_digest", "visible"))
        escaped = "".join(f"\\u{ord(c):04x}" if i == 0 else c for i, c in enumerate(key))
        text = text.replace(f'"{key}"', f'"{escaped}"', 1)
        text = text.replace("{", f'{{"{key}":{json.dumps(json_value(fdp))},', 1)
    elif how == 3:  # Python's extensions to JSON
        token = pick(fdp, ("NaN", "Infinity", "-Infinity"))
        text = text.replace(pick(fdp, ("true", "false", "null", "0", "1")), token, 1)
    elif how == 4:  # nested far deeper than anything reads recursively
        depth = fdp.ConsumeIntInRange(1, 200_000)
        text = text.replace('"result":', '"result":' + "[" * depth, 1) + "]" * depth
    elif how == 5:  # cut short
        text = text[: fdp.ConsumeIntInRange(0, len(text))]
    elif how == 6:
        text = pick(fdp, ("\ufeff", " \n", "")) + text + pick(fdp, ("", " ", "x", "{}", "\x00"))
    elif how == 7:
        return text.encode(pick(fdp, ("utf-16", "utf-32", "latin-1")), errors="replace")
    elif how == 8:
        raw = bytearray(text.encode())
        if raw:
            raw[fdp.ConsumeIntInRange(0, len(raw) - 1)] = fdp.ConsumeIntInRange(0x80, 0xFF)
        return bytes(raw)
    return text.encode()


STATUSES: Final = (200, 200, 200, 200, 200, 200, 201, 204, 301, 400, 404, 500)
VERSIONS: Final = ("HTTP/1.1",) * 6 + ("HTTP/1.0", "HTTP/2", "HTTP/0.9", "http/1.1")
CONTENT_TYPES: Final = ("application/json",) * 6 + (
    "application/json; charset=utf-8",
    "Application/JSON",
    "text/plain",
    "application/jsonx",
    "text/html",
    "",
    None,
)
ENCODINGS: Final = (None,) * 6 + ("gzip", "identity", " GZIP ", "br", "zstd", "deflate")


# == the targets ========================================================================


def _short(exc: BaseException) -> None:
    message = str(exc)
    if len(message) > MESSAGE_CAP:
        raise AssertionError(f"a {len(message)}-character message: {message[:300]}...")


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(reversed(pairs))


def _refuse_constant(name: str) -> Any:
    raise AssertionError(f"accepted an answer holding {name}")


def target_answer(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    path = pick(fdp, (COMPOSE_PATH, EXECUTE_PATH, CATALOGUE_DIGEST_PATH))
    pinned = pick(fdp, PINNED)
    head = Head(
        status=pick(fdp, STATUSES),
        http_version=pick(fdp, VERSIONS),
        content_type=pick(fdp, CONTENT_TYPES),
        content_encoding=pick(fdp, ENCODINGS),
    )
    if fdp.ConsumeIntInRange(0, 4) == 0:
        body = fdp.ConsumeBytes(fdp.remaining_bytes())  # whatever bytes
    else:
        body = garble(fdp, json.dumps(envelope(fdp, path), separators=(",", ":")))
    try:
        answer = parse_answer(path, head, body)
        check_revision(path, answer, pinned)
        made: ComposeDecision | ExecuteDecision | None = None
        if path == COMPOSE_PATH:
            made = check_catalogue(path, validate(path, ComposeDecision, answer), EXPECTED_DIGEST)
        elif path == EXECUTE_PATH:
            made = check_catalogue(path, validate(path, ExecuteDecision, answer), EXPECTED_DIGEST)
    except PolicyUnavailable as exc:
        _short(exc)
        return

    # Accepted: it must be an answer OPA could have sent, read only one way.
    assert head.status == 200, head
    assert head.http_version == "HTTP/1.1", head
    assert (head.content_type or "").split(";")[0].strip().lower() == "application/json", head
    strict = json.loads(body, parse_constant=_refuse_constant)
    assert strict == json.loads(body, object_pairs_hook=_first_wins), "an ambiguous answer"
    assert isinstance(strict, dict)
    assert "result" in strict
    if pinned is not None:
        served = {revision for revision in answer.bundle_revisions.values() if revision}
        assert served == {pinned}, answer.bundle_revisions
    if made is not None:
        assert made.catalogue_digest == EXPECTED_DIGEST, made
        assert made.decision_id == answer.decision_id
    if isinstance(made, ExecuteDecision):
        assert type(made.allow) is bool


class _Str(str):
    def __str__(self) -> str:
        return "a different text"


class _Dict(dict[Any, Any]):
    def items(self) -> Any:
        return iter([("other", "items")])


class _Int(int):
    def __int__(self) -> int:
        return 7


def python_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> Any:
    """Any value a caller could pass as parameters, JSON or not."""
    kind = fdp.ConsumeIntInRange(0, 17 if depth < 6 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 16))
    if kind == 3:  # either side of the 14,000-bit limit
        return (1 << fdp.ConsumeIntInRange(13_995, 14_005)) * (-1 if fdp.ConsumeBool() else 1)
    if kind == 4:
        return fdp.ConsumeFloat()  # NaN and infinities included
    if kind == 5:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 16))  # lone surrogates included
    if kind == 6:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4))
    if kind == 7:
        return pick(
            fdp, (_Str("subclass"), _Int(3), True, 0.0, -0.0, 1e308, 5e-324, "\ud800", "a\udfffb")
        )
    if kind in (8, 9):
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 8))
    if kind in (10, 11):
        return [python_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    if kind == 12:
        return tuple(python_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 2)))
    if kind == 13:
        return {fdp.ConsumeIntInRange(0, 3) for _ in range(fdp.ConsumeIntInRange(0, 2))}
    if kind == 14:  # keys that are not strings, or are strings of other shapes
        key = pick(fdp, (1, None, True, 1.5, ("t",), _Str("k"), "k", "\ud800"))
        return {key: python_value(fdp, depth + 1)}
    if kind == 15:
        return _Dict({fdp.ConsumeUnicodeNoSurrogates(3): python_value(fdp, depth + 1)})
    if kind == 16:  # deep, without recursing here
        value: Any = python_value(fdp, 6)
        for level in range(fdp.ConsumeIntInRange(1, 200)):
            value = [value] if level % 2 else {"d": value}
        return value
    loop: list[Any] = [python_value(fdp, 6)]
    loop.append(loop)  # contains itself
    return loop


def target_canonical(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeIntInRange(0, 3) == 0:
        try:  # JSON text of any shape, as a tool or an agent would produce it
            value = json.loads(fdp.ConsumeBytes(fdp.remaining_bytes()))
        except (ValueError, RecursionError):
            return
    else:
        value = (
            {fdp.ConsumeUnicodeNoSurrogates(4): python_value(fdp)}
            if fdp.ConsumeBool()
            else (python_value(fdp))
        )
    try:
        copy = plain_json(value)
    except InvalidInput as exc:
        _short(exc)
        try:
            canonical_json(value)
        except InvalidInput:
            return
        raise AssertionError("canonical_json accepted what plain_json refused") from None
    # A copy plain_json returned is plain JSON: it serialises, without any refusal.
    out = canonical_json(copy)
    assert canonical_json(value) == out, "the copy and the value canonicalise differently"
    assert canonical_json(json.loads(out)) == out, "canonical JSON is not a fixed point"
    assert _same(json.loads(out), copy), "the copy is not what its canonical JSON says"
    if type(value) is dict:
        try:
            _, params_bytes = plain_params(value)
        except InvalidInput as exc:
            _short(exc)
        else:
            assert params_bytes == out


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, types included (``1 == 1.0 == True`` in Python)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif isinstance(x, float):
            if not (x == y and math.copysign(1, x) == math.copysign(1, y)):
                return False
        elif x != y:
            return False
    return True


# == credentials: names to a variable and back ========================================

#: Maps and decodes; it reads no environment.
ENVIRONMENT: Final = EnvironmentCredentials(environ={})
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
_VARIABLE: Final = re.compile(r"[A-Z][A-Z0-9_]*")
NAME_PIECES: Final = ("acme", "eu", "crm", "sales_mailbox", "A", "0", ".", "-", "_", "__", ":", "/")
VARIABLE_PIECES: Final = ("ACME", "CRM", "_", "__", "41", "61", "2D", "2E", "5F", "C3A9", "FF", "0")


def _pieces(fdp: atheris.FuzzedDataProvider, pieces: tuple[str, ...]) -> str:
    parts = []
    for _ in range(fdp.ConsumeIntInRange(0, 8)):
        parts.append(pick(fdp, pieces) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(3))
    return "".join(parts)


def target_credentials(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    how = fdp.ConsumeIntInRange(0, 2)
    if how == 0:  # a pair: refused, or a portable variable that decodes to it
        tenant, alias = _pieces(fdp, NAME_PIECES), _pieces(fdp, NAME_PIECES)
        try:
            variable = ENVIRONMENT.variable(tenant, alias)
        except InvalidInput as exc:
            _short(exc)
            assert not (_IDENTIFIER.fullmatch(tenant) and _IDENTIFIER.fullmatch(alias))
            return
        assert _IDENTIFIER.fullmatch(tenant)
        assert _IDENTIFIER.fullmatch(alias)
        assert _VARIABLE.fullmatch(variable), variable
        assert ENVIRONMENT.names_of(variable) == (tenant, alias), variable
        return
    if how == 1:  # text near a variable
        text = VARIABLE_PREFIX + _pieces(fdp, VARIABLE_PIECES)
    else:  # any text
        text = fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes())
    try:
        pair = ENVIRONMENT.names_of(text)
    except InvalidInput as exc:
        _short(exc)
        return
    assert ENVIRONMENT.variable(*pair) == text, (text, pair)


TARGETS: Final[dict[str, Callable[[bytes], None]]] = {
    "answer": target_answer,
    "canonical": target_canonical,
    "credentials": target_credentials,
}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        sys.exit(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [libFuzzer options] [corpus folders]")
    atheris.Setup([argv[0], *argv[2:]], TARGETS[argv[1]])
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
