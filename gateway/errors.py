"""One error hierarchy for capgate, each error with a stable ``code``.

Callers match on the class or on ``code``; messages are for people and may change.
Transport and parsing failures are translated into these types at the edge where
they happen, and none of them is ever turned into an allow. Whatever a caller passes
to ``Dispatcher.call``, ``Dispatcher.compose`` or ``AgentSession``, only these
errors come back::

    CapgateError                 capgate_error
    ├── CatalogueError           catalogue_invalid       a catalogue file is wrong; nothing loaded
    ├── InvalidInput             input_invalid           bad facts or parameters; OPA not asked
    │   ├── OperationConflict    operation_conflict      an operation id reused for another call
    │   ├── ResumeStateInvalid   resume_state_invalid    a resume state forged, used or expired
    │   └── UpstreamConfigError  upstream_config_invalid an MCP server spec capgate refuses
    ├── PolicyUnavailable        policy_unavailable      no usable decision: fail closed
    │   └── OPAProcessError      opa_process_failed      the embedded OPA could not start
    ├── CapabilityViolation      capability_denied       OPA said no; carries the reason codes
    │   └── ObligationUnsupported obligation_unsupported an allow whose obligations are not exactly
    │                                                    those the contract requires
    ├── ToolNotRegistered        tool_not_registered     granted, but no adapter holds the tool
    │                                                    (also a KeyError, as the seed says)
    ├── ToolNotInCatalogue       tool_not_in_catalogue   a registered name the catalogue lacks
    ├── CredentialUnavailable    credential_unavailable  a connection's secret could not be resolved
    ├── UpstreamUnavailable      upstream_unavailable    an MCP server could not be reached
    ├── ConfigError              serve_config_invalid    capgate serve's configuration file is wrong
    ├── AuthenticationFailed     authentication_failed   no known identity: nothing done
    │   └── LoginLimited         login_limited           too many failed logins: wait, then retry
    ├── RequestForged            request_forged          a browser request without its CSRF token,
    │                                                    or from another origin or host
    ├── ProposalStale            stale                   a verdict on content other than the current
    ├── NoApprovalSurface        no_approval_surface     cannot wait for a review in the request
    ├── NoticeRejected           notice_rejected         a webhook notice a receiver must not act on
    │   ├── NoticeSignatureInvalid notice_signature_invalid its signature missing, malformed, wrong
    │   ├── NoticeOutsideWindow  notice_outside_window   signed too long ago (or too far ahead)
    │   └── NoticeReplayed       notice_replayed         an event id the receiver has seen already
    ├── StoreError               store_error             the backend failed, or refused a request
    │   ├── StoreBusy            store_busy              no lock or connection in time: retry later
    │   ├── StoreVersionError    store_version_unsupported the store was written by a newer capgate
    │   ├── StoreURLError        store_url_invalid       not a store address (also a ValueError)
    │   ├── StoreNotFound        store_not_found         --store names a missing SQLite file
    │   ├── UnknownTenant        unknown_tenant          no such tenant
    │   ├── UnknownConnection    unknown_connection      the tenant has no connection of that alias
    │   ├── UnknownOperation     unknown_operation       the tenant has no operation of that id
    │   ├── OperationNotInLedger unknown_operation       the ledger has no row of that operation
    │   ├── UnknownProposal      unknown_proposal        no proposal of that id
    │   ├── UnknownReview        unknown_review          no review of that id
    │   ├── UnknownPin           unknown_pin             no pin of that upstream server and tool
    │   ├── PinStale             pin_stale               the server shows another definition now
    │   ├── DuplicateRecord      duplicate_record        a record of that id exists already
    │   │   └── DuplicateOperation duplicate_operation   a proposal holds that operation id
    │   └── BudgetNotReserved    budget_not_reserved     settling more than is reserved
    └── ToolFailed               tool_failed             it ran, but did not succeed; see .outcome

The store's errors never carry a password: a PostgreSQL store is named by its
``location``, which has none. Malformed values (a negative cost, an identifier that is
not one, a naive datetime) are :class:`InvalidInput`, as everywhere else.

Messages quote what a caller supplied (tool names, identifiers, field paths) only
through :func:`quote`, which cuts it short: a megabyte-long tool name must not come
back as a megabyte-long message in a log line or an agent transcript. They never
quote parameter values or tool output at all (those may hold secrets).
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Final

if TYPE_CHECKING:
    from pydantic import ValidationError

    from capgate.gateway.model.decisions import Reason
    from capgate.gateway.model.outcomes import Outcome

__all__ = [
    "AuthenticationFailed",
    "CapabilityViolation",
    "CapgateError",
    "CatalogueError",
    "CredentialUnavailable",
    "InvalidInput",
    "NoApprovalSurface",
    "OPAProcessError",
    "ObligationUnsupported",
    "OperationConflict",
    "PolicyUnavailable",
    "ProposalStale",
    "ResumeStateInvalid",
    "ToolFailed",
    "ToolNotInCatalogue",
    "ToolNotRegistered",
    "cut",
    "quote",
]

#: Characters of a quoted value kept by :func:`quote` unless told otherwise.
QUOTE_LIMIT: Final = 80
#: Problems (or names) listed in one message; the rest are counted.
_MAX_LISTED: Final = 3

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = QUOTE_LIMIT


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters.

    A string longer than ``limit`` keeps its beginning and says how long it was,
    ``'aaaa'… (1000000 characters)``, so the reader still recognises it. Other values
    go through :mod:`reprlib` (which also survives objects whose ``repr`` fails or
    integers too long to print). Every caller-supplied value in a capgate message
    goes through here.
    """
    if isinstance(value, str):
        text = str.__str__(value)
        if len(text) <= limit:
            shown = repr(text)
            if len(shown) <= limit + 2:
                return shown
        # Escapes can make a short prefix long ('\U0010ffff' is 12 characters):
        # shrink the prefix until its repr fits.
        keep = min(len(text), limit)
        shown = repr(text[:keep])
        while len(shown) > limit + 2 and keep > 1:
            keep //= 2
            shown = repr(text[:keep])
        return f"{shown}… ({len(text)} characters)"
    try:
        shown = _REPR.repr(value)
    except Exception:  # a hostile __repr__, an integer past the digit limit, ...
        return f"<{type(value).__name__}>"
    return shown if len(shown) <= limit + 2 else f"{shown[:limit]}…"


