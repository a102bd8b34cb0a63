"""The agent-side view: compose once, show the agent only what it may use, call by name.

``AgentSession`` is what an agent loop holds instead of tools. Its prompt block lists
only the tools OPA made visible, with the catalogue's reviewed descriptions (never a
description a remote server announced), and ``call_tool`` goes through the full
execute check every time: visibility at compose time is a courtesy to the model,
the execute decision is the boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.dispatch.dispatcher import Dispatcher
from gateway.errors import ToolFailed
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
        self.evidence = frozenset(evidence)
        self.approvals = dict(approvals or {})
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
        outcome = self.dispatcher.call(
            self.facts,
            name,
            params,
            approval=self.approvals.get(name),
            evidence=self.evidence,
        )
        self.last_outcome = outcome
        if not outcome.ok or outcome.result is None:
            raise ToolFailed(outcome)
        return dict(outcome.result)
