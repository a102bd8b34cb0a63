"""What an upstream call's end means: ``success``, ``refused``, ``retryable`` or ``unknown``.

Every way a call on an MCP server can end is turned here into the core's outcomes
(:mod:`capgate.gateway.model.outcomes`), failing closed: what is not known to be a
refusal or a result is retryable only when nothing was sent, or the call is a
``read``; otherwise it is unknown.

- Failing to start or reach a server (:class:`NotSent`), or finding that it shows
  another definition of the tool (:class:`Changed`): nothing was sent, so
  ``ToolRetryable``.
- A timeout, a server that dies mid-call, an answer that breaks the protocol or the
  output schema: the call may have had its effect, so ``ToolRetryable`` for a
  ``read`` contract and ``ToolUnknown`` for any tool that changes the world,
  idempotent or not: only a lookup can say it did not happen, and the budget it
  reserved stays held until then.
- A JSON-RPC refusal of the call (unknown tool, invalid parameters) and a tool error
  (``isError``): ``ToolRefused``.
- A result: its structured content (checked against the accepted output schema, then
  by the dispatcher against the contract's); without it, the content blocks as
  ``{"content": [...], "untrusted": true}``. Nothing here interprets output, and it
  never reaches OPA's input.

Error text quotes no tool output or server message beyond a tool error's own text,
which stays on the outcome only (:func:`why` names what went wrong by its type).
Apart from the adapter so that each ending of a call is read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, NoReturn

import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from capgate.adapters.tools.mcp.schemas import schema_problem
from capgate.gateway.errors import cut
from capgate.gateway.model.contracts import Mode, ToolContract
from capgate.gateway.model.outcomes import ToolRefused, ToolRetryable, ToolUnknown

__all__ = [
    "Changed",
    "NotSent",
    "after_send",
    "call_failed",
    "call_result",
    "connection_closed",
    "not_sent",
    "why",
]

#: The JSON-RPC codes with which a server refuses a call it did not run.
REFUSED_CODES: Final = frozenset({types.METHOD_NOT_FOUND, types.INVALID_PARAMS})


class NotSent(Exception):
    """The call never left: the server could not be started or reached."""


class Changed(Exception):
    """The call never left: the server's listing shows another definition of the tool
    than the one the call was to run under (or no longer lists it)."""


def why(exc: BaseException) -> str:
    """What went wrong, without any text a server chose (it may be anything)."""
    if isinstance(exc, NotSent):
        return str(exc)
    if isinstance(exc, MCPError):
        return f"JSON-RPC error {exc.code}"
    if isinstance(exc, BaseExceptionGroup):
        return ", ".join(sorted({why(inner) for inner in exc.exceptions}))
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__


def not_sent(server: str, reason: str) -> ToolRetryable:
    """The outcome of a call not sent because its server could not be reached or listed."""
    return ToolRetryable(
        f"server {server!r} could not be reached or listed ({reason}); nothing was sent",
        retry_after_seconds=5,
    )


def connection_closed(exc: BaseException) -> bool:
    """Whether the call failed because the server closed the connection during it."""
    return isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED


def after_send(contract: ToolContract, reason: str) -> NoReturn:
    """The call may have had its effect: retryable only for a read, which has none.

    A tool that changes the world is unknown even when repeating it is harmless:
    retryable would say nothing happened, and release the budget of an effect
    that may have taken place."""
    if contract.mode is Mode.READ:
        raise ToolRetryable(f"{reason}; a read may be repeated", retry_after_seconds=1)
    raise ToolUnknown(f"{reason}; the call may or may not have had its effect")


def call_failed(
    exc: Exception, contract: ToolContract, server: str, tool: str, call_timeout: float
) -> NoReturn:
    """Raise the outcome of a call of ``tool`` on ``server`` that ended in ``exc``."""
    if isinstance(exc, NotSent):
        raise not_sent(server, str(exc)) from None
    if isinstance(exc, Changed):
        raise ToolRetryable(
            f"server {server!r} now shows a definition of tool {tool!r} other than the "
            "accepted one; nothing was sent, and the tool is quarantined until a person "
            "reviews the new definition"
        ) from None
    if isinstance(exc, TimeoutError):  # concurrent.futures.TimeoutError is this one too
        after_send(contract, f"no answer within {call_timeout:g}s")
    if isinstance(exc, MCPError):
        if exc.code in REFUSED_CODES:
            raise ToolRefused(
                f"server {server!r} refused the call (JSON-RPC error {exc.code})"
            ) from None
        if connection_closed(exc):
            after_send(contract, "the server closed the connection during the call")
        after_send(contract, f"the server answered JSON-RPC error {exc.code}")
    if isinstance(exc, ValidationError):
        after_send(contract, "the server's answer is not a valid MCP result")
    # The SDK checks structured content against the schema the server lists.
    if isinstance(exc, RuntimeError) and "structured content" in str(exc):
        after_send(contract, "the result does not fit the tool's output schema")
    after_send(contract, f"the call failed ({type(exc).__name__})")


def call_result(
    contract: ToolContract, definition: Mapping[str, Any], result: types.CallToolResult
) -> dict[str, Any]:
    """What a call that was answered returns, or its outcome if the answer is no result."""
    if result.is_error:
        texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
        raise ToolRefused(cut("\n".join(texts) or "the tool reported an error", 2000))
    output_schema = definition.get("outputSchema")
    structured = result.structured_content
    if structured is not None:
        problem = schema_problem(output_schema, structured) if output_schema else None
        if problem is not None:
            after_send(contract, f"the result does not fit the accepted output schema ({problem})")
        return dict(structured)
    if output_schema:
        after_send(
            contract,
            "the accepted definition has an output schema and the result no structured content",
        )
    blocks = [
        block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
    ]
    return {"content": blocks, "untrusted": True}