def cut(text: str, limit: int = 300) -> str:
    """``text`` shortened to ``limit`` characters with an ellipsis (no quotes added).

    For messages assembled from several parts, e.g. a validator's own wording.
    """
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


class CapgateError(Exception):
    """Base of every error capgate raises on purpose."""

    code: ClassVar[str] = "capgate_error"


class CatalogueError(CapgateError):
    """A catalogue file is invalid.

    ``problems`` lists every problem found, each naming the file, the tool (or other
    entry) and the field, so one run shows everything to fix. The catalogue is
    loaded whole or not at all.
    """

    code: ClassVar[str] = "catalogue_invalid"

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"catalogue is invalid ({len(self.problems)} problem(s)):\n{lines}")


class InvalidInput(CapgateError):
    """Facts, a call or its parameters are malformed; OPA and the tool were not asked."""

    code: ClassVar[str] = "input_invalid"

    @classmethod
    def from_validation(cls, exc: ValidationError, where: str) -> InvalidInput:
        """One short message naming the bad fields of a pydantic validation failure.

        Field paths come from the caller's data (a connection alias is a dict key),
        so each is cut with :func:`quote`; pydantic's ``msg`` names the rule, never
        the value. Only the first few problems are listed, the rest are counted.
        """
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        problems = [
            f"field {quote('.'.join(str(p) for p in e['loc']) or '(top)')}: "
            f"{cut(e['msg'].removeprefix('Value error, '), 240)}"
            for e in errors[:_MAX_LISTED]
        ]
        more = f"; and {len(errors) - _MAX_LISTED} more problem(s)"
        listed = cut("; ".join(problems), 400)
        return cls(f"{where}: {listed}{more if len(errors) > _MAX_LISTED else ''}")


