"""The proposed answer of ``capgate serve`` tells the agent about unsettled twins.

A proposal with exactly the content of an operation whose outcome is still open may
do it twice (issue 17, defect 3): the MCP answer carries the twins in its facts and
a warning in its text, for every client SDK (the facts travel in ``_meta``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from capgate.adapters.fronts.answers import proposal_answer
from capgate.adapters.fronts.mcp.results import OUTCOME_META_KEY, tool_result
from capgate.gateway.digest import params_digest
from capgate.gateway.model.facts import Principal
from capgate.gateway.state.records import ProposalRecord, ProposalStatus


def _proposal(twins: list[str]) -> ProposalRecord:
    now = datetime.now(UTC)
    return ProposalRecord(
        id="prop-1", tenant="acme", task_id="task-1",
        proposer=Principal(agent="a", role="finance", tenant="acme"),
        environment="production", task={}, tool="payment.execute", contract_version=1,
        execution_action="payment.dispatch_reviewed", params={}, params_digest=params_digest({}),
        operation_id="op-2", decision_id=None, status=ProposalStatus.PENDING,
        created_at=now, updated_at=now, unsettled_twins=twins,
    )  # fmt: skip


def test_a_proposal_with_unsettled_twins_says_so() -> None:
    result = tool_result(proposal_answer(_proposal(["op-1"])), None)
    assert result.is_error is False
    assert result.meta is not None
    assert result.meta[OUTCOME_META_KEY]["unsettled_twins"] == ["op-1"]
    [block] = result.content
    assert "op-1" in block.text  # type: ignore[union-attr]
    assert "no settled outcome" in block.text  # type: ignore[union-attr]


def test_a_proposal_without_twins_carries_no_warning() -> None:
    result = tool_result(proposal_answer(_proposal([])), None)
    assert result.meta is not None
    assert "unsettled_twins" not in result.meta[OUTCOME_META_KEY]
    [block] = result.content
    assert "Warning" not in block.text  # type: ignore[union-attr]
