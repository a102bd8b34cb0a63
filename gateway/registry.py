"""Where runnable tools live, independent of who may call them.

A tool is a ``(name, description, run)`` triple; ``run(**params)`` returns a
JSON-serialisable dict. The registry answers "which adapter can run this name?" and
nothing else: authorisation is the dispatcher's job and happens *before* the
registry is consulted, so adding a transport can never weaken the boundary.

Adapters are tried in order: the registry's own in-process adapter first, then any
attached out-of-process adapter.
"""

from __future__ import annotations

from adapters.in_process import InProcessAdapter
from gateway.transport import Adapter, ToolFunction

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """In-process tools first, then attached adapters, in the order they were added."""

    def __init__(self, *adapters: Adapter) -> None:
        self._local = InProcessAdapter()
        self._adapters: list[Adapter] = [self._local, *adapters]

    def register(self, name: str, description: str, run: ToolFunction) -> None:
        """Register an in-process tool."""
        self._local.register(name, description, run)

    def attach(self, adapter: Adapter) -> None:
        """Add an out-of-process adapter, consulted after the in-process tools."""
        self._adapters.append(adapter)

    def adapter_for(self, name: str) -> Adapter | None:
        return next((a for a in self._adapters if a.has(name)), None)

    def describe(self, name: str) -> str | None:
        """The first adapter's description of ``name``, or None."""
        for adapter in self._adapters:
            text = adapter.describe(name)
            if text is not None:
                return text
        return None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.adapter_for(name) is not None