class PolicyUnavailable(CapgateError):
    """No usable decision came back from OPA, so the call is refused (fail closed).

    Raised for an unreachable OPA, a timeout, a non-200 answer, a body that is not
    JSON, an undefined result and a result of the wrong shape alike.
    """

    code: ClassVar[str] = "policy_unavailable"


class OPAProcessError(PolicyUnavailable):
    """The embedded OPA process failed to start or to activate its bundle."""

    code: ClassVar[str] = "opa_process_failed"


class CapabilityViolation(CapgateError):
    """OPA denied the call. ``reasons`` holds the stable reason codes it gave."""

    code: ClassVar[str] = "capability_denied"

    def __init__(
        self,
        tool: str,
        reasons: Sequence[Reason],
        *,
        decision_id: str | None = None,
    ) -> None:
        self.tool = tool
        self.reasons = list(reasons)
        self.decision_id = decision_id
        #: The policy revision the denial was made under, when the dispatcher knows it.
        self.revision: str | None = None
        codes = ", ".join(cut(r.code, 40) for r in self.reasons[:10]) or "no reason given"
        if len(self.reasons) > 10:
            codes += f" and {len(self.reasons) - 10} more"
        super().__init__(f"call to {quote(tool)} denied: {codes}{self._detail()}")

    def _detail(self) -> str:
        """More text for the message; the policy's own reason messages stay out of it
        (they name facts such as tenants and roles)."""
        return ""

    @property
    def reason_codes(self) -> list[str]:
        """The codes alone, sorted, for matching in callers and tests."""
        return sorted(r.code for r in self.reasons)


class ObligationUnsupported(CapabilityViolation):
    """OPA allowed the call under obligations other than those this dispatcher keeps.

    The dispatcher derives from the tool's contract exactly which obligations an
    allow must carry (for an ``idempotent_with_key`` tool, ``pass_idempotency_key``
    with the call's operation id as the key) and refuses any allow whose obligations
    differ: one it does not know, one missing, one extra or repeated, or one with
    other parameters. Keeping half of a conditional allow would be weaker than the
    policy said, and an allow that omits a condition the contract needs (running a
    keyed tool with no key) is a policy bug that must not reach the tool. Each reason
    (code ``obligation_unsupported``) says which of these it was.
    """

    code: ClassVar[str] = "obligation_unsupported"

    def _detail(self) -> str:
        # These messages are the dispatcher's own, not the policy's: safe to show.
        return " (" + "; ".join(r.message for r in self.reasons[:5]) + ")" if self.reasons else ""


class ToolNotRegistered(CapgateError, KeyError):
    """Policy granted the tool, but no adapter in this process can run it.

    Also a ``KeyError``, as the tool contract promises for "granted but not
    registered": code written against a plain registry (``except KeyError``) keeps
    working. Its text is the message itself, not ``KeyError``'s quoted repr.
    """

    code: ClassVar[str] = "tool_not_registered"

    def __init__(self, tool: str) -> None:
        self.tool = tool
        super().__init__(f"tool {quote(tool)} is granted but not registered with any adapter")

    def __str__(self) -> str:
        return Exception.__str__(self)


