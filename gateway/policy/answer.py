"""Read what OPA sent back into a decision, or refuse it: pure, no I/O.

Each step takes what came over the wire (or what the step before made of it) and
either returns the next typed thing or raises
:class:`~capgate.gateway.errors.PolicyUnavailable`, so every malformed case can be
tested alone, and the fuzz targets (``tests/fuzz/fuzz_targets.py``) drive them
directly::

    parse_answer(path, head, body) -> Envelope
    ├── HTTP status other than 200             -> PolicyUnavailable (OPA's error code)
    ├── not HTTP/1.1, not application/json     -> PolicyUnavailable
    ├── a content encoding OPA does not use    -> PolicyUnavailable
    ├── body not strict JSON / not an object   -> PolicyUnavailable
    ├── a key repeated in any JSON object      -> PolicyUnavailable
    ├── nested deeper than Python can parse    -> PolicyUnavailable
    ├── malformed decision_id or provenance    -> PolicyUnavailable
    └── no "result" key (undefined decision)   -> PolicyUnavailable
    check_revision(path, envelope, expected)
    └── pinned bundle revision not the one     -> PolicyUnavailable
    validate(path, model, envelope) -> decision
    ├── result not an object                   -> PolicyUnavailable
    └── result does not fit the decision model -> PolicyUnavailable
    check_catalogue(path, decision, expected)
    └── made under another catalogue digest    -> PolicyUnavailable

Messages name the policy path and what went wrong, never the input or OPA's own
error message (which can quote values from the input): only its short error code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from capgate.gateway.errors import PolicyUnavailable, cut
from capgate.gateway.model.decisions import (
    ATTACHED_FIELDS,
    ComposeDecision,
    ComposeExplanation,
    ExecuteDecision,
    ExecuteExplanation,
    LinkDecision,
    ReviewDecision,
)

__all__ = [
    "ENCODINGS",
    "MAX_ANSWER_BYTES",
    "Decided",
    "Envelope",
    "Head",
    "check_catalogue",
    "check_revision",
    "parse_answer",
    "validate",
]

#: Content encodings accepted in an answer: OPA compresses with gzip when asked to.
ENCODINGS: Final = frozenset({"identity", "gzip"})

#: The largest answer read. Compose for 10,000 tools names its visible tools only
#: (about 10 kB for 476 visible); explaining it, six checks per tool, is some MB.
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024

_D = TypeVar("_D", bound=BaseModel)
#: A document made under a catalogue: what :func:`check_catalogue` checks.
Decided = TypeVar(
    "Decided",
    ComposeDecision,
    ExecuteDecision,
    ReviewDecision,
    LinkDecision,
    ComposeExplanation,
    ExecuteExplanation,
)


class _DuplicateKeyError(ValueError):
    """A JSON object in an OPA answer names the same key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # The json module's object_pairs_hook: it sees every object's keys after
    # unescaping, so "allow" and "\\u0061llow" count as the same key.
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _DuplicateKeyError
    return document


def _no_constant(name: str) -> Any:
    # NaN, Infinity and -Infinity are Python's extensions, not JSON; OPA never sends them.
    raise ValueError(f"{name} is not JSON")


#: One decoder for every answer (json.loads with hooks would build one per call);
#: like json's own default decoder, it keeps no state between documents.
_STRICT_JSON: Final = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constant)


def _loads(body: bytes) -> Any:
    """Parse strict JSON: no repeated key in any object, no NaN or Infinity.

    Python's json keeps the last of two equal keys, other parsers the first, so
    ``{"allow": false, "allow": true}`` means whatever the reader wants it to mean.
    An ambiguous answer is no answer. Raises _DuplicateKeyError, ValueError or
    RecursionError (nesting deeper than the interpreter's stack).

    The hook costs one Python call per object: about 1.5 times plain ``json.loads``
    (23 ms against 15 ms for the 2.4 MB compose answer of a 10,000-tool catalogue,
    which OPA takes about 0.5 s to produce), so it stays in the hot path.
    """
    return _STRICT_JSON.decode(body.decode("utf-8"))


@dataclass(frozen=True)
class Head:
    """The parts of a response's head that a usable OPA answer must get right."""

    status: int
    http_version: str = "HTTP/1.1"
    content_type: str | None = "application/json"
    content_encoding: str | None = None


@dataclass(frozen=True)
class Envelope:
    """A parsed OPA answer: the result and what OPA says it was made under."""

    result: Any
    decision_id: str | None
    opa_version: str | None
    bundle_revisions: dict[str, str]


