"""Recording what upstream servers show, and what people accept or reject, in the store.

Three operations, each one store transaction with its ledger rows:

- :func:`record_listing`: a server listed its tools (the adapter on connecting and on
  every ``notifications/tools/list_changed``, ``capgate mcp discover`` on demand).
  Each tool's pin takes the definition shown; a tool no longer listed is recorded as
  gone. A pin whose status changes (a new tool: ``pending``; an accepted one that
  changed or went away: ``changed``, which quarantines it) gets a ledger row of kind
  ``upstream``. A server can never lift a quarantine this way except by showing
  again exactly the definition a person accepted.
- :func:`accept_definition`: a person accepts the definition shown now (the one
  with the digest they reviewed) as a catalogue tool whose ``upstream`` names that
  server and tool, or as the catalogue tool of the same name that names no
  ``upstream`` (it then runs on that server when the ``MCP_SERVERS`` gate is set).
- :func:`reject_definition`: a person rejects it; the tool stays quarantined while
  the server shows it.

The gateway reads the pins when it gathers facts (:meth:`gateway.Gateway.compose_facts`):
a catalogue tool whose pin is not ``accepted`` as that tool is in the ``quarantined``
fact, which OPA turns into ``tool_quarantined``. Nothing here imports ``mcp``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from capgate.adapters.tools.mcp.definitions import tool_definition
from capgate.gateway.errors import InvalidInput, quote
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.state.records import LedgerEntry, PinRecord, PinStatus
from capgate.gateway.state.store import Store, Tx

__all__ = [
    "PinChange",
    "accept_definition",
    "quarantine_reason",
    "record_listing",
    "reject_definition",
]

log = logging.getLogger("capgate.mcp")

#: Tools read from one listing; a server offering more is cut off (and logged).
MAX_TOOLS: Final = 10_000


@dataclass(frozen=True, slots=True)
class PinChange:
    """A pin whose status or shown definition a listing changed."""

    server: str
    tool: str
    before: PinStatus | None  # None: a tool never seen before
    after: PinStatus
    digest: str | None  # of the definition shown now; None: no longer listed
    catalogue_tool: str | None


def _usable(server: str, tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The listed tools whose definitions can be pinned, by name (others are logged)."""
    usable: dict[str, dict[str, Any]] = {}
    for position, tool in enumerate(tools[:MAX_TOOLS]):
        try:
            definition = tool_definition(tool)
        except InvalidInput as exc:
            log.warning("server=%s: tool #%d cannot be pinned: %s", server, position, exc)
            continue
        usable[definition["name"]] = definition
    if len(tools) > MAX_TOOLS:
        log.warning("server=%s lists more than %d tools; the rest are ignored", server, MAX_TOOLS)
    return usable


def _observe(tx: Tx, server: str, tool: str, definition: dict[str, Any] | None) -> PinRecord | None:
    try:
        return tx.observe_pin(server, tool, definition)
    except InvalidInput as exc:  # a tool name a pin cannot hold, a definition too big
        log.warning("server=%s tool=%s cannot be pinned: %s", server, quote(tool), exc)
        return None


def record_listing(
    store: Store, server: str, tools: Sequence[Mapping[str, Any]], *, source: str
) -> list[PinChange]:
    """Record a complete listing of ``server``'s tools (their JSON, wire names).

    Returns the pins whose status or shown definition changed; each such change is
    also a ledger row (``kind="upstream"``, outcome the new status) naming ``source``.
    """
    listed = _usable(server, tools)
    changes: list[PinChange] = []
    with store.transaction() as tx:
        before = {pin.tool: pin for pin in tx.pins(server=server)}
        seen: dict[str, PinRecord] = {}
        for name, definition in listed.items():
            observed = _observe(tx, server, name, definition)
            if observed is not None:
                seen[name] = observed
        for name, listed_before in before.items():
            if name not in seen and listed_before.observed_digest is not None:
                gone = _observe(tx, server, name, None)
                if gone is not None:
                    seen[name] = gone
        for name, pin in sorted(seen.items()):
            old = before.get(name)
            if old is not None and (old.status, old.observed_digest) == (
                pin.status,
                pin.observed_digest,
            ):
                continue
            change = PinChange(
                server,
                name,
                None if old is None else old.status,
                pin.status,
                pin.observed_digest,
                pin.catalogue_tool,
            )
            changes.append(change)
            tx.append(
                LedgerEntry(
                    kind="upstream",
                    principal=source,
                    tool=pin.catalogue_tool,
                    outcome=pin.status.value,
                    detail={
                        "server": server,
                        "upstream_tool": name,
                        "digest": pin.observed_digest,
                        "was": None if old is None else old.status.value,
                    },
                )
            )
    for change in changes:
        level = logging.WARNING if change.after is PinStatus.CHANGED else logging.INFO
        log.log(
            level,
            "upstream server=%s tool=%s %s -> %s digest=%s catalogue_tool=%s",
            server,
            change.tool,
            change.before.value if change.before else "new",
            change.after.value,
            change.digest,
            change.catalogue_tool,
        )
    return changes


