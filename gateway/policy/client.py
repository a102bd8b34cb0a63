"""Ask the OPA sidecar for decisions and return them typed; never enforce anything.

The client is the one place where HTTP meets policy. It knows which question to ask,
how long each may take, and what a usable answer looks like; it does not know what
an answer means. Every way an answer can be missing, malformed or ambiguous ends in
:class:`capgate.gateway.errors.PolicyUnavailable`, so the dispatcher sees either a
validated decision or a refusal, and a broken OPA can never be read as an allow::

    PolicyClient.compose / execute / review / link / explain_* / query / catalogue_digest
    ├── OPA not reached, or not in time        -> PolicyUnavailable (edge.Edge.ask)
    ├── an answer that is not a usable one     -> PolicyUnavailable (answer.parse_answer)
    ├── pinned bundle revision not the one     -> PolicyUnavailable (answer.check_revision)
    ├── result does not fit the decision model -> PolicyUnavailable (answer.validate)
    ├── made under another catalogue digest    -> PolicyUnavailable (answer.check_catalogue)
    ├── compose(reasons=True): explanation and
    │   decision disagree                      -> PolicyUnavailable
    ├── input that is not plain JSON           -> InvalidInput (OPA not asked)
    └── a malformed policy path                -> ValueError (OPA not asked)

The room's other modules each do one of the jobs: ``address`` where OPA is (loopback
or a unix socket) and which token may be sent; ``timeouts`` how long a question may
take; ``edge`` each request and the translation of every failure; ``answer`` the
pure reading of an answer into a decision; ``wire`` and ``framing`` the HTTP/1.1
exchange itself.

Every query asks for OPA's provenance, so each decision records the bundle
revisions and OPA version it was made under, next to the catalogue digest that the
policy itself puts in the decision. A client given the digest (and revision) it
expects refuses a decision made under anything else: an OPA restarted with another
bundle behind the same address must not be obeyed.

Messages name the policy path and what went wrong, never the input: facts carry
tenant and principal names, and errors end up in logs and agent transcripts.
:meth:`PolicyClient.ready` asks OPA whether it is healthy with every bundle active.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

import httpx

from capgate.gateway.errors import InvalidInput, PolicyUnavailable
from capgate.gateway.model.decisions import (
    ComposeDecision,
    ComposeExplanation,
    ExecuteDecision,
    ExecuteExplanation,
    LinkDecision,
    ReviewDecision,
    policy_revision,
)
from capgate.gateway.model.facts import ComposeInput, ExecuteInput, LinkInput, ReviewInput
from capgate.gateway.model.reasons import with_reasons
from capgate.gateway.policy.address import OPAAddress
from capgate.gateway.policy.answer import Decided, Envelope, check_catalogue, validate
from capgate.gateway.policy.edge import Edge
from capgate.gateway.policy.timeouts import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    PER_TOOL_TIMEOUT,
    Limits,
    whole_catalogue_timeout,
)

__all__ = [
    "CATALOGUE_DIGEST_PATH",
    "COMPOSE_PATH",
    "EXECUTE_PATH",
    "EXPLAIN_COMPOSE_PATH",
    "EXPLAIN_EXECUTE_PATH",
    "LINK_PATH",
    "REVIEW_PATH",
    "Exchange",
    "PolicyClient",
    "ServedCatalogue",
]

COMPOSE_PATH: Final = "capgate/compose/decision"
EXECUTE_PATH: Final = "capgate/execute/decision"
REVIEW_PATH: Final = "capgate/review/decision"
LINK_PATH: Final = "capgate/link/decision"
EXPLAIN_COMPOSE_PATH: Final = "capgate/explain/compose"
EXPLAIN_EXECUTE_PATH: Final = "capgate/explain/execute"
CATALOGUE_DIGEST_PATH: Final = "capgate/catalogue/meta/digest"

#: The question each decision path asks, as :class:`Exchange` names it (a bounded
#: set: a metrics label); any other path is a ``query``.
_QUESTIONS: Final = {
    COMPOSE_PATH: "compose",
    EXECUTE_PATH: "execute",
    REVIEW_PATH: "review",
    LINK_PATH: "link",
    EXPLAIN_COMPOSE_PATH: "explain",
    EXPLAIN_EXECUTE_PATH: "explain",
    CATALOGUE_DIGEST_PATH: "catalogue",
}


@dataclass(frozen=True, slots=True)
class Exchange:
    """One question's round trip to OPA, as an ``on_exchange`` observer hears it.

    ``seconds`` is the whole exchange (connect or pooled connection, request, the
    answer read), not the time the caller spent before or after; ``answered`` is
    False when no answer came (refused, timed out, not HTTP 200), whatever then
    became of a malformed one.
    """

    question: str
    seconds: float
    answered: bool


# Policy paths are fixed by the caller; refusing anything else keeps "..", "?" and
# "%2e" tricks out of the URL.
_PATH_RE: Final = re.compile(r"^[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*$")


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


@dataclass(frozen=True)
class ServedCatalogue:
    """What OPA serves: the compiled catalogue's digest, and the revision of the
    bundles it answered from (:func:`~capgate.gateway.model.decisions.policy_revision`;
    None when they carry none)."""

    digest: str
    revision: str | None


class PolicyClient:
    """A keep-alive HTTP client for one OPA, answering with typed decisions.

    ``address`` is ``http://127.0.0.1:8181`` (any loopback IP literal, ``[::1]``
    included) or ``unix:///abs/path/opa.sock``; anything else raises ValueError here,
    before a request is sent (:func:`~capgate.gateway.policy.address.parse_address`).
    An :class:`~capgate.gateway.policy.address.OPAAddress` says where the address came
    from too, so that an unreachable OPA is reported with where to look.
    ``connect_timeout`` bounds the connect and ``timeout`` each write, read and wait
    for a pooled connection; on top of these, the whole exchange (connect, request,
    response head and body) must finish within ``connect_timeout + 2 * timeout``
    seconds or fails closed (:mod:`capgate.gateway.policy.timeouts`). ``transport``
    replaces the network for tests (``httpx.MockTransport``); only the body-reading
    part of the deadline applies to it.

    ``catalogue_size`` is the number of tools in the catalogue OPA serves
    (:class:`~capgate.gateway.opa.sidecar.PolicySidecar` passes it). A question about every
    tool at once (:meth:`explain_compose`, and so ``compose(reasons=True)``) is held
    to :attr:`catalogue_timeout` instead of ``timeout``:
    :func:`~capgate.gateway.policy.timeouts.whole_catalogue_timeout`, ``timeout`` plus
    ``PER_TOOL_TIMEOUT`` a tool, as its cost grows with the catalogue. Without it,
    such a question waits as long as any other, which suits a catalogue of a few
    dozen tools only.

    ``expected_catalogue`` pins the catalogue digest every compose and execute
    decision must carry, and ``expected_revision`` the bundle revision OPA must
    report for every answer (any other non-empty revision, or none at all, fails
    closed). Each decision carries the bundle revisions OPA reported, pinned or not,
    so traces show what answered.

    ``token`` is the bearer token a locked-down OPA requires (see
    :func:`~capgate.gateway.policy.address.check_token` for what is accepted); it is
    sent with every request and shown nowhere (``repr`` says only that one is set).

    ``on_exchange`` hears each question's round trip (:class:`Exchange`: which
    question, how long, whether OPA answered), for the metrics' latency histogram;
    it is told nothing of the input or the answer.

    One ``httpx.Client`` is kept for the client's lifetime so decisions reuse a warm
    connection. Use it as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        address: str | OPAAddress,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        expected_catalogue: str | None = None,
        expected_revision: str | None = None,
        token: str | None = None,
        catalogue_size: int | None = None,
        on_exchange: Callable[[Exchange], None] | None = None,
    ) -> None:
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeouts must be positive: waiting forever would not fail closed")
        if catalogue_size is not None and catalogue_size < 0:
            raise ValueError("catalogue_size is a number of tools, 0 or more")
        if expected_catalogue == "" or expected_revision == "":
            raise ValueError("an expected catalogue digest or revision must not be empty")
        self._limits = Limits(timeout, connect_timeout)
        location = address if isinstance(address, OPAAddress) else OPAAddress(address)
        self._edge = Edge(
            location,
            self._limits,
            transport=transport,
            token=token,
            expected_revision=expected_revision,
        )
        self.address = location.url
        #: The address and where it came from (``--opa``, the environment, ...).
        self.location = location
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
        self._on_exchange = on_exchange
        self._catalogue_limits = Limits(
            self.catalogue_timeout,
            connect_timeout,
            ""
            if not catalogue_size
            else f" ({timeout:g}s + {PER_TOOL_TIMEOUT * 1000:g} ms for each of "
            f"{catalogue_size} tools)",
        )

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close the pooled connections. Further queries raise PolicyUnavailable."""
        self._edge.close()

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
        decision = self._decision(COMPOSE_PATH, ComposeDecision, answer)
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
        return self._decision(EXPLAIN_COMPOSE_PATH, ComposeExplanation, answer)

    def explain_execute(self, facts: ExecuteInput) -> ExecuteExplanation:
        """Every check execute makes of this call (``capgate/explain/execute``)."""
        answer = self._query(EXPLAIN_EXECUTE_PATH, facts.to_opa())
        return self._decision(EXPLAIN_EXECUTE_PATH, ExecuteExplanation, answer)

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        """May this exact call run? One query, one typed answer."""
        answer = self._query(EXECUTE_PATH, facts.to_opa())
        return self._decision(EXECUTE_PATH, ExecuteDecision, answer)

    def review(self, facts: ReviewInput) -> ReviewDecision:
        """May this reviewer give this verdict on this proposal? One query."""
        answer = self._query(REVIEW_PATH, facts.to_opa())
        return self._decision(REVIEW_PATH, ReviewDecision, answer)

    def link(self, facts: LinkInput) -> LinkDecision:
        """May this agent change this task's links? One query."""
        answer = self._query(LINK_PATH, facts.to_opa())
        return self._decision(LINK_PATH, LinkDecision, answer)

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

    def _query(self, path: str, input: dict[str, Any], limits: Limits | None = None) -> Envelope:
        _check_path(path)
        body = _encode_input(path, input)
        if self._on_exchange is None:
            return self._edge.ask("POST", path, limits, body)
        started = time.perf_counter()
        answered = False
        try:
            envelope = self._edge.ask("POST", path, limits, body)
            answered = True
            return envelope
        finally:
            self._on_exchange(
                Exchange(_QUESTIONS.get(path, "query"), time.perf_counter() - started, answered)
            )

    def _decision(self, path: str, model: type[Decided], answer: Envelope) -> Decided:
        """The answer fitted to ``model``, made under the catalogue this client expects."""
        return check_catalogue(path, validate(path, model, answer), self.expected_catalogue)

    # -- checks on the OPA itself ------------------------------------------------

    def health(self, bundles: bool = True) -> bool:
        """True when OPA answers its health check (with ``bundles``: all activated).

        Answers False rather than raising: callers poll this while OPA starts. Any
        answer but 200 is False: 500 while a bundle is not active yet, and, on a
        locked-down OPA, 500 before the bundle carrying ``system.authz`` is active
        (OPA then refuses everything) or 401 if its policy refuses the request.
        """
        return self._edge.health_problem(bundles) is None

    def health_problem(self, bundles: bool = True) -> str | None:
        """None when :meth:`health` is True; else what went wrong, in a few words
        (connection refused, no answer in time, HTTP 401, HTTP 500 with OPA's reason,
        no bundle active yet), for a start-up wait to say the last thing it saw."""
        return self._edge.health_problem(bundles)

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
        return self.served_catalogue().digest

    def served_catalogue(self) -> ServedCatalogue:
        """The digest of the catalogue OPA serves and the revision it answered under.

        One question; a pinned revision is checked on it as on every answer. Raises
        PolicyUnavailable if OPA serves no catalogue or a malformed digest.
        """
        path = CATALOGUE_DIGEST_PATH
        answer = self._edge.ask("GET", path)
        result = answer.result
        if not isinstance(result, str) or not result:
            raise PolicyUnavailable(f"{path} is not a non-empty string")
        return ServedCatalogue(result, policy_revision(answer.bundle_revisions))
