"""Which catalogue tools run on the MCP servers, and the pin each runs under.

A catalogue contract that names an ``upstream`` (a server of the ``MCP_SERVERS``
gate and a tool on it) runs on that server, under that tool's pin. With
``unplaced`` (the gate of :func:`capgate.adapters.tools.gate.tool_registry`) the
catalogue tools that name no ``upstream`` run here too, on the configured server
where a tool of the same name was accepted as that catalogue tool; until one is
(or while two servers each have one), such a tool is quarantined like any other
upstream tool. Adapters before the MCP one in a registry (the in-process tools)
keep the tools they hold.

A tool whose pin is not accepted as that very catalogue tool is quarantined (the
gateway's facts carry it, OPA denies it as ``tool_quarantined``). The pin the
gateway was told serves an operation (:meth:`Placement.hold`, when it asks for the
definition's digest before writing the call's intent) is the one the run uses, even
if a person accepts another version meanwhile.

Apart from the adapter because this is read from the catalogue and the store alone,
before and without any server. Nothing here imports ``mcp``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Final

from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.state.records import PinRecord, PinStatus
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import require_catalogue_names

__all__ = ["MAX_PINNED_OPERATIONS", "Placement"]

#: Operations whose definition the gateway pinned and whose run has not started.
MAX_PINNED_OPERATIONS: Final = 4096


class Placement:
    """The catalogue tools the configured ``servers`` run, and the pins they run under."""

    def __init__(
        self,
        catalogue: Catalogue | None,
        servers: Collection[str],
        store: Store,
        *,
        unplaced: bool,
    ) -> None:
        self._servers = servers
        self._store = store
        #: Each tool run here, by its name and by its dispatch action.
        self.targets: dict[str, ToolContract] = {}
        if catalogue is not None:
            for contract in catalogue.tools.values():
                upstream = contract.upstream
                if (upstream is None and unplaced and servers) or (
                    upstream is not None and upstream.server in servers
                ):
                    self.targets[contract.name] = contract
                    self.targets[contract.dispatch_action] = contract
            require_catalogue_names(self.targets, catalogue.runnable_names())
        self._lock = threading.Lock()
        #: operation id -> (tool, the pin it runs under, why its server could not be
        #: reached when the gateway asked, or None)
        self._held: OrderedDict[str, tuple[str, PinRecord, str | None]] = OrderedDict()

    def quarantined(self, names: Collection[str], pins: Sequence[PinRecord]) -> set[str]:
        """Those of ``names`` whose pin is not accepted as that very catalogue tool (for
        an unplaced tool: no configured server has one accepted as it)."""
        quarantined = set()
        for name in names:
            contract = self.targets.get(name)
            pin = self.placed_pin(contract, pins) if contract is not None else None
            if (
                contract is None
                or pin is None
                or pin.status is not PinStatus.ACCEPTED
                or pin.catalogue_tool != contract.name
            ):
                quarantined.add(name)
        return quarantined

    def read_pin(self, contract: ToolContract) -> PinRecord | None:
        """The pin ``contract`` runs under, read from the store now."""
        upstream = contract.upstream
        with self._store.transaction(read_only=True) as tx:
            if upstream is not None:
                return tx.get_pin(upstream.server, upstream.tool)
            return self.placed_pin(contract, tx.pins())

    def placed_pin(self, contract: ToolContract, pins: Sequence[PinRecord]) -> PinRecord | None:
        """The pin a catalogue tool runs under: its ``upstream``'s, whatever its status;
        for an unplaced tool, the one pin of a configured server's tool of its name
        accepted as it (none, or one on each of two servers: no placement)."""
        upstream = contract.upstream
        if upstream is not None:
            return next(
                (p for p in pins if (p.server, p.tool) == (upstream.server, upstream.tool)), None
            )
        placed = [
            pin
            for pin in pins
            if pin.server in self._servers
            and pin.tool == contract.name
            and pin.catalogue_tool == contract.name
            and pin.accepted_digest is not None
        ]
        return placed[0] if len(placed) == 1 else None

    def hold(self, operation_id: str, name: str, pin: PinRecord, unreached: str | None) -> None:
        """Pin ``pin`` for the operation's run of ``name``, with why its server could not
        be reached just now (None: it could); the oldest of too many are let go."""
        with self._lock:
            self._held[operation_id] = (name, pin, unreached)
            self._held.move_to_end(operation_id)
            while len(self._held) > MAX_PINNED_OPERATIONS:
                self._held.popitem(last=False)

    def pin_for(self, name: str, operation_id: str) -> tuple[PinRecord | None, str | None]:
        """The pin ``name`` runs under for the operation, and why its server was found
        unreachable when the gateway asked (None: it was not)."""
        with self._lock:
            held = self._held.pop(operation_id, None)
        if held is not None and held[0] == name:
            return held[1], held[2]
        return self.read_pin(self.targets[name]), None