def _contract_for(catalogue: Catalogue, server: str, tool: str, as_tool: str) -> None:
    contract = catalogue.tools.get(as_tool)
    if contract is None:
        raise InvalidInput(f"the catalogue has no tool {quote(as_tool)}")
    upstream = contract.upstream
    if upstream is None and tool == as_tool:
        return  # unplaced: it runs on the server where its namesake is accepted as it
    if upstream is None or (upstream.server, upstream.tool) != (server, tool):
        where = (
            f"names no upstream, so only a tool named {quote(as_tool)} can be accepted as it"
            if upstream is None
            else f"runs tool {quote(upstream.tool)} of server {quote(upstream.server)}"
        )
        raise InvalidInput(
            f"catalogue tool {quote(as_tool)} {where}; a definition is accepted as the "
            f"catalogue tool whose upstream is {{server: {server}, tool: {tool}}}, or as "
            "the unplaced catalogue tool of its own name"
        )


def accept_definition(
    store: Store,
    catalogue: Catalogue,
    server: str,
    tool: str,
    *,
    as_tool: str,
    digest: str | None,
    by: str,
) -> PinRecord:
    """Accept the definition ``server`` shows of ``tool`` as catalogue tool ``as_tool``.

    ``digest`` is the definition the person reviewed (None: the one shown now, read in
    the same transaction). The catalogue contract must name this server and tool as
    its ``upstream``, or name none and share the tool's name: the authority (roles,
    mode, connection, cost, approval) is the contract's, never the server's
    annotations. Raises InvalidInput, UnknownPin or
    PinStale; the acceptance is a ledger row.
    """
    _contract_for(catalogue, server, tool, as_tool)
    with store.transaction() as tx:
        if digest is None:
            shown = tx.get_pin(server, tool)
            digest = shown.observed_digest if shown is not None else ""
        pin = tx.accept_pin(server, tool, digest=digest or "", catalogue_tool=as_tool, by=by)
        tx.append(
            LedgerEntry(
                kind="upstream",
                principal=by,
                tool=as_tool,
                outcome="accepted",
                detail={"server": server, "upstream_tool": tool, "digest": pin.accepted_digest},
            )
        )
    log.info("upstream server=%s tool=%s accepted as %s by=%s", server, tool, as_tool, by)
    return pin


def reject_definition(
    store: Store, server: str, tool: str, *, digest: str | None, by: str
) -> PinRecord:
    """Reject the definition ``server`` shows of ``tool`` (the reviewed one, ``digest``)."""
    with store.transaction() as tx:
        if digest is None:
            shown = tx.get_pin(server, tool)
            digest = shown.observed_digest if shown is not None else ""
        pin = tx.reject_pin(server, tool, digest=digest or "", by=by)
        tx.append(
            LedgerEntry(
                kind="upstream",
                principal=by,
                tool=pin.catalogue_tool,
                outcome="rejected",
                detail={"server": server, "upstream_tool": tool, "digest": pin.rejected_digest},
            )
        )
    log.info("upstream server=%s tool=%s rejected by=%s", server, tool, by)
    return pin


def quarantine_reason(pin: PinRecord | None, as_tool: str) -> str | None:
    """Why the catalogue tool ``as_tool`` on this pin may not run, or None if it may."""
    if pin is None:
        return "never discovered"
    if pin.status is PinStatus.ACCEPTED and pin.catalogue_tool == as_tool:
        return None
    if pin.status is PinStatus.ACCEPTED:
        return f"accepted as {pin.catalogue_tool}, not as {as_tool}"
    return {
        PinStatus.PENDING: "discovered, not accepted yet",
        PinStatus.CHANGED: "changed upstream since it was accepted"
        if pin.observed_digest is not None
        else "no longer listed by its server",
        PinStatus.REJECTED: "its current definition was rejected",
    }[pin.status]
