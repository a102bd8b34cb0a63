"""What an MCP client gets back from ``tools/call``: the gateway's answers as tool results.

Every answer is a ``CallToolResult``, so the model behind the client reads it and can
correct itself; none is a protocol error and none carries a stack trace. Each has a
short text and the same facts as ``structuredContent``:

=========================  ========  =====================================================
what happened              isError   structuredContent
=========================  ========  =====================================================
the tool ran, success      false     the tool's result (untrusted data, checked against
                                     the contract's output schema)
proposed for review        false     ``{"status": "pending_review", "proposal_id", ...}``
ran, did not succeed       true      ``{"error": "tool_<status>", "status", "operation_id",
                                     "recovery", "retry_after_seconds", "tool_error"}``
denied by the policy       true      ``{"error": "capability_denied", "reason_codes"}``
hidden or no such tool     true      ``{"error": "unknown_tool"}``, the very same bytes
                                     for both
invalid arguments          true      ``{"error": "input_invalid", "message"}`` naming the
                                     field and the rule, never the value
no decision (fail closed)  true      ``{"error": "policy_unavailable"}`` (and the other
                                     codes of ``gateway.errors``), a fixed message
=========================  ========  =====================================================

Only capgate's own wording reaches the client: the policy's reason messages (they
name facts), OPA's and the store's error messages (addresses, paths) and exception
texts stay out; ``input_invalid`` messages are the dispatcher's, which name fields
and schema rules only. A tool's own error text is the one piece of untrusted text
passed on, as ``tool_error``, because it is the answer to the caller's own call.
"""

from __future__ import annotations

import json
from typing import Any, Final

import mcp_types as types

from gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CredentialUnavailable,
    InvalidInput,
    PolicyUnavailable,
    ToolNotRegistered,
    cut,
)
from gateway.model.outcomes import Outcome
from gateway.state.errors import StoreError, UnknownTenant
from gateway.state.records import ProposalRecord

__all__ = [
    "OUTCOME_META_KEY",
    "error_result",
    "internal_error",
    "outcome_result",
    "proposal_result",
    "unknown_tool",
]

#: The ``_meta`` key of a result that carries the call's operation and decision.
OUTCOME_META_KEY: Final = "capgate/outcome"

_UNKNOWN_TOOL: Final = (
    "unknown tool: it is not among the tools listed for you (tools/list). Nothing was run."
)

#: Fixed texts for the errors whose own messages may name addresses, paths or facts.
_FIXED: Final[dict[type[CapgateError], str]] = {
    PolicyUnavailable: "no policy decision could be had, so nothing was run (failing closed)",
    ToolNotRegistered: "the policy allows this tool, but this gateway has no transport for it",
    CredentialUnavailable: "the connection this tool acts through has no credential here",
    UnknownTenant: "this server's configuration names a tenant its store does not know",
    StoreError: "the gateway's state could not be read or written (its ledger records what ran)",
}


def _result(
    text: str, structured: dict[str, Any], *, error: bool, meta: dict[str, Any] | None = None
) -> types.CallToolResult:
    return types.CallToolResult.model_validate(
        {
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": error,
            **({"_meta": meta} if meta is not None else {}),
        }
    )


def unknown_tool() -> types.CallToolResult:
    """The answer for a tool that is hidden from the caller or does not exist at all:
    the same object, so the two cannot be told apart (the name is not echoed)."""
    return _result(_UNKNOWN_TOOL, {"error": "unknown_tool", "message": _UNKNOWN_TOOL}, error=True)


def _outcome_meta(outcome: Outcome) -> dict[str, Any]:
    return {
        OUTCOME_META_KEY: {
            "tool": outcome.tool,
            "version": outcome.version,
            "status": outcome.status.value,
            "operation_id": outcome.operation_id,
            "decision_id": outcome.decision_id,
            "receipt": outcome.provider_receipt,
        }
    }


def outcome_result(outcome: Outcome) -> types.CallToolResult:
    """A run's outcome: its result on success, else what happened and how to recover."""
    meta = _outcome_meta(outcome)
    if outcome.ok and outcome.result is not None:
        data = dict(outcome.result)
        text = json.dumps(data, ensure_ascii=False, sort_keys=True)
        return _result(text, data, error=False, meta=meta)
    status = outcome.status.value
    structured: dict[str, Any] = {
        "error": f"tool_{status}",
        "status": status,
        "operation_id": outcome.operation_id,
        "recovery": outcome.recovery,
        "retry_after_seconds": outcome.retry_after_seconds,
        "tool_error": outcome.error,
    }
    hint = {
        "refused": "the provider refused; repeating the same call will not help",
        "retryable": "nothing happened, or repeating is safe: the call may be made again",
        "unknown": "it may or may not have had its effect: do not repeat it blindly",
    }.get(status, "")
    recovery = f" Recovery: {outcome.recovery}." if outcome.recovery else ""
    text = f"The tool ran and ended {status} (operation {outcome.operation_id}): {hint}.{recovery}"
    return _result(text, structured, error=True, meta=meta)


def proposal_result(proposal: ProposalRecord) -> types.CallToolResult:
    """A call of a reviewed tool: recorded as a proposal; nothing ran."""
    structured = {
        "status": "pending_review",
        "proposal_id": proposal.id,
        "operation_id": proposal.operation_id,
        "tool": proposal.tool,
        "version": proposal.contract_version,
    }
    text = (
        f"Proposed for review as {proposal.id} (operation {proposal.operation_id}); nothing "
        "was run. A person reviews it and the execution service dispatches it; calling "
        "again does not speed that up."
    )
    meta = {OUTCOME_META_KEY: {**structured, "decision_id": proposal.decision_id}}
    return _result(text, structured, error=False, meta=meta)


def error_result(error: CapgateError) -> types.CallToolResult:
    """A refusal before the tool was entered, with its stable code."""
    structured: dict[str, Any] = {"error": error.code}
    if isinstance(error, CapabilityViolation):
        codes = error.reason_codes
        structured["reason_codes"] = codes
        shown = ", ".join(cut(code, 40) for code in codes[:10]) or "no reason given"
        text = f"Denied by policy ({shown}); nothing was run."
    elif isinstance(error, InvalidInput):
        # The dispatcher's messages name fields and schema rules, never values.
        message = cut(str(error), 600)
        structured["message"] = message
        text = f"Invalid call, nothing was run: {message}"
    else:
        fixed = next(
            (text for kind, text in _FIXED.items() if isinstance(error, kind)),
            "the call could not be made; nothing was run",
        )
        text = f"{fixed} [{error.code}]."
    structured.setdefault("message", text)
    return _result(text, structured, error=True)


def internal_error() -> types.CallToolResult:
    """Anything capgate did not expect: a fixed text, never the exception's."""
    text = "the gateway failed unexpectedly; nothing more is said here (see its log) [internal]."
    return _result(text, {"error": "internal", "message": text}, error=True)
