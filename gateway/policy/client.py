"""Ask the OPA sidecar for decisions and return them typed; never enforce anything.

The client is the one place where HTTP meets policy. It knows how to reach OPA, how
long to wait, and what a usable answer looks like; it does not know what an answer
means. Every way an answer can be missing, malformed or ambiguous is translated
here, at the edge, into :class:`capgate.gateway.errors.PolicyUnavailable`, so the dispatcher
sees either a validated decision or a refusal, and a broken OPA can never be read
as an allow::

    PolicyClient.query(path, input)
    ├── unreachable / connection refused       -> PolicyUnavailable
    ├── 401: no token, or not one OPA accepts  -> PolicyUnavailable (naming which)
    ├── timeout (connect, write, read, pool)   -> PolicyUnavailable
    ├── whole exchange past its deadline       -> PolicyUnavailable
    ├── any other httpx transport error        -> PolicyUnavailable
    ├── HTTP status other than 200             -> PolicyUnavailable
    ├── not HTTP/1.1, not application/json     -> PolicyUnavailable
    ├── body over the size cap                 -> PolicyUnavailable
    ├── body not strict JSON / not an object   -> PolicyUnavailable
    ├── a key repeated in any JSON object      -> PolicyUnavailable
    ├── nested deeper than Python can parse    -> PolicyUnavailable
    ├── malformed decision_id or provenance    -> PolicyUnavailable
    ├── pinned bundle revision not the one     -> PolicyUnavailable
    ├── no "result" key (undefined decision)   -> PolicyUnavailable
    └── result not an object                   -> PolicyUnavailable
    PolicyClient.compose / execute / explain_*
    ├── result does not fit the decision model -> PolicyUnavailable
    ├── made under another catalogue digest    -> PolicyUnavailable
    └── compose(reasons=True): explanation and
        decision disagree                      -> PolicyUnavailable

Every query asks for OPA's provenance, so each decision records the bundle
revisions and OPA version it was made under, next to the catalogue digest that the
policy itself puts in the decision. A client given the digest (and revision) it
expects refuses a decision made under anything else: an OPA restarted with another
bundle behind the same address must not be obeyed.

How long to wait. Each read and write waits at most ``timeout`` seconds and the
whole exchange at most ``connect_timeout + 2 * timeout``; past either, the question
fails closed. The questions an agent's calls wait on (compose, execute, review) keep
the short default, so a wedged OPA fails a call in about a second. A question about
every tool of the catalogue at once (``capgate/explain/compose``, for people and
audits) costs OPA time in proportion to the catalogue, so its timeout grows with it:
:func:`whole_catalogue_timeout`, the one rule for such questions, which ``capgate
diff`` applies too. A timeout's message names the question, its limits and how to
give a longer one.

Messages name the policy path and what went wrong, never the input: facts carry
tenant and principal names, and errors end up in logs and agent transcripts.

A locked-down OPA (``--authentication=token --authorization=basic`` with the
``system.authz`` policy of the deployment bundle, see ``docs/deployment.md``) answers
only a client that presents the gateway's bearer token. Given ``token=``, the client
sends ``Authorization: Bearer <token>`` with every request, decisions and health
checks alike, and keeps it out of every message, log line and ``repr``.
:meth:`PolicyClient.ready` asks OPA whether it is healthy with every bundle active.

Addresses are restricted to loopback IP literals and unix sockets. Policy traffic
carries who-may-do-what facts and the answer is trusted as the security decision,
so it must not leave the machine, and it must not depend on name resolution
(``localhost`` is whatever ``/etc/hosts`` or a resolver says it is).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import time
from dataclasses import dataclass
from functools import cached_property
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from capgate.gateway.errors import InvalidInput, PolicyUnavailable
from capgate.gateway.model.decisions import (
    ATTACHED_FIELDS,
    ComposeDecision,
    ComposeExplanation,
    ExecuteDecision,
    ExecuteExplanation,
    ReviewDecision,
)
from capgate.gateway.model.facts import ComposeInput, ExecuteInput, ReviewInput
from capgate.gateway.model.reasons import with_reasons
from capgate.gateway.policy.wire import DEADLINE, AnswerTooLarge, DeadlineTransport

__all__ = [
    "CATALOGUE_DIGEST_PATH",
    "COMPOSE_PATH",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "EXECUTE_PATH",
    "EXPLAIN_COMPOSE_PATH",
    "EXPLAIN_EXECUTE_PATH",
    "MAX_TOKEN_CHARS",
    "PER_TOOL_TIMEOUT",
    "REVIEW_PATH",
    "PolicyClient",
    "check_token",
    "whole_catalogue_timeout",
]

log = logging.getLogger("capgate.opa.client")

COMPOSE_PATH: Final = "capgate/compose/decision"
EXECUTE_PATH: Final = "capgate/execute/decision"
REVIEW_PATH: Final = "capgate/review/decision"
EXPLAIN_COMPOSE_PATH: Final = "capgate/explain/compose"
EXPLAIN_EXECUTE_PATH: Final = "capgate/explain/execute"
CATALOGUE_DIGEST_PATH: Final = "capgate/catalogue/meta/digest"

#: Seconds to wait for each of write, read and a pooled connection. An execute
#: decision over loopback takes about a millisecond, and compose a few set operations
#: over the catalogue's index: 10,000 tools in about 13 ms at p50 and under 80 ms at
#: worst on a busy 2-core machine (docs/benchmarks.md). Half a second is therefore
#: several times the largest catalogue's worst compose, yet short enough that an
#: agent's tool call fails fast, closed, instead of hanging on a wedged OPA. The
#: whole exchange must also end within connect timeout + 2 x timeout.
DEFAULT_TIMEOUT: Final = 0.5
#: Seconds to wait for a connection. A loopback connect either succeeds at once or is
#: refused at once; taking longer means the machine is in trouble.
DEFAULT_CONNECT_TIMEOUT: Final = 0.25
#: Seconds added to the timeout for each tool of the catalogue, for a question whose
#: work and answer grow with the whole catalogue (:func:`whole_catalogue_timeout`).
#: Explaining compose gives six checks, each with the facts it read, for every tool:
#: with both cores of a 2-core machine loaded, its slowest exchange took 0.9 s at
#: 1,000 tools and 5.5 s (a 6 MB answer) at 10,000, against 8 and 31 ms for compose
#: (docs/benchmarks.md). No fixed timeout fits both: half a second is short of the
#: 1,000-tool explanation there, and whatever fits 10,000 tools would let a wedged
#: OPA hold an agent's call for seconds. Two ms a tool gives the slowest of those
#: exchanges three to four times what it took, and the whole-answer deadline
#: doubles that again.
PER_TOOL_TIMEOUT: Final = 0.002

# Base URL used for unix sockets: the host is never resolved, only sent as Host header.
_UDS_BASE_URL: Final = "http://opa"
# Policy paths are fixed by the caller; refusing anything else keeps "..", "?" and
# "%2e" tricks out of the URL.
_PATH_RE: Final = re.compile(r"^[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*$")

_D = TypeVar("_D", bound=BaseModel)
_P = TypeVar(
    "_P",
    ComposeDecision,
    ExecuteDecision,
    ReviewDecision,
    ComposeExplanation,
    ExecuteExplanation,
)


@dataclass(frozen=True)
class _Endpoint:
    """Where to send requests: a base URL and, for a unix socket, its path."""

    base_url: str
    uds: str | None


def _parse_address(address: str) -> _Endpoint:
    """Accept ``http://<loopback IP>[:port]`` or ``unix:///abs/path``; refuse the rest."""
    parts = urlsplit(address)
    if parts.query or parts.fragment:
        raise ValueError(f"OPA address {address!r} must not carry a query or fragment")
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(
                f"OPA address {address!r}: a unix socket address is unix:///absolute/path"
            )
        return _Endpoint(base_url=_UDS_BASE_URL, uds=parts.path)
    if parts.scheme != "http":
        raise ValueError(
            f"OPA address {address!r}: scheme must be 'http' (loopback) or 'unix'; "
            "policy traffic never leaves this machine, so TLS is not offered"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"OPA address {address!r} must not carry credentials")
    if parts.path not in ("", "/"):
        raise ValueError(f"OPA address {address!r} must not carry a path")
    host = parts.hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"OPA address {address!r}: host must be a loopback IP literal such as "
            "127.0.0.1 or [::1], not a name that a resolver could point elsewhere"
        ) from None
    if not ip.is_loopback:
        raise ValueError(
            f"OPA address {address!r}: host {host} is not a loopback address; "
            "policy traffic must not leave this machine"
        )
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(f"OPA address {address!r} has a malformed port") from None
    return _Endpoint(base_url=f"http://{parts.netloc}", uds=None)


