"""The agent-side view: compose once, show the agent only what it may use, call by name.

``AgentSession`` is what an agent loop holds instead of tools. Its prompt block lists
only the tools OPA made visible, with the catalogue's reviewed descriptions (never a
description a remote server announced), and ``call_tool`` goes through the full
execute check every time: visibility at compose time is a courtesy to the model,
the execute decision is the boundary.

An agent loop feeds ``call_tool`` whatever the model produced, so every argument is
checked: malformed ones end in :class:`~gateway.errors.InvalidInput`, and nothing
outside :mod:`gateway.errors` comes back from a session.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.dispatch.dispatcher import Dispatcher
from gateway.errors import InvalidInput, ToolFailed
from gateway.model.decisions import ComposeDecision
from gateway.model.facts import Approval, ComposeInput
from gateway.model.outcomes import Outcome

__all__ = ["AgentSession"]


class AgentSession:
    """One agent working on one task under one set of facts."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        facts: ComposeInput,
        *,
        evidence: Iterable[str] = (),
        approvals: Mapping[str, Approval] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.facts = facts
        self.evidence = _evidence(evidence)
        self.approvals = _approvals(approvals)
        self.composition: ComposeDecision = dispatcher.compose(facts)
        self.last_outcome: Outcome | None = None

    @property
    def visible_tools(self) -> list[str]:
        return sorted(self.composition.visible)

    def available_tools_block(self) -> str:
        """The AVAILABLE TOOLS block for the agent's prompt."""
        if not self.composition.visible:
            return "AVAILABLE TOOLS: none"
        lines = ["AVAILABLE TOOLS:"]
        for name in self.visible_tools:
            contract = self.dispatcher.catalogue.tools[name]
            lines.append(f"- {name} (v{contract.version}): {contract.description.strip()}")
        return "\n".join(lines)

    def call_tool(self, name: str, /, **params: Any) -> dict[str, Any]:
        """Call ``name`` and return its result dict.

        Raises the dispatcher's errors for a refused call, and ToolFailed when the
        tool ran but did not succeed (the Outcome, with its recovery hint, is on
        the exception and in ``last_outcome``).
        """
        if not isinstance(name, str):
            raise InvalidInput(f"the tool name must be a string, not a {type(name).__name__}")
        outcome = self.dispatcher.call(
            self.facts,
            name,
            params,
            approval=self.approvals.get(name),
            evidence=sorted(self.evidence),
        )
        self.last_outcome = outcome
        if not outcome.ok or outcome.result is None:
            raise ToolFailed(outcome)
        return dict(outcome.result)


def _evidence(evidence: object) -> frozenset[str]:
    """The evidence names, or InvalidInput (one string is not a list of names)."""
    if isinstance(evidence, str | bytes) or not isinstance(evidence, Iterable):
        raise InvalidInput(
            f"evidence must be a collection of names, not a {type(evidence).__name__}"
        )
    try:
        names = list(evidence)
    except Exception as exc:  # the caller's own iterable failed
        raise InvalidInput(f"evidence could not be read ({type(exc).__name__})") from None
    if not all(isinstance(name, str) for name in names):
        raise InvalidInput("evidence must hold names (strings) only")
    return frozenset(str.__str__(name) for name in names)


def _approvals(approvals: object) -> dict[str, Approval]:
    """Approvals by tool name, or InvalidInput."""
    if approvals is None:
        return {}
    if not isinstance(approvals, Mapping):
        raise InvalidInput(
            f"approvals must map tool names to Approvals, not a {type(approvals).__name__}"
        )
    try:
        items = list(approvals.items())
    except Exception as exc:  # the caller's own Mapping failed
        raise InvalidInput(f"approvals could not be read ({type(exc).__name__})") from None
    for tool, approval in items:
        if not isinstance(tool, str) or not isinstance(approval, Approval):
            raise InvalidInput("approvals must map tool names (strings) to Approval objects")
    return {str.__str__(tool): approval for tool, approval in items}
