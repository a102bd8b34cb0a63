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

__all__ = [
    "Adapter",
    "CallContext",
    "DefinitionChanged",
    "Secret",
    "SupportsLookup",
    "ToolFunction",
]

#: The signature of an in-process tool.
ToolFunction = Callable[..., Mapping[str, Any]]


class Secret:
    """A credential that does not print itself.

    ``str``, ``repr`` and formatting show ``Secret(***)``, so a context or an
    exception that ends up in a log line or a trace cannot carry the value; only
    :meth:`reveal` returns it, for the adapter that sends it to the provider.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("a secret is a non-empty string")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret is not pickled: resolve it where it is used")


@dataclass(frozen=True, slots=True)
class CallContext:
    """What an adapter may know about the call besides its parameters.

    ``credential`` is the connection's secret, resolved from (tenant, alias) by the
    gateway at dispatch only; ``account`` is the provider account it belongs to,
    safe to log. Neither is ever a parameter an agent could set.
    """

    operation_id: str
    idempotency_key: str | None = None
    connection_alias: str | None = None
    tenant: str | None = None
    account: str | None = None
    credential: Secret | None = None


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


@runtime_checkable
class SupportsLookup(Protocol):
    """An adapter that can find what an earlier attempt of an operation did.

    Before an operation whose outcome was ``unknown`` is tried again, the gateway
    asks ``lookup`` with the same name, operation id and context: a receipt found
    there means the action happened, and it is recorded instead of sending again
    (the seed's LOOKUP_BEFORE_RETRY). Return the tool's result as ``run`` would
    have, or None when the provider has no trace of the operation.
    """

    def has_lookup(self, name: str) -> bool:
        """Whether ``lookup`` can really answer for ``name`` (an adapter may hold
        tools with and without one)."""
        ...

    def lookup(
        self, name: str, operation_id: str, context: CallContext
    ) -> Mapping[str, Any] | None: ...


class DefinitionChanged(Exception):
    """The definition a tool's server shows now is not the one a person accepted.

    Raised by an adapter's ``definition_digest``
    (:class:`capgate.gateway.tools.definitions.SupportsDefinitions`) when it finds that out
    before anything is sent; the gateway then refuses the call as
    ``tool_quarantined`` (nothing is claimed, reserved or sent), exactly as OPA would
    have with the new listing in its facts. Never leaves the gateway.
    """
