"""Run plain Python callables in this process: the default transport.

A tool is the seed design's ``(name, description, run)`` triple::

    tools = InProcessTools()
    tools.register("oracle", "Draw a cryptic omen. Params: {seed: str}.", oracle)
    registry = ToolRegistry(tools)

A tool function receives exactly the call's parameters. What the dispatcher knows
about the call besides them (the operation id, the idempotency key the policy
obliged it to pass, the connection alias) is available during the call through
:func:`current_call`, so a tool that talks to a provider can send the key without
the key ever being a parameter an agent could choose.

This module depends on :mod:`gateway` for the transport contract only; the core
library never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from capgate.gateway.errors import quote
from capgate.gateway.tools.contract import CallContext, ToolFunction
from capgate.gateway.tools.registry import require_catalogue_names

#: The signature of a tool's lookup: the operation id in, the result (or None) out.
LookupFunction = Callable[[str], Mapping[str, Any] | None]

__all__ = ["InProcessTools", "LookupFunction", "ToolSpec", "current_call"]

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
    #: ``lookup(operation_id) -> result or None``: what an earlier attempt of the
    #: operation did at the provider (see capgate.gateway.tools.contract.SupportsLookup).
    lookup: LookupFunction | None = None


class InProcessTools:
    """Holds callables by name and calls them with the call's parameters.

    ``catalogue_tools`` (optional) is the set of names the catalogue defines; when
    given, registering any other name fails at once instead of when the dispatcher
    is built.
    """

    def __init__(self, catalogue_tools: Iterable[str] | None = None) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._known = None if catalogue_tools is None else frozenset(catalogue_tools)

    def register(
        self,
        name: str,
        description: str,
        run: ToolFunction,
        *,
        lookup: LookupFunction | None = None,
    ) -> None:
        """Add the tool ``name``; a second tool of the same name is an error.

        ``lookup`` (optional) finds what an earlier attempt of an operation did at
        the provider, by operation id; a tool that has one can be retried after an
        ``unknown`` outcome without sending twice. It runs with :func:`current_call`
        set, like the tool.
        """
        if not isinstance(name, str) or not name:
            raise TypeError("a tool name must be a non-empty string")
        if not callable(run):
            raise TypeError(f"tool {quote(name)}: run must be callable")
        if lookup is not None and not callable(lookup):
            raise TypeError(f"tool {quote(name)}: lookup must be callable")
        if name in self._tools:
            raise ValueError(f"tool {quote(name)} is already registered")
        if self._known is not None:
            require_catalogue_names([name], self._known)
        self._tools[name] = ToolSpec(name, description, run, lookup)

    def names(self) -> Iterable[str]:
        return self._tools.keys()

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

    def has_lookup(self, name: str) -> bool:
        spec = self._tools.get(name)
        return spec is not None and spec.lookup is not None

    def lookup(
        self, name: str, operation_id: str, context: CallContext
    ) -> Mapping[str, Any] | None:
        spec = self._tools.get(name)
        if spec is None or spec.lookup is None:
            return None
        token = _current.set(context)
        try:
            return spec.lookup(operation_id)
        finally:
            _current.reset(token)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)
