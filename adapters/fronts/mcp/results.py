"""What an MCP client gets back from ``tools/call``: the gateway's answers as tool results.

Every answer is a ``CallToolResult``, so the model behind the client reads it and can
correct itself; none is a protocol error and none carries a stack trace. An answer
is built here as an :class:`Answer` (a short text, the facts, whether it is an
error, a success's own result) and sent through :func:`tool_result`, the one rule of
what a result may carry given the tool the client called, as ``tools/list``
advertised it:

- **The facts travel in every answer**, under ``_meta["capgate/outcome"]``
  (:data:`OUTCOME_META_KEY`), and in words in its text: the error code, the reason
  codes, that nothing was run, the operation id, the recovery procedure, when to
  retry. A client reads them whatever its SDK.
- **``structuredContent`` is only ever a value the advertised tool admits.** The
  MCP specification (2025-11-25 and 2026-07-28, server/tools, "Output Schema"):
  when a tool has an output schema, "Servers MUST provide structured results that
  conform to this schema", with no exception for ``isError``; and clients enforce
  it: the TypeScript SDK 1.x client (``Client.callTool``) and the MCP Inspector 2.x
  (``validateToolOutput``) validate structured content wherever it is present, error
  or not, and fail the call (``-32602 Structured content does not match the tool's
  output schema``) so that the client never sees the answer. The TypeScript SDK 2.x
  and the Python SDK skip the check on errors. So structured content is the tool's
  result when it fits the advertised output schema; the facts, when the caller may
  see the tool and it advertises no output schema (what a reviewed tool's answers
  carry, as they always have); otherwise nothing.
- **A non-error answer to a tool with an output schema carries its result**: every
  SDK above refuses one without structured content. A success whose result does not
  fit the schema advertised now (only an outcome replayed from a catalogue whose
  schema was another) is therefore sent as an error, ``result_withheld``, without
  the result.
- **A name the caller may not see** (hidden by the policy, no tool at all, or not yet
  known to be visible when no decision could be had) is given no tool: its answer
  carries no structured content, so nothing about the name is looked up and a
  client that listed the tool with an output schema before it was hidden still
  reads the answer.

=========================  ========  ====================================================
what happened              isError   ``_meta["capgate/outcome"]`` (and, where the tool
                                     admits it, ``structuredContent``)
=========================  ========  ====================================================
the tool ran, success      false     ``tool``, ``version``, ``status``, ``operation_id``,
                                     ``decision_id``, ``receipt``; structured content is
                                     the tool's result (untrusted data, checked against
                                     the contract's output schema)
proposed for review        false     ``{"status": "pending_review", "proposal_id",
                                     "operation_id", "tool", "version", "decision_id"}``,
                                     and ``unsettled_twins`` when there are any
ran, did not succeed       true      a success's keys and ``"error": "tool_<status>"``,
                                     ``recovery``, ``retry_after_seconds``,
                                     ``tool_error``
denied by the policy       true      ``{"error": "capability_denied", "reason_codes",
                                     "message"}``
hidden or no such tool     true      ``{"error": "unknown_tool", "message"}``, the very
                                     same bytes for both
invalid arguments          true      ``{"error": "input_invalid", "message"}`` naming the
                                     field and the rule, never the value
no decision (fail closed)  true      ``{"error": "policy_unavailable", "message"}`` (and
                                     the other codes of ``capgate.gateway.errors``), a fixed
                                     message
=========================  ========  ====================================================

Only capgate's own wording reaches the client: the policy's reason messages (they
name facts), OPA's and the store's error messages (addresses, paths) and exception
texts stay out; ``input_invalid`` messages are the dispatcher's, which name fields
and schema rules only. A tool's own error text is the one piece of untrusted text
passed on, as ``tool_error`` in the facts (never in the text), because it is the
answer to the caller's own call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types

from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CredentialUnavailable,
    InvalidInput,
    PolicyUnavailable,
    StoreError,
    ToolNotRegistered,
    UnknownTenant,
    cut,
)
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.schema.validator import schema_validator
from capgate.gateway.state.records import ProposalRecord

__all__ = [
    "OUTCOME_META_KEY",
    "Answer",
    "error_answer",
    "internal_answer",
    "outcome_answer",
    "proposal_answer",
    "tool_result",
    "unknown_tool_answer",
]

#: The ``_meta`` key under which every result carries the facts of its answer.
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

_HINTS: Final = {
    "refused": "the provider refused; repeating the same call will not help",
    "retryable": "nothing happened, or repeating is safe: the call may be made again",
    "unknown": "it may or may not have had its effect: do not repeat it blindly",
}


@dataclass(frozen=True)
class Answer:
    """One answer to ``tools/call``, before :func:`tool_result` fits it to the tool."""

    #: What the model reads: the facts in words.
    text: str
    #: What programs read: ``_meta[OUTCOME_META_KEY]`` of the result, always.
    facts: dict[str, Any]
    error: bool
    #: A success's own result (untrusted data), for ``structuredContent``.
    result: dict[str, Any] | None = None


def tool_result(answer: Answer, tool: types.Tool | None) -> types.CallToolResult:
    """``answer`` as the result for ``tool``, the tool the client called as
    ``tools/list`` advertises it; ``None`` for a name the caller may not see (or not
    yet known to be visible). The one place that decides what a result may carry:
    see the module's docstring."""
    schema = tool.output_schema if tool is not None else None
    text, facts, error = answer.text, answer.facts, answer.error
    structured: dict[str, Any] | None = None
    if answer.result is not None:
        if tool is not None and (schema is None or _fits(answer.result, schema)):
            structured = answer.result
        else:
            facts = {**facts, "error": "result_withheld"}
            text = (
                f"The tool ran and succeeded (operation {facts.get('operation_id')}), but its "
                "recorded result does not fit the output schema this server advertises for "
                "the tool, so it is not shown."
            )
            error = True
    elif tool is not None and schema is None:
        structured = facts
    if schema is not None and structured is None:
        error = True  # every SDK refuses a non-error result without structured content
    return types.CallToolResult.model_validate(
        {
            "content": [{"type": "text", "text": text}],
            **({"structuredContent": structured} if structured is not None else {}),
            "isError": error,
            "_meta": {OUTCOME_META_KEY: facts},
        }
    )