class ToolNotInCatalogue(CapgateError):
    """A tool was registered under a name the catalogue does not define.

    Such a tool could never be called (OPA denies every unknown tool), so the name
    is almost certainly a typo; ``suggestions`` maps each name to the closest
    catalogue name, if any.
    """

    code: ClassVar[str] = "tool_not_in_catalogue"

    def __init__(self, names: Sequence[str], suggestions: dict[str, list[str]]) -> None:
        self.names = list(names)
        self.suggestions = suggestions
        parts = []
        for name in self.names[:_MAX_LISTED]:
            close = suggestions.get(name) or []
            hint = f" (did you mean {quote(close[0])}?)" if close else ""
            parts.append(f"{quote(name)}{hint}")
        if len(self.names) > _MAX_LISTED:
            parts.append(f"and {len(self.names) - _MAX_LISTED} more")
        super().__init__(
            f"registered tool(s) not in the catalogue: {', '.join(parts)}; "
            "add them to tools.yaml or fix the name"
        )


class OperationConflict(InvalidInput):
    """An operation id was used again for another call (other tool or parameters).

    The same id with the same call returns the first outcome without a second side
    effect; with anything else it is a mistake (or an attempt to ride on another
    call's approval), so nothing is asked or run.
    """

    code: ClassVar[str] = "operation_conflict"


class CredentialUnavailable(CapgateError):
    """The secret behind a connection alias could not be resolved; nothing was run."""

    code: ClassVar[str] = "credential_unavailable"


class ToolFailed(CapgateError):
    """An authorised tool ran but its outcome is not a success.

    Raised only by the agent-side ``call_tool`` helper, which promises a result dict;
    the dispatcher itself returns the :class:`~capgate.gateway.model.outcomes.Outcome` instead.
    """

    code: ClassVar[str] = "tool_failed"

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        hint = f"; recovery: {outcome.recovery}" if outcome.recovery else ""
        # The tool's own error text stays on .outcome: it is untrusted and may quote
        # provider responses, and exception messages tend to end up in logs.
        super().__init__(
            f"tool {quote(outcome.tool)} ended {outcome.status.value} "
            f"(operation {quote(outcome.operation_id)}){hint}"
        )


# -- the store ----------------------------------------------------------------------------


class StoreError(CapgateError):
    """The store failed (backend error, closed store, misuse) or refused a request.

    Backend exceptions (``sqlite3.Error``, ``psycopg.Error``) are translated into
    this family where they happen; the original is chained as ``__cause__``.
    """

    code: ClassVar[str] = "store_error"


class StoreBusy(StoreError):
    """A lock, a database file or a pooled connection was not had in time.

    The transaction was rolled back whole; repeating it later is safe.
    """

    code: ClassVar[str] = "store_busy"


class StoreVersionError(StoreError):
    """The store's schema is newer than this code reads; nothing was changed.

    Reading a schema this code does not know could misread a fact that grants
    something, so the store is refused instead.
    """

    code: ClassVar[str] = "store_version_unsupported"

    def __init__(
        self, location: str, found: int, supported: int, written_by: str | None = None
    ) -> None:
        self.location = location
        self.found = found
        self.supported = supported
        self.written_by = written_by
        who = f" (written by capgate {quote(written_by, 40)})" if written_by else ""
        super().__init__(
            f"store {location} has schema version {found}{who}; this capgate reads schema "
            f"versions up to {supported}: open it with the capgate that wrote it, or a newer one"
        )


class StoreURLError(StoreError, ValueError):
    """Not an address :func:`~capgate.gateway.state.open.open_store` accepts."""

    code: ClassVar[str] = "store_url_invalid"


class UnknownTenant(StoreError):
    """The store has no tenant of that name."""

    code: ClassVar[str] = "unknown_tenant"

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        super().__init__(
            f"unknown tenant {quote(tenant)}: the gateway's store has no such tenant "
            "(capgate tenants add)"
        )


class UnknownConnection(StoreError):
    """The tenant has no connection of that alias."""

    code: ClassVar[str] = "unknown_connection"

    def __init__(self, tenant: str, alias: str) -> None:
        self.tenant = tenant
        self.alias = alias
        super().__init__(f"tenant {quote(tenant)} has no connection {quote(alias)}")