# The deadline of the request being made (see gateway.policy.wire): set per
# request by PolicyClient._ask and PolicyClient.health.
_deadline = DEADLINE


#: The longest bearer token accepted; capgate's own are 43 characters.
MAX_TOKEN_CHARS: Final = 4096
# RFC 6750's b64token, which is what can travel in a header unquoted and unaltered.
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def check_token(token: str) -> str:
    """``token`` if it can be sent as a bearer token, else ValueError.

    RFC 6750's token characters only (letters, digits, ``-._~+/``, then ``=``
    padding), at most :data:`MAX_TOKEN_CHARS`: anything else (a space, a line break
    that would start another header, a non-ASCII letter) is refused before it is
    sent. The message never quotes the token.
    """
    if not isinstance(token, str) or not token:
        raise ValueError("the OPA token is empty")
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"the OPA token is longer than {MAX_TOKEN_CHARS} characters")
    if not _TOKEN_RE.fullmatch(token):
        raise ValueError(
            "the OPA token holds a character a bearer token may not (allowed: letters, "
            "digits, - . _ ~ + / and trailing =)"
        )
    return token


def whole_catalogue_timeout(timeout: float, tools: int) -> float:
    """The read and write timeout of a question about every tool of a catalogue.

    ``timeout`` plus :data:`PER_TOOL_TIMEOUT` for each of the catalogue's ``tools``:
    the one rule for every question whose work and answer grow with the catalogue
    (``capgate/explain/compose``, so ``compose(facts, reasons=True)``, ``capgate
    explain compose`` and ``capgate eval compose``; each question of ``capgate
    diff``'s matrix). The answer must still be complete within the connect timeout
    plus twice this. The questions an agent's calls wait on (compose, execute,
    review) keep ``timeout`` itself, so a wedged OPA still fails a call closed in a
    second or so; only a question asked for people and audits waits longer.
    """
    if tools < 0:
        raise ValueError("a catalogue has no fewer than 0 tools")
    return timeout + PER_TOOL_TIMEOUT * tools


