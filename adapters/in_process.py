"""Run plain Python callables in this process: the default transport.

A tool function receives exactly the call's parameters. What the dispatcher knows
about the call besides them (the operation id, the idempotency key the policy
obliged it to pass, the connection alias) is available during the call through
:func:`current_call`, so a tool that talks to a provider can send the key without
the key ever being a parameter an agent could choose.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from gateway.transport import CallContext, ToolFunction

__all__ = ["InProcessAdapter", "ToolSpec", "current_call"]

_current: ContextVar[CallContext | None] = ContextVar("capgate_current_call", default=None)


def current_call() -> CallContext:
    """The context of the authorised call being run; only valid inside a tool."""
    context = _current.get()
    if context is None:
        raise RuntimeError("current_call() is only available while a tool is running")
    return context


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the seed design defines it: a (name, description, run) triple."""

    name: str
    description: str
    run: ToolFunction


@dataclass
class InProcessAdapter:
    """Holds callables by name and calls them with the call's parameters."""

    _tools: dict[str, ToolSpec] = field(default_factory=dict)

    def register(self, name: str, description: str, run: ToolFunction) -> None:
        if not callable(run):
            raise TypeError(f"tool {name!r}: run must be callable")
        if name in self._tools:
            raise ValueError(f"tool {name!r} is already registered")
        self._tools[name] = ToolSpec(name, description, run)

    def has(self, name: str) -> bool:
        return name in self._tools

    def describe(self, name: str) -> str | None:
        spec = self._tools.get(name)
        return spec.description if spec else None

    def run(self, name: str, params: Mapping[str, Any], context: CallContext) -> Mapping[str, Any]:
        token = _current.set(context)
        try:
            return self._tools[name].run(**params)
        finally:
            _current.reset(token)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)