class UnknownOperation(StoreError):
    """The tenant has no operation of that id."""

    code: ClassVar[str] = "unknown_operation"

    def __init__(self, tenant: str, operation_id: str) -> None:
        self.tenant = tenant
        self.operation_id = operation_id
        super().__init__(f"tenant {quote(tenant)} has no operation {quote(operation_id)}")


class UnknownProposal(StoreError):
    """No proposal has that id."""

    code: ClassVar[str] = "unknown_proposal"

    def __init__(self, proposal_id: str) -> None:
        self.proposal_id = proposal_id
        super().__init__(f"unknown proposal {quote(proposal_id)}")


class UnknownReview(StoreError):
    """No review has that id."""

    code: ClassVar[str] = "unknown_review"

    def __init__(self, review_id: str) -> None:
        self.review_id = review_id
        super().__init__(f"unknown review {quote(review_id)}")


class UnknownPin(StoreError):
    """No definition of that tool of that upstream server was ever recorded."""

    code: ClassVar[str] = "unknown_pin"

    def __init__(self, server: str, tool: str) -> None:
        self.server = server
        self.tool = tool
        super().__init__(
            f"no definition of tool {quote(tool)} of upstream server {quote(server)} was "
            "recorded (capgate mcp discover records them)"
        )


class PinStale(StoreError):
    """The definition a person reviewed is no longer the one the server shows.

    Accepting or rejecting must be about the definition that was looked at: when the
    server changed it meanwhile, nothing is recorded and the new one is to be
    reviewed.
    """

    code: ClassVar[str] = "pin_stale"

    def __init__(self, server: str, tool: str, reviewed: str, shown: str | None) -> None:
        self.server = server
        self.tool = tool
        self.reviewed = reviewed
        self.shown = shown
        now = f"shows {shown}" if shown is not None else "no longer lists it"
        super().__init__(
            f"tool {quote(tool)} of upstream server {quote(server)}: the definition reviewed "
            f"was {quote(reviewed)}, the server {now}; review it again (capgate mcp pending)"
        )


class DuplicateRecord(StoreError):
    """A record with that id exists already; the store kept the first one."""

    code: ClassVar[str] = "duplicate_record"

    def __init__(self, what: str, record_id: str, message: str | None = None) -> None:
        self.what = what
        self.record_id = record_id
        super().__init__(message or f"a {what} with id {quote(record_id)} exists already")


class DuplicateOperation(DuplicateRecord):
    """The tenant already has a proposal for that operation id.

    An operation id is the idempotency key its tool receives, so two proposals must
    never share one: approving the second would replay the first's key.
    """

    code: ClassVar[str] = "duplicate_operation"

    def __init__(self, tenant: str, operation_id: str) -> None:
        self.tenant = tenant
        self.operation_id = operation_id
        super().__init__(
            "proposal",
            operation_id,
            f"tenant {quote(tenant)} already has a proposal for operation {quote(operation_id)}",
        )


class BudgetNotReserved(StoreError):
    """Settling a cost that is not reserved (settled twice, or never reserved).

    Letting the reservation go negative would hand out budget nobody reserved, so
    the settlement is refused and nothing changes.
    """

    code: ClassVar[str] = "budget_not_reserved"

    def __init__(self, tenant: str, task_id: str | None, reserved: int, cost: int) -> None:
        self.tenant = tenant
        self.task_id = task_id
        self.reserved = reserved
        self.cost = cost
        whose = f"tenant {quote(tenant)}"
        if task_id is not None:
            whose += f", task {quote(task_id)}"
        super().__init__(f"{whose} has {reserved} reserved, cannot settle a cost of {cost}")


# -- upstream MCP servers and capgate serve -------------------------------------------------


class UpstreamConfigError(InvalidInput):
    """``MCP_SERVERS`` (or a server spec) is not something capgate will connect to."""

    code: ClassVar[str] = "upstream_config_invalid"


