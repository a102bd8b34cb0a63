"""One error hierarchy for capgate, each error with a stable ``code``.

Callers match on the class or on ``code``; messages are for people and may change.
Transport and parsing failures are translated into these types at the edge where
they happen, and none of them is ever turned into an allow::

    CapgateError                 capgate_error
    ├── CatalogueError           catalogue_invalid       a catalogue file is wrong; nothing loaded
    ├── InvalidInput             input_invalid           bad facts or parameters; OPA not asked
    ├── PolicyUnavailable        policy_unavailable      no usable decision: fail closed
    │   └── OPAProcessError      opa_process_failed      the embedded OPA could not start
    ├── CapabilityViolation      capability_denied       OPA said no; carries the reason codes
    │   └── ObligationUnsupported obligation_unsupported an allow on a condition we cannot keep
    ├── ToolNotRegistered        tool_not_registered     granted, but no adapter holds the tool
    ├── ToolNotInCatalogue       tool_not_in_catalogue   a registered name the catalogue lacks
    └── ToolFailed               tool_failed             it ran, but did not succeed; see .outcome
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pydantic import ValidationError

    from gateway.model.decisions import Reason
    from gateway.model.outcomes import Outcome

__all__ = [
    "CapabilityViolation",
    "CapgateError",
    "CatalogueError",
    "InvalidInput",
    "OPAProcessError",
    "ObligationUnsupported",
    "PolicyUnavailable",
    "ToolFailed",
    "ToolNotInCatalogue",
    "ToolNotRegistered",
]


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
        """One message naming every bad field of a pydantic validation failure."""
        problems = "; ".join(
            f"field {'.'.join(str(p) for p in e['loc']) or '(top)'!r}: {e['msg']}"
            for e in exc.errors()
        )
        return cls(f"{where}: {problems}")


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
        codes = ", ".join(r.code for r in self.reasons) or "no reason given"
        super().__init__(f"call to {tool!r} denied: {codes}")

    @property
    def reason_codes(self) -> list[str]:
        """The codes alone, sorted, for matching in callers and tests."""
        return sorted(r.code for r in self.reasons)


class ObligationUnsupported(CapabilityViolation):
    """OPA allowed the call under an obligation this dispatcher cannot fulfil.

    An obligation the enforcement point does not understand turns an allow into a
    deny: keeping half of a conditional allow would be weaker than the policy said.
    """

    code: ClassVar[str] = "obligation_unsupported"


class ToolNotRegistered(CapgateError):
    """Policy granted the tool, but no adapter in this process can run it."""

    code: ClassVar[str] = "tool_not_registered"

    def __init__(self, tool: str) -> None:
        self.tool = tool
        super().__init__(f"tool {tool!r} is granted but not registered with any adapter")


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
        for name in self.names:
            close = suggestions.get(name) or []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            parts.append(f"{name!r}{hint}")
        super().__init__(
            f"registered tool(s) not in the catalogue: {', '.join(parts)}; "
            "add them to tools.yaml or fix the name"
        )


class ToolFailed(CapgateError):
    """An authorised tool ran but its outcome is not a success.

    Raised only by the agent-side ``call_tool`` helper, which promises a result dict;
    the dispatcher itself returns the :class:`~gateway.model.outcomes.Outcome` instead.
    """

    code: ClassVar[str] = "tool_failed"

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        hint = f"; recovery: {outcome.recovery}" if outcome.recovery else ""
        # The tool's own error text stays on .outcome: it is untrusted and may quote
        # provider responses, and exception messages tend to end up in logs.
        super().__init__(
            f"tool {outcome.tool!r} ended {outcome.status.value} "
            f"(operation {outcome.operation_id}){hint}"
        )
