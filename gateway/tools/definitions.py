"""What the gateway asks of an adapter whose tools run under accepted definitions.

An MCP server describes its own tools, and may change them whenever it likes; capgate
runs such a tool only under a definition a person accepted (``capgate.adapters.tools.mcp.pins``).
The stateful gateway is the one that reads the pins (with every call's facts) and
writes the ledger, so the protocol an adapter implements for it lives here, beside
the store's :class:`~capgate.gateway.state.records.PinRecord`, not in the stateless
dispatcher's transport contract.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

from capgate.gateway.state.records import PinRecord
from capgate.gateway.tools.contract import DefinitionChanged

__all__ = ["DefinitionChanged", "SupportsDefinitions"]


@runtime_checkable
class SupportsDefinitions(Protocol):
    """An adapter whose tools run only under a definition a person accepted (MCP).

    The gateway asks it twice: which of its tools the pins quarantine, when it gathers
    a call's facts (OPA hides and denies those as ``tool_quarantined``); and, once a
    call is allowed and before its intent is written, which definition will serve the
    call, so the ledger names the definition that actually ran.
    """

    def quarantined(self, names: Collection[str], pins: Sequence[PinRecord]) -> set[str]:
        """Those of ``names`` (tools this adapter runs) that ``pins`` do not let run."""
        ...

    def definition_digest(self, name: str, operation_id: str) -> str | None:
        """The digest of the definition the server shows now for ``name``, which must be
        the accepted one (else :class:`DefinitionChanged`), pinned for the operation;
        None when the adapter cannot tell (the run then checks again before sending)."""
        ...
