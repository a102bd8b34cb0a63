"""Run plain Python callables in this process: the default transport."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.transport import CallContext, ToolFunction

__all__ = ["InProcessAdapter", "ToolSpec"]


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
        return self._tools[name].run(**params)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)