class UpstreamUnavailable(CapgateError):
    """An upstream server could not be started, reached or listed (``capgate mcp
    discover``; a call's failure is an outcome instead, never this)."""

    code: ClassVar[str] = "upstream_unavailable"


class ConfigError(CapgateError):
    """The server's configuration file is missing, unsafe or invalid; nothing was served."""

    code = "serve_config_invalid"


class AuthenticationFailed(CapgateError):
    """A credential (a bearer token, an OIDC ID token, the command line's OS user)
    names no identity the gateway knows, or does not verify: nothing is done on its
    behalf. The message says which check failed, never the credential."""

    code: ClassVar[str] = "authentication_failed"


class LoginLimited(AuthenticationFailed):
    """Too many failed logins from one address (or in all) within the window: the
    credential was not even checked. ``retry_after`` says how many seconds to wait."""

    code: ClassVar[str] = "login_limited"

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed logins; try again in {retry_after} seconds")
        self.retry_after = retry_after


class RequestForged(CapgateError):
    """A browser request the review inbox will not act on: a state change without the
    session's CSRF token, sent from another origin or site, or for a host name the
    inbox does not serve (DNS rebinding). Nothing was changed."""

    code: ClassVar[str] = "request_forged"


class ResumeStateInvalid(InvalidInput):
    """A reviewed call resumed with a state this server did not issue to this caller
    for these arguments, or one that expired or was used already: nothing is proposed
    again (``capgate.adapters.fronts.mcp.awaiting``)."""

    code: ClassVar[str] = "resume_state_invalid"

    def __init__(self, why: str) -> None:
        super().__init__(f"the resume state is refused: {why}; nothing was proposed again")


class NoApprovalSurface(CapgateError):
    """A call asked to wait for its review within the request, on a connection that
    cannot (no input-required results before MCP 2026-07-28): nothing was proposed."""

    code: ClassVar[str] = "no_approval_surface"


class ProposalStale(CapgateError):
    """A verdict on a proposal names a digest that is not its content now (or the
    stored content no longer hashes to its digest): the reviewer decided on something
    else than what would be sent. Nothing is written; look at the proposal again."""

    code: ClassVar[str] = "stale"

    def __init__(self, proposal_id: str) -> None:
        super().__init__(
            f"proposal {quote(proposal_id)} is not the content you decided on: show it "
            "again and decide on what it holds now"
        )
        self.proposal_id = proposal_id


# -- webhook notices (capgate.gateway.service.notices) -------------------------------------


class NoticeRejected(CapgateError):
    """A webhook notice that a receiver must not act on (``verify_notice``).

    Raised on the receiving side, never by the gateway: the subclasses say why, so a
    receiver can answer a replayed notice (one it has handled) with 2xx and every
    other refusal with 4xx. Messages name the header or field, never the secret.
    """

    code: ClassVar[str] = "notice_rejected"


class NoticeSignatureInvalid(NoticeRejected):
    """The ``capgate-signature`` header is missing or malformed, or no signature in it
    is the HMAC of these bytes under this secret (the body or timestamp was changed,
    or the secret is another)."""

    code: ClassVar[str] = "notice_signature_invalid"


class NoticeOutsideWindow(NoticeRejected):
    """Correctly signed, but at a time further from now than the replay window allows."""

    code: ClassVar[str] = "notice_outside_window"


class NoticeReplayed(NoticeRejected):
    """Correctly signed, but its event id was seen already: a replay, or the gateway
    delivering again after it could not record a delivery (at least once)."""

    code: ClassVar[str] = "notice_replayed"


# -- the command line ------------------------------------------------------------------------


class StoreNotFound(StoreError):
    """``--store`` names a SQLite file that does not exist (only ``tenants add`` makes one)."""

    code: ClassVar[str] = "store_not_found"


class OperationNotInLedger(StoreError):
    """``ledger show --operation`` names an operation the ledger has no row of."""

    code: ClassVar[str] = "unknown_operation"
