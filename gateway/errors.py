"""One error hierarchy for capgate, each error with a stable ``code``.

Callers match on the class or on ``code``; messages are for people and may change.
Transport and parsing failures are translated into these types at the edge where
they happen, and none of them is ever turned into an allow. Whatever a caller passes
to ``Dispatcher.call``, ``Dispatcher.compose`` or ``AgentSession``, only these
errors come back::

    CapgateError                 capgate_error
    ├── CatalogueError           catalogue_invalid       a catalogue file is wrong; nothing loaded
    ├── InvalidInput             input_invalid           bad facts or parameters; OPA not asked
    │   └── OperationConflict    operation_conflict      an operation id reused for another call
    ├── PolicyUnavailable        policy_unavailable      no usable decision: fail closed
    │   └── OPAProcessError      opa_process_failed      the embedded OPA could not start
    ├── CapabilityViolation      capability_denied       OPA said no; carries the reason codes
    │   └── ObligationUnsupported obligation_unsupported an allow whose obligations are not exactly
    │                                                    those the contract requires
    ├── ToolNotRegistered        tool_not_registered     granted, but no adapter holds the tool
    │                                                    (also a KeyError, as the seed says)
    ├── ToolNotInCatalogue       tool_not_in_catalogue   a registered name the catalogue lacks
    ├── CredentialUnavailable    credential_unavailable  a connection's secret could not be resolved
    ├── StoreError ...           store_*, unknown_*      the gateway's store (gateway.state.errors)
    └── ToolFailed               tool_failed             it ran, but did not succeed; see .outcome

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
    "CapabilityViolation",
    "CapgateError",
    "CatalogueError",
    "CredentialUnavailable",
    "InvalidInput",
    "OPAProcessError",
    "ObligationUnsupported",
    "OperationConflict",
    "PolicyUnavailable",
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
