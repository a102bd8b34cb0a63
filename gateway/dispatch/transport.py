"""The narrow contract between the dispatcher and whatever runs a tool.

An adapter only runs tools; it never decides. By the time ``run`` is called the
policy has already allowed this exact call, so an adapter needs no knowledge of
roles, approvals or budgets, and swapping one transport for another (in-process,
MCP) cannot change what is authorised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Adapter", "CallContext", "ToolFunction"]

#: The signature of an in-process tool.
ToolFunction = Callable[..., Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class CallContext:
    """What an adapter may know about the call besides its parameters."""

    operation_id: str
    idempotency_key: str | None = None
    connection_alias: str | None = None


@runtime_checkable
class Adapter(Protocol):
    """A transport that can run tools by name."""

    def names(self) -> Iterable[str]:
        """Every tool name this adapter can run (checked against the catalogue)."""
        ...

    def has(self, name: str) -> bool: ...

    def describe(self, name: str) -> str | None: ...

    def run(self, name: str, params: Mapping[str, Any], context: CallContext) -> Mapping[str, Any]:
        """Run the tool; raise ``ToolRefused``/``ToolRetryable`` to signal those outcomes."""
        ...
