"""The agent-side view: show the agent only what it may use, call by name.

``AgentSession`` is what an agent loop holds instead of tools. Its prompt block lists
only the tools OPA made visible, with the catalogue's reviewed descriptions (never a
description a remote server announced). ``call_tool`` goes through the gateway every
time: the connection state, evidence and budget are read from the store at that
moment, so a connection revoked after the session composed is no longer usable
through it. Visibility at compose time is a courtesy to the model; the execute
decision is the boundary.

An agent loop feeds ``call_tool`` whatever the model produced, so every argument is
checked: malformed ones end in :class:`~capgate.gateway.errors.InvalidInput`, and nothing
outside :mod:`capgate.gateway.errors` comes back from a session.
"""

from __future__ import annotations

from typing import Any

from capgate.adapters.fronts.answers import proposal_answer
from capgate.gateway.errors import InvalidInput, ToolFailed
from capgate.gateway.model.decisions import ComposeDecision
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import ProposalRecord

__all__ = ["AgentSession"]


class AgentSession:
    """One agent working on one task, through one gateway."""

    def __init__(self, gateway: Gateway, request: AgentRequest) -> None:
        if not isinstance(gateway, Gateway):
            raise InvalidInput(f"gateway must be a Gateway, not a {type(gateway).__name__}")
        if not isinstance(request, AgentRequest):
            raise InvalidInput(f"request must be an AgentRequest, not a {type(request).__name__}")
        self.gateway = gateway
        self.request = request
        self.composition: ComposeDecision = gateway.compose(request)
        self.last_outcome: Outcome | None = None
        self.last_proposal: ProposalRecord | None = None

    def refresh(self) -> ComposeDecision:
        """Compose again with the store's facts as they are now (e.g. after a revoke)."""
        self.composition = self.gateway.compose(self.request)
        return self.composition

    @property
    def visible_tools(self) -> list[str]:
        return sorted(self.composition.visible)

    def available_tools_block(self) -> str:
        """The AVAILABLE TOOLS block for the agent's prompt."""
        if not self.composition.visible:
            return "AVAILABLE TOOLS: none"
        lines = ["AVAILABLE TOOLS:"]
        for name in self.visible_tools:
            contract = self.gateway.catalogue.tools[name]
            lines.append(f"- {name} (v{contract.version}): {contract.description.strip()}")
        return "\n".join(lines)

    def call_tool(
        self, name: str, /, *, operation_id: str | None = None, **params: Any
    ) -> dict[str, Any]:
        """Call ``name`` and return its result dict.

        A tool whose calls are reviewed is proposed instead of run: the answer is the
        proposed answer's facts every front gives (:mod:`capgate.adapters.fronts.answers`:
        ``{"status": "pending_review", "proposal_id": ..., "operation_id": ..., "tool":
        name, ...}``, with ``"unsettled_twins"``, the ids of operations of the same
        content whose outcome is still open, when there are any) and the proposal is in
        ``last_proposal``.
        ``operation_id`` names the operation (the same id with the same call returns
        the first outcome); a tool parameter of that name cannot be passed this way:
        use the gateway directly.

        Raises the gateway's errors for a refused call, and ToolFailed when the tool
        ran but did not succeed (the Outcome, with its recovery hint, is on the
        exception and in ``last_outcome``).
        """
        if not isinstance(name, str):
            raise InvalidInput(f"the tool name must be a string, not a {type(name).__name__}")
        answer = self.gateway.call(self.request, name, params, operation_id=operation_id)
        if isinstance(answer, ProposalRecord):
            self.last_proposal = answer
            return dict(proposal_answer(answer).facts)
        self.last_outcome = answer
        if not answer.ok or answer.result is None:
            raise ToolFailed(answer)
        return dict(answer.result)
