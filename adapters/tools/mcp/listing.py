"""A server's tool listing on one connection: read, recorded, and current before a call.

A tool runs only under a definition a person accepted
(:mod:`capgate.adapters.tools.mcp.pins`). Every listing a connection reads is
recorded there: a changed definition quarantines the tool (the gateway's next facts
carry it, OPA denies it as ``tool_quarantined``); a call already running finishes on
the version it started with.

Nothing is sent on a connection before its listing has been read and checked
against the accepted pins. Each connection's :class:`Listing` keeps the digests of
what its server listed last; a ``notifications/tools/list_changed`` makes it stale,
which holds every call on the connection until the new listing is read, and a
listing begun before the last change does not make it current again. A call is
then sent only if the digest listed now is the accepted one, compared in the event
loop just before its request leaves.

Apart from the sessions because this is the state that rule rests on, small enough
to be read whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.to_thread
from mcp import Client

from capgate.adapters.tools.mcp.definitions import tool_definition
from capgate.adapters.tools.mcp.pins import record_listing
from capgate.gateway.errors import InvalidInput
from capgate.gateway.state.records import definition_digest
from capgate.gateway.state.store import Store

__all__ = ["MAX_PAGES", "NOT_LISTED", "Listing", "digests", "list_tools"]

#: Pages of tools/list read per listing (the SDK's own cap for a re-list).
MAX_PAGES: Final = 100
#: What a listing's digests say of a tool its server does not list.
NOT_LISTED: Final = "not listed"


@dataclass(eq=False)
class Listing:
    """What one connection's server listed last, and whether that is still its latest."""

    #: The digest of each tool's definition in the server's last listing on this
    #: connection, by upstream tool name.
    definitions: dict[str, str] = field(default_factory=dict)
    #: Set while ``definitions`` is the server's latest listing; replaced by an unset
    #: event when the server says its list changed, until the new one is read. Calls
    #: on the connection wait for it: nothing is sent under a listing known stale.
    current: anyio.Event = field(default_factory=anyio.Event)
    #: How many times the server said its list changed; a listing begun before the
    #: last of them does not make ``definitions`` current.
    changes: int = 0
    #: Set when the server said its list changed and it has not been read again since.
    relist: anyio.Event = field(default_factory=anyio.Event)

    def stale(self) -> None:
        """The server's list changed: hold calls until it is read again."""
        self.changes += 1
        self.relist.set()
        if self.current.is_set():
            self.current = anyio.Event()

    async def changed(self) -> None:
        """Wait until the server says its list changed (once for each time it does)."""
        await self.relist.wait()
        self.relist = anyio.Event()

    async def read(
        self, client: Client, store: Store, server_id: str, source: str, timeout: float
    ) -> list[dict[str, Any]]:
        """List the server's tools, record the listing, and make it the current one
        unless the server said its list changed again meanwhile."""
        changes = self.changes
        with anyio.fail_after(timeout):
            tools = await list_tools(client)
        await anyio.to_thread.run_sync(_record, store, server_id, tools, source)
        self.definitions = digests(tools)
        if self.changes == changes:
            self.current.set()
        return tools

    async def wait_current(self, timeout: float) -> bool:
        """Wait, up to ``timeout``, for the listing to be current; whether it is."""
        with anyio.move_on_after(timeout):
            while not self.current.is_set():
                await self.current.wait()
        return self.current.is_set()

    def digest(self, tool: str) -> str:
        """The digest of ``tool`` in the listing (:data:`NOT_LISTED` if it is not in it)."""
        return self.definitions.get(tool, NOT_LISTED)

    def end(self) -> None:
        """The session ended: wake the calls waiting for a listing (they find it dead)."""
        self.current.set()


async def list_tools(client: Client) -> list[dict[str, Any]]:
    """Every tool the server lists (its JSON, wire names), up to :data:`MAX_PAGES` pages."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(
            tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in page.tools
        )
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def digests(tools: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The digest of each listed tool's definition, by name, as its pin computes it; a
    tool that cannot be pinned has none (calls of it are refused as changed)."""
    found: dict[str, str] = {}
    for tool in tools:
        try:
            definition = tool_definition(tool)
        except InvalidInput:
            continue
        found[definition["name"]] = definition_digest(definition)
    return found


def _record(store: Store, server_id: str, tools: list[dict[str, Any]], source: str) -> None:
    record_listing(store, server_id, tools, source=source)