@dataclass(frozen=True)
class _Limits:
    """How long one kind of question may take: each read and write, and the whole
    exchange (connect, request, head and body), and what to say when it is past."""

    timeout: float
    connect_timeout: float
    #: How ``timeout`` was reached, for the message (empty for a plain timeout).
    basis: str = ""

    @property
    def whole(self) -> float:
        """The seconds the whole exchange may take: connect plus twice the timeout."""
        return self.connect_timeout + 2 * self.timeout

    @cached_property
    def timeouts(self) -> dict[str, float | None]:
        """httpx's timeout extension: connect, read, write and pool."""
        return httpx.Timeout(self.timeout, connect=self.connect_timeout).as_dict()

    def describe(self) -> str:
        return (
            f"read timeout {self.timeout:g}s{self.basis}, connect {self.connect_timeout:g}s, "
            f"whole answer {self.whole:g}s"
        )


#: What a timeout message says to do about it, whoever built the client.
_RAISE_HINT: Final = (
    "if OPA is only slow, give a longer timeout: --timeout of the capgate command, or "
    "timeout= of PolicySidecar or PolicyClient"
)


def _check_path(path: str) -> str:
    if not _PATH_RE.fullmatch(path):
        raise ValueError(f"policy path {path!r} must be slash-separated rule names")
    return path