def _fits(result: dict[str, Any], schema: Mapping[str, Any]) -> bool:
    """Whether ``result`` passes ``schema`` under the catalogue's own validator (the
    dispatcher's, stricter than any client's)."""
    return bool(schema_validator(schema).is_valid(result))


def unknown_tool_answer() -> Answer:
    """The answer for a tool that is hidden from the caller or does not exist at all:
    the same object, so the two cannot be told apart (the name is not echoed)."""
    return Answer(_UNKNOWN_TOOL, {"error": "unknown_tool", "message": _UNKNOWN_TOOL}, error=True)


def _outcome_facts(outcome: Outcome) -> dict[str, Any]:
    return {
        "tool": outcome.tool,
        "version": outcome.version,
        "status": outcome.status.value,
        "operation_id": outcome.operation_id,
        "decision_id": outcome.decision_id,
        "receipt": outcome.provider_receipt,
    }


def outcome_answer(outcome: Outcome) -> Answer:
    """A run's outcome: its result on success, else what happened and how to recover."""
    facts = _outcome_facts(outcome)
    if outcome.ok and outcome.result is not None:
        data = dict(outcome.result)
        text = json.dumps(data, ensure_ascii=False, sort_keys=True)
        return Answer(text, facts, error=False, result=data)
    status = outcome.status.value
    facts.update(
        {
            "error": f"tool_{status}",
            "recovery": outcome.recovery,
            "retry_after_seconds": outcome.retry_after_seconds,
            "tool_error": outcome.error,
        }
    )
    recovery = f" Recovery: {outcome.recovery}." if outcome.recovery else ""
    wait = outcome.retry_after_seconds
    retry = f" Retry after {wait:g} seconds." if wait is not None else ""
    text = (
        f"The tool ran and ended {status} (operation {outcome.operation_id}): "
        f"{_HINTS.get(status, '')}.{recovery}{retry}"
    )
    return Answer(text, facts, error=True)


def proposal_answer(proposal: ProposalRecord) -> Answer:
    """A call of a reviewed tool: recorded as a proposal; nothing ran."""
    facts = {
        "status": "pending_review",
        "proposal_id": proposal.id,
        "operation_id": proposal.operation_id,
        "tool": proposal.tool,
        "version": proposal.contract_version,
        "decision_id": proposal.decision_id,
    }
    text = (
        f"Proposed for review as {proposal.id} (operation {proposal.operation_id}); nothing "
        "was run. A person reviews it and the execution service dispatches it; calling "
        "again does not speed that up."
    )
    if proposal.unsettled_twins:
        facts["unsettled_twins"] = list(proposal.unsettled_twins)
        text += (
            " Warning: operation(s) "
            + ", ".join(proposal.unsettled_twins)
            + " with exactly this content have no settled outcome yet (they may already "
            "have done it); the reviewer is told."
        )
    return Answer(text, facts, error=False)


def error_answer(error: CapgateError) -> Answer:
    """A refusal before the tool was entered, with its stable code."""
    facts: dict[str, Any] = {"error": error.code}
    if isinstance(error, CapabilityViolation):
        codes = error.reason_codes
        facts["reason_codes"] = codes
        shown = ", ".join(cut(code, 40) for code in codes[:10]) or "no reason given"
        text = f"Denied by policy ({shown}); nothing was run."
    elif isinstance(error, InvalidInput):
        # The dispatcher's messages name fields and schema rules, never values.
        message = cut(str(error), 600)
        facts["message"] = message
        text = f"Invalid call, nothing was run: {message}"
    else:
        fixed = next(
            (text for kind, text in _FIXED.items() if isinstance(error, kind)),
            "the call could not be made; nothing was run",
        )
        text = f"{fixed} [{error.code}]."
    facts.setdefault("message", text)
    return Answer(text, facts, error=True)


def internal_answer() -> Answer:
    """Anything capgate did not expect: a fixed text, never the exception's."""
    text = "the gateway failed unexpectedly; nothing more is said here (see its log) [internal]."
    return Answer(text, {"error": "internal", "message": text}, error=True)
