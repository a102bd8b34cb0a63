"""What an MCP client gets back from ``tools/call``: the gateway's answers as tool results.

Every answer is a ``CallToolResult``, so the model behind the client reads it and can
correct itself; none is a protocol error and none carries a stack trace. The answers
themselves are the fronts' shared ones (:mod:`capgate.adapters.fronts.answers`: a
short text, the facts, whether it is an error, a success's own result); this module
only renders them, through :func:`tool_result`, the one rule of what a result may
carry given the tool the client called, as ``tools/list`` advertised it:

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

Which facts each kind of answer carries, whether it is an error, and which wording
never reaches the client, is written once, in :mod:`capgate.adapters.fronts.answers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import mcp_types as types

from capgate.adapters.fronts.answers import Answer
from capgate.gateway.schema.validator import schema_validator

__all__ = ["OUTCOME_META_KEY", "tool_result"]

#: The ``_meta`` key under which every result carries the facts of its answer.
OUTCOME_META_KEY: Final = "capgate/outcome"


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