def parse_answer(path: str, head: Head, body: bytes) -> Envelope:
    """Read a raw OPA answer, or raise PolicyUnavailable.

    OPA answers a data query with HTTP/1.1 200 and ``application/json``; anything
    else is an error page, a proxy or an impostor, whatever its body says.
    """
    if head.status != 200:
        raise PolicyUnavailable(
            f"OPA answered HTTP {head.status}{_opa_error_code(body)} for {path}"
        )
    if head.http_version != "HTTP/1.1":
        raise PolicyUnavailable(f"OPA answered {path} in {head.http_version}, not HTTP/1.1")
    media_type = (head.content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise PolicyUnavailable(f"OPA answer for {path} is not labelled application/json")
    if (head.content_encoding or "identity").strip().lower() not in ENCODINGS:
        # httpx passes a body in an encoding it does not know through as it is.
        raise PolicyUnavailable(f"OPA answer for {path} has a content encoding OPA does not use")
    try:
        document = _loads(body)
    except _DuplicateKeyError:
        raise PolicyUnavailable(
            f"OPA answer for {path} repeats a key within one object; an ambiguous answer "
            "is no answer"
        ) from None
    except RecursionError:
        raise PolicyUnavailable(f"OPA answer for {path} is nested too deeply to read") from None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        raise PolicyUnavailable(f"OPA answer for {path} is not JSON") from None
    if not isinstance(document, dict):
        raise PolicyUnavailable(
            f"OPA answer for {path} is a JSON {type(document).__name__}, not an object"
        )
    decision_id = document.get("decision_id")
    if decision_id is not None and not isinstance(decision_id, str):
        raise PolicyUnavailable(f"OPA answer for {path} has a non-string decision_id")
    opa_version, revisions = _provenance(path, document)
    if "result" not in document:
        raise PolicyUnavailable(
            f"decision {path} is undefined: OPA has no such rule or it produced no value "
            "(is the right bundle loaded?)"
        )
    return Envelope(document["result"], decision_id, opa_version, revisions)


def _provenance(path: str, document: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """``(OPA version, {bundle name: revision})`` from the answer's ``provenance``.

    Absent provenance reads as unknown (no version, no bundles); provenance that is
    present but malformed means the answer did not come from the OPA we asked.
    """
    if "provenance" not in document:
        return None, {}
    provenance = document["provenance"]
    malformed = PolicyUnavailable(f"OPA answer for {path} has malformed provenance")
    if not isinstance(provenance, dict):
        raise malformed
    version = provenance.get("version")
    bundles = provenance.get("bundles", {})
    if (version is not None and not isinstance(version, str)) or not isinstance(bundles, dict):
        raise malformed
    revisions: dict[str, str] = {}
    for name, bundle in bundles.items():
        revision = bundle.get("revision", "") if isinstance(bundle, dict) else None
        if not isinstance(revision, str):
            raise malformed
        revisions[name] = revision
    return version, revisions


def _opa_error_code(body: bytes) -> str:
    """OPA's own error code (e.g. ``internal_error``), without its message.

    OPA error messages can quote the values a builtin failed on, which may come from
    the input, so only the short code is passed on.
    """
    try:
        document = _loads(body)
    except (ValueError, RecursionError):
        return ""
    code = document.get("code") if isinstance(document, dict) else None
    if isinstance(code, str) and re.fullmatch(r"[a-z_]{1,64}", code):
        return f" ({code})"
    return ""


def _shown(value: str) -> str:
    """A value from OPA's answer, quoted and cut short, for an error message."""
    return repr(value if len(value) <= 80 else value[:77] + "...")


def check_revision(path: str, envelope: Envelope, expected: str | None) -> None:
    """With a pinned revision, OPA must report it and no other for the answer."""
    if expected is None:
        return
    served = sorted({revision for revision in envelope.bundle_revisions.values() if revision})
    if served != [expected]:
        shown = ", ".join(_shown(revision) for revision in served) or "none"
        raise PolicyUnavailable(
            f"OPA answered {path} from bundle revision(s) {shown}, but this client "
            f"expects {expected}: OPA no longer serves the bundle it was started with"
        )


def validate(path: str, model: type[_D], envelope: Envelope) -> _D:
    """Fit a result object to its decision model; any misfit means no decision."""
    result = envelope.result
    if not isinstance(result, dict):
        raise PolicyUnavailable(f"decision {path} is a {type(result).__name__}, not an object")
    for name in ATTACHED_FIELDS:
        if name in result:
            # These come from OPA's envelope, attached here; a policy that set its
            # own would mask them.
            raise PolicyUnavailable(f"decision {path} sets {name} itself")
    document = {
        **result,
        "decision_id": envelope.decision_id,
        "bundle_revisions": envelope.bundle_revisions,
        "opa_version": envelope.opa_version,
    }
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        # The locations name the answer's own keys, which OPA (or an impostor)
        # chooses: each is cut short, and so is the list, as for any caller data.
        errors = exc.errors(include_input=False, include_url=False)
        problems = "; ".join(
            f"{cut('.'.join(str(p) for p in err['loc']), 80) or '<root>'}: {err['type']}"
            for err in errors[:5]
        )
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise PolicyUnavailable(
            f"decision {path} does not fit {model.__name__}: {problems}{more}"
        ) from None
    except RecursionError:
        raise PolicyUnavailable(f"decision {path} is nested too deeply to check") from None


def check_catalogue(path: str, decision: Decided, expected: str | None) -> Decided:
    """Refuse a decision made under another catalogue than the one ``expected``."""
    if expected is not None and decision.catalogue_digest != expected:
        raise PolicyUnavailable(
            f"decision {path} was made under catalogue {decision.catalogue_digest}, "
            f"but this client expects {expected}: OPA no longer serves the catalogue "
            "this process loaded"
        )
    return decision
