"""Where runnable tools live, independent of who may call them.

The registry answers "which adapter can run this name?" and nothing else:
authorisation is the dispatcher's job and happens *before* the registry is
consulted, so adding a transport can never weaken the boundary. Adapters are tried
in the order they were given; the first that holds a name runs it.

The registry belongs to the library core and knows adapters only through the
:class:`~capgate.gateway.tools.contract.Adapter` protocol; the transports themselves
(in-process, MCP) live in the ``adapters`` package and depend on this one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from capgate.gateway.errors import ToolNotInCatalogue, quote
from capgate.gateway.tools.contract import Adapter

__all__ = ["ToolRegistry", "require_catalogue_names"]


class ToolRegistry:
    """Adapters in order; the first that holds a tool's name runs it."""

    def __init__(self, *adapters: Adapter) -> None:
        self._adapters: list[Adapter] = []
        self._catalogue: frozenset[str] | None = None
        for adapter in adapters:
            self.attach(adapter)

    def attach(self, adapter: Adapter) -> None:
        """Add an adapter, consulted after those already attached.

        Once the registry is bound to a catalogue (a dispatcher does that), an
        adapter offering a name the catalogue lacks is refused.
        """
        if not isinstance(adapter, Adapter):
            raise TypeError(f"{quote(adapter)} does not implement the Adapter protocol")
        if self._catalogue is not None:
            require_catalogue_names(adapter.names(), self._catalogue)
        self._adapters.append(adapter)

    def bind(self, catalogue_tools: Iterable[str]) -> None:
        """Check every registered name against the catalogue, and future ones too.

        A tool registered under a name the catalogue does not have could never be
        called (OPA denies unknown tools), so it is almost always a typo; saying so
        at start-up beats a ``ToolNotRegistered`` on the first real call.
        """
        known = frozenset(catalogue_tools)
        require_catalogue_names(self.names(), known)
        self._catalogue = known

    def names(self) -> set[str]:
        """Every tool name some adapter can run."""
        return {name for adapter in self._adapters for name in adapter.names()}

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


def require_catalogue_names(names: Iterable[str], catalogue: Iterable[str]) -> None:
    """Raise ToolNotInCatalogue naming every name in ``names`` the catalogue lacks."""
    catalogue = frozenset(catalogue)
    unknown = sorted(set(names) - catalogue)
    if unknown:
        raise ToolNotInCatalogue(
            unknown, {name: difflib.get_close_matches(name, catalogue, n=1) for name in unknown}
        )