def _encode_input(path: str, input: dict[str, Any]) -> bytes:
    """The request body; a value that is not plain JSON is the caller's bug."""
    try:
        return json.dumps({"input": input}, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        # Name the kind of problem, not the offending value: it is part of the input.
        raise InvalidInput(
            f"input for {path} is not plain JSON ({type(exc).__name__}); OPA was not asked"
        ) from None


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
class _Head:
    """The parts of a response's head that a usable OPA answer must get right."""

    status: int
    http_version: str = "HTTP/1.1"
    content_type: str | None = "application/json"
    content_encoding: str | None = None


@dataclass(frozen=True)
class _Answer:
    """A parsed OPA answer: the result and what OPA says it was made under."""

    result: Any
    decision_id: str | None
    opa_version: str | None
    bundle_revisions: dict[str, str]


def _parse_answer(path: str, head: _Head, body: bytes) -> _Answer:
    """Read a raw OPA answer, or raise PolicyUnavailable.

    Pure: takes what came over the wire, so every malformed case is testable alone.
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
    if (head.content_encoding or "identity").strip().lower() not in _ENCODINGS:
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
    return _Answer(document["result"], decision_id, opa_version, revisions)


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


def _validate(path: str, model: type[_D], answer: _Answer) -> _D:
    """Fit a result object to its decision model; any misfit means no decision."""
    result = answer.result
    if not isinstance(result, dict):
        raise PolicyUnavailable(f"decision {path} is a {type(result).__name__}, not an object")
    for name in ATTACHED_FIELDS:
        if name in result:
            # These come from OPA's envelope, attached here; a policy that set its
            # own would mask them.
            raise PolicyUnavailable(f"decision {path} sets {name} itself")
    document = {
        **result,
        "decision_id": answer.decision_id,
        "bundle_revisions": answer.bundle_revisions,
        "opa_version": answer.opa_version,
    }
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['type']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise PolicyUnavailable(
            f"decision {path} does not fit {model.__name__}: {problems}"
        ) from None
    except RecursionError:
        raise PolicyUnavailable(f"decision {path} is nested too deeply to check") from None


#: Content encodings accepted in an answer: OPA compresses with gzip when asked to.
_ENCODINGS: Final = frozenset({"identity", "gzip"})

#: The largest answer read. Compose for 10,000 tools names its visible tools only
#: (about 10 kB for 476 visible); explaining it, six checks per tool, is some MB.
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024


def _read_bounded(response: httpx.Response, path: str, deadline: float, limits: _Limits) -> bytes:
    """The whole body, within the size cap and the deadline, or PolicyUnavailable.

    The size cap counts decoded bytes, so a small compressed body cannot inflate past
    it. The deadline is also enforced below, in :class:`_DeadlineStream`; checking it
    here as well covers transports without that stream (tests pass their own).
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise PolicyUnavailable(f"OPA's answer to {path} is over {MAX_ANSWER_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise PolicyUnavailable(f"OPA's answer to {path} is over {MAX_ANSWER_BYTES} bytes")
        if time.monotonic() > deadline:
            raise PolicyUnavailable(
                f"OPA did not finish answering {path} in time ({limits.describe()}); {_RAISE_HINT}"
            )
        chunks.append(chunk)
    return b"".join(chunks)


class PolicyClient:
    """A keep-alive HTTP client for one OPA, answering with typed decisions.

    ``address`` is ``http://127.0.0.1:8181`` (any loopback IP literal, ``[::1]``
    included) or ``unix:///abs/path/opa.sock``; anything else raises ValueError here,
    before a request is sent. ``connect_timeout`` bounds the connect and ``timeout``
    each write, read and wait for a pooled connection; on top of these, the whole
    exchange (connect, request, response head and body) must finish within
    ``connect_timeout + 2 * timeout`` seconds or fails closed. ``transport``
    replaces the network for tests (``httpx.MockTransport``); only the body-reading
    part of the deadline applies to it.

    ``catalogue_size`` is the number of tools in the catalogue OPA serves
    (:class:`~capgate.gateway.opa.sidecar.PolicySidecar` passes it). A question about every
    tool at once (:meth:`explain_compose`, and so ``compose(reasons=True)``) is held
    to :attr:`catalogue_timeout` instead of ``timeout``:
    :func:`whole_catalogue_timeout`, ``timeout`` plus :data:`PER_TOOL_TIMEOUT` a
    tool, as its cost grows with the catalogue. Without it, such a question waits
    as long as any other, which suits a catalogue of a few dozen tools only.

    ``expected_catalogue`` pins the catalogue digest every compose and execute
    decision must carry, and ``expected_revision`` the bundle revision OPA must
    report for every answer (any other non-empty revision, or none at all, fails
    closed). Each decision carries the bundle revisions OPA reported, pinned or not,
    so traces show what answered.

    ``token`` is the bearer token a locked-down OPA requires (see
    :func:`check_token` for what is accepted); it is sent with every request and
    shown nowhere (``repr`` says only that one is set).

    One ``httpx.Client`` is kept for the client's lifetime so decisions reuse a warm
    connection. Use it as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        expected_catalogue: str | None = None,
        expected_revision: str | None = None,
        token: str | None = None,
        catalogue_size: int | None = None,
    ) -> None:
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeouts must be positive: waiting forever would not fail closed")
        if catalogue_size is not None and catalogue_size < 0:
            raise ValueError("catalogue_size is a number of tools, 0 or more")
        if expected_catalogue == "" or expected_revision == "":
            raise ValueError("an expected catalogue digest or revision must not be empty")
        headers = {"Accept-Encoding": "gzip"}
        if token is not None:
            headers["Authorization"] = f"Bearer {check_token(token)}"
        endpoint = _parse_address(address)
        if transport is None:
            transport = DeadlineTransport(uds=endpoint.uds)
        self.address = address
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.catalogue_size = catalogue_size
        #: Each read and write of a question about every tool of the catalogue
        #: (:meth:`explain_compose`); ``timeout`` when the catalogue's size is unknown.
        self.catalogue_timeout = whole_catalogue_timeout(timeout, catalogue_size or 0)
        self.expected_catalogue = expected_catalogue
        self.expected_revision = expected_revision
        #: Whether a bearer token is sent (the token itself is never kept in reach).
        self.has_token = token is not None
        self._closed = False
        self._headers = headers
        self._limits = _Limits(timeout, connect_timeout)
        self._catalogue_limits = _Limits(
            self.catalogue_timeout,
            connect_timeout,
            ""
            if not catalogue_size
            else f" ({timeout:g}s + {PER_TOOL_TIMEOUT * 1000:g} ms for each of "
            f"{catalogue_size} tools)",
        )
        self._transport = transport
        # capgate's own transport takes the direct path (_exchange); any other, such
        # as a test's MockTransport, the httpx one (_send).
        self._direct = transport if isinstance(transport, DeadlineTransport) else None
        self._urls: dict[str, httpx.URL] = {}
        self._http = httpx.Client(
            base_url=endpoint.base_url,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            # Never pick up HTTP(S)_PROXY from the environment: a proxy would carry
            # policy traffic off the machine and could answer in OPA's place.
            trust_env=False,
            follow_redirects=False,
            # Accept-Encoding: what OPA can send, and no more (not brotli or zstd,
            # which httpx offers when their packages happen to be installed); see
            # _ENCODINGS. Authorization: the bearer token, on every request.
            headers=headers,
        )
        # What every request carries on the direct path, as _send gives httpx.
        self._raw_headers = [(name.encode(), value.encode()) for name, value in headers.items()]

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close the pooled connections. Further queries raise PolicyUnavailable."""
        self._closed = True
        self._http.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        token = ", token=<set>" if self.has_token else ""
        return f"PolicyClient({self.address!r}, timeout={self.timeout}{token})"

    # -- decisions -------------------------------------------------------------

    def compose(self, facts: ComposeInput, *, reasons: bool = False) -> ComposeDecision:
        """Which tools may this agent see now? One query, one typed answer.

        The answer names the visible tools only. With ``reasons``, the client also
        asks :meth:`explain_compose` and fills ``excluded`` with the reasons that
        hide every other tool (messages from :mod:`capgate.gateway.model.reasons`), refusing
        both answers if they disagree: for people and audits, not for agents.
        """
        # Same serialisation as ExecuteInput.to_opa: None fields are sent as null.
        answer = self._query(COMPOSE_PATH, facts.model_dump(mode="json"))
        decision = self._check_catalogue(
            COMPOSE_PATH, _validate(COMPOSE_PATH, ComposeDecision, answer)
        )
        if not reasons:
            return decision
        return with_reasons(decision, self.explain_compose(facts))

    def explain_compose(self, facts: ComposeInput) -> ComposeExplanation:
        """Every tool, check by check, for these compose facts (``capgate/explain/compose``).

        A question about the whole catalogue: held to :attr:`catalogue_timeout`.
        """
        answer = self._query(
            EXPLAIN_COMPOSE_PATH, facts.model_dump(mode="json"), self._catalogue_limits
        )
        return self._check_catalogue(
            EXPLAIN_COMPOSE_PATH, _validate(EXPLAIN_COMPOSE_PATH, ComposeExplanation, answer)
        )

    def explain_execute(self, facts: ExecuteInput) -> ExecuteExplanation:
        """Every check execute makes of this call (``capgate/explain/execute``)."""
        answer = self._query(EXPLAIN_EXECUTE_PATH, facts.to_opa())
        return self._check_catalogue(
            EXPLAIN_EXECUTE_PATH, _validate(EXPLAIN_EXECUTE_PATH, ExecuteExplanation, answer)
        )

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        """May this exact call run? One query, one typed answer."""
        answer = self._query(EXECUTE_PATH, facts.to_opa())
        return self._check_catalogue(EXECUTE_PATH, _validate(EXECUTE_PATH, ExecuteDecision, answer))

    def review(self, facts: ReviewInput) -> ReviewDecision:
        """May this reviewer give this verdict on this proposal? One query."""
        answer = self._query(REVIEW_PATH, facts.to_opa())
        return self._check_catalogue(REVIEW_PATH, _validate(REVIEW_PATH, ReviewDecision, answer))

    def query(self, path: str, input: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """POST ``input`` to ``/v1/data/<path>``; return ``(result, decision_id)``.

        The result must be a JSON object. ``decision_id`` is None when OPA runs
        without decision logging. Raises PolicyUnavailable for every failure to get
        such an answer (see the module docstring), InvalidInput if ``input`` is not
        plain JSON, and ValueError for a malformed ``path``.
        """
        answer = self._query(path, input)
        if not isinstance(answer.result, dict):
            raise PolicyUnavailable(
                f"decision {path} is a {type(answer.result).__name__}, not an object"
            )
        return answer.result, answer.decision_id

    def _query(self, path: str, input: dict[str, Any], limits: _Limits | None = None) -> _Answer:
        _check_path(path)
        body = _encode_input(path, input)
        return self._ask(
            "POST",
            path,
            f"/v1/data/{path}",
            limits,
            content=body,
            headers={"Content-Type": "application/json"},
        )

    def _check_catalogue(self, path: str, decision: _P) -> _P:
        """Refuse a decision made under another catalogue than the one expected."""
        expected = self.expected_catalogue
        if expected is not None and decision.catalogue_digest != expected:
            raise PolicyUnavailable(
                f"decision {path} was made under catalogue {decision.catalogue_digest}, "
                f"but this client expects {expected}: OPA no longer serves the catalogue "
                "this process loaded"
            )
        return decision

    # -- checks on the OPA itself ------------------------------------------------

    def health(self, bundles: bool = True) -> bool:
        """True when OPA answers its health check (with ``bundles``: all activated).

        Answers False rather than raising: callers poll this while OPA starts. Any
        answer but 200 is False: 500 while a bundle is not active yet, and, on a
        locked-down OPA, 500 before the bundle carrying ``system.authz`` is active
        (OPA then refuses everything) or 401 if its policy refuses the request.
        """
        url = "/health?bundles=true" if bundles else "/health"
        if self._closed:
            return False
        token = _deadline.set(time.monotonic() + self._limits.whole)
        try:
            response = self._http.get(url)
        except httpx.HTTPError:
            return False
        finally:
            _deadline.reset(token)
        return response.status_code == 200

    def ready(self) -> bool:
        """True when OPA is healthy with every configured bundle activated.

        ``GET /health?bundles=true`` answering 200, within the client's deadline. A
        sidecar that has not activated its bundle yet (none served, none that verifies)
        is not ready, and its decisions would be refused anyway: see
        :meth:`capgate.gateway.opa.sidecar.PolicySidecar.ready`, which also checks the catalogue.
        """
        return self.health(bundles=True)

    def catalogue_digest(self) -> str:
        """The digest of the catalogue OPA serves, to compare with the one loaded.

        Raises PolicyUnavailable if OPA serves no catalogue or a malformed digest.
        """
        path = CATALOGUE_DIGEST_PATH
        result = self._ask("GET", path, f"/v1/data/{path}", None).result
        if not isinstance(result, str) or not result:
            raise PolicyUnavailable(f"{path} is not a non-empty string")
        return result

    # -- the edge --------------------------------------------------------------

    def _ask(
        self, method: str, path: str, url: str, limits: _Limits | None, **kwargs: Any
    ) -> _Answer:
        """Send one request and parse it; every transport failure leaves as PolicyUnavailable.

        ``limits`` bound the exchange: the client's own (``timeout``) when None.
        """
        if self._closed:
            raise PolicyUnavailable(f"policy client is closed; {path} not asked")
        limits = limits or self._limits
        started = time.perf_counter()
        # One deadline for the whole exchange: httpx times each socket operation, so
        # an OPA (or impostor) trickling bytes could otherwise hold a call for ever.
        # _DeadlineStream holds every connect, write and read to it.
        deadline = time.monotonic() + limits.whole
        token = _deadline.set(deadline)
        try:
            if self._direct is not None:
                head, content = self._exchange(
                    self._direct, method, path, url, limits.timeouts, **kwargs
                )
            else:
                response = self._send(method, url, limits.timeouts, **kwargs)
                try:
                    head = _Head(
                        response.status_code,
                        response.http_version,
                        response.headers.get("content-type"),
                        response.headers.get("content-encoding"),
                    )
                    content = _read_bounded(response, path, deadline, limits)
                finally:
                    response.close()
        except httpx.TimeoutException as exc:
            self._log(path, started, None, type(exc).__name__)
            raise PolicyUnavailable(
                f"OPA did not answer {path} in time ({type(exc).__name__}; "
                f"{limits.describe()}); {_RAISE_HINT}"
            ) from exc
        except httpx.ConnectError as exc:
            self._log(path, started, None, "ConnectError")
            raise PolicyUnavailable(
                f"OPA at {self.address} is unreachable for {path}: {exc}"
            ) from exc
        except httpx.HTTPError as exc:
            self._log(path, started, None, type(exc).__name__)
            raise PolicyUnavailable(
                f"transport error asking OPA for {path}: {type(exc).__name__}: {exc}"
            ) from exc
        except PolicyUnavailable as exc:
            self._log(path, started, None, str(exc))
            raise
        finally:
            _deadline.reset(token)
        try:
            answer = _parse_answer(path, head, content)
            self._check_revision(path, answer)
        except PolicyUnavailable as exc:
            self._log(path, started, None, f"bad answer (HTTP {head.status})")
            if head.status == 401:
                raise PolicyUnavailable(f"{exc}: {self._refused_hint()}") from None
            raise
        self._log(path, started, answer.decision_id, None)
        return answer

    def _exchange(
        self,
        transport: DeadlineTransport,
        method: str,
        path: str,
        url: str,
        timeouts: dict[str, float | None],
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[_Head, bytes]:
        """One exchange through capgate's own transport, skipping httpx's models.

        The request is the one :meth:`_send` would build (same URL, the client's
        headers and the request's, Host and Content-Length as httpx sets them, no
        redirect followed), and the answer is held to the same size cap; building
        and reading httpx's request and response objects cost about a tenth of an
        authorised call in Python (docs/benchmarks.md). Other transports (tests'
        ``httpx.MockTransport``) go through :meth:`_send`.
        """
        target = self._target(url)
        sent = [(b"Host", target.netloc), *self._raw_headers]
        sent += [
            (name.encode("ascii"), value.encode("ascii")) for name, value in (headers or {}).items()
        ]
        if content is not None:
            sent.append((b"Content-Length", str(len(content)).encode("ascii")))
        try:
            answer = transport.exchange(method, target, sent, content, timeouts, MAX_ANSWER_BYTES)
        except AnswerTooLarge:
            raise PolicyUnavailable(
                f"OPA's answer to {path} is over {MAX_ANSWER_BYTES} bytes"
            ) from None
        head = _Head(
            answer.status, answer.http_version, answer.content_type, answer.content_encoding
        )
        return head, answer.body

    def _target(self, url: str) -> httpx.URL:
        """The absolute URL of a policy path, with ``?provenance=true``, parsed once."""
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = self._http.base_url.join(url).copy_merge_params(
                {"provenance": "true"}
            )
        return target

    def _send(
        self, method: str, url: str, timeouts: dict[str, float | None], **kwargs: Any
    ) -> httpx.Response:
        """One request straight to the transport, bypassing ``httpx.Client.send``.

        The client's machinery (URL merging and parsing, cookies, auth flows,
        redirects, event hooks) does nothing for a fixed loopback OPA, and costs a
        third of a decision's time in Python (docs/benchmarks.md). The request is
        what the client would build: its headers (Accept-Encoding, the token), its
        timeouts, ``?provenance=true``, and no redirect followed (a 3xx is an answer
        that is not 200, refused). The URL of each policy path is parsed once.
        """
        target = self._target(url)
        request = httpx.Request(
            method,
            target,
            headers={**self._headers, **kwargs.pop("headers", {})},
            extensions={"timeout": timeouts},
            **kwargs,
        )
        response = self._transport.handle_request(request)
        response.request = request
        return response

    def _refused_hint(self) -> str:
        if self.has_token:
            return (
                "OPA refused this client's token; is it the gateway token of the "
                "deployment whose bundle OPA serves?"
            )
        return (
            "OPA requires a token (it runs with --authentication=token); give the "
            "gateway's token with $CAPGATE_OPA_TOKEN_FILE or $CAPGATE_OPA_TOKEN"
        )

    def _check_revision(self, path: str, answer: _Answer) -> None:
        """With a pinned revision, OPA must report it and no other for the answer."""
        expected = self.expected_revision
        if expected is None:
            return
        served = sorted({revision for revision in answer.bundle_revisions.values() if revision})
        if served != [expected]:
            shown = ", ".join(_shown(revision) for revision in served) or "none"
            raise PolicyUnavailable(
                f"OPA answered {path} from bundle revision(s) {shown}, but this client "
                f"expects {expected}: OPA no longer serves the bundle it was started with"
            )

    @staticmethod
    def _log(path: str, started: float, decision_id: str | None, failure: str | None) -> None:
        # Path, latency and decision id only: inputs and results stay out of logs.
        ms = (time.perf_counter() - started) * 1000
        if failure is None:
            log.debug("opa %s in %.1f ms, decision_id=%s", path, ms, decision_id)
        else:
            log.debug("opa %s failed after %.1f ms: %s", path, ms, failure)
