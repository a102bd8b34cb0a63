"""The sessions with the upstream MCP servers: started on demand, held open, stopped.

Each server has at most one session, held open by one long-lived task in the
adapter's loop (:mod:`capgate.adapters.tools.mcp.loop`): a persistent stdio process
or a streamable-HTTP session, its ``subscriptions/listen`` stream on 2026-07-28
connections, and a task that re-lists the tools whenever the server says
``notifications/tools/list_changed`` (:mod:`capgate.adapters.tools.mcp.listing`).
A session is started by the first call that needs it, within the connect timeout,
and its listing is read, recorded and current before it is handed to any call; a
server that went away between calls is started anew; a session that fails ends, and
the calls waiting for it to start or for its listing fail as not sent (a call whose
request left may have had its effect:
:func:`~capgate.adapters.tools.mcp.outcomes.call_failed` says what it means).

:class:`Sessions` holds them, and what the adapter runs in the loop: a call (sent
only if the connection's current listing shows the accepted definition), the digest
a server shows now, a listing on demand, and stopping.

**Credentials** are not forwarded: an upstream server acts with its own
configuration. A stdio server starts with the SDK's minimal environment, never the
gateway's; an HTTP session takes no proxy from the environment and follows no
redirect.

Apart from the adapter because this is everything that runs in the loop, and apart
from the listing because a session's life (starting, failing, ending) is a job of
its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from capgate.adapters.tools.mcp.config import ServerSpec
from capgate.adapters.tools.mcp.listing import Listing
from capgate.adapters.tools.mcp.loop import CLOSE_TIMEOUT, EventLoop
from capgate.adapters.tools.mcp.outcomes import Changed, NotSent, why
from capgate.gateway.state.store import Store
from capgate.gateway.version import __version__

__all__ = ["Connection", "Sessions"]

log = logging.getLogger("capgate.mcp")


@dataclass(eq=False)
class Connection:
    """One server's session, owned by one task in the loop."""

    spec: ServerSpec
    ready: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    client: Client | None = None
    error: str | None = None
    alive: bool = False
    listing: Listing = field(default_factory=Listing)


class Sessions:
    """The servers' sessions, each started on demand; used only inside the loop."""

    def __init__(
        self,
        servers: Mapping[str, ServerSpec],
        store: Store,
        loop: EventLoop,
        *,
        call_timeout: float,
        connect_timeout: float,
        errlog: TextIO | None,
        mode: str,
    ) -> None:
        self.servers = servers
        self.store = store
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.mode = mode
        self._loop = loop
        self._errlog = errlog
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, anyio.Lock] = {}

    # -- what the adapter runs in the loop ---------------------------------------------------

    async def call(
        self,
        server_id: str,
        tool: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
        accepted: str | None,
    ) -> types.CallToolResult:
        """Send the call if the server's current listing shows the ``accepted`` digest:
        Changed if it shows another (nothing sent), NotSent if there is none."""
        connection = await self._connected(server_id)
        # Checked in the loop, with no await between the check and the request: what
        # the connection last listed is what this call is sent under.
        if await self._listed(connection, tool) != accepted:
            raise Changed
        client = connection.client
        assert client is not None
        with anyio.fail_after(self.call_timeout):
            return await client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]

    async def current_digest(self, server_id: str, tool: str) -> str:
        """The digest of ``tool`` in the server's current listing, connecting if need be."""
        return await self._listed(await self._connected(server_id), tool)

    async def discover(self, server_id: str) -> list[dict[str, Any]]:
        """List and record the server's tools now, connecting if need be."""
        connection = await self._connected(server_id)
        assert connection.client is not None
        return await self._relist(connection, connection.client, "capgate mcp discover")

    async def stop_one(self, server_id: str) -> None:
        connection = self._connections.pop(server_id, None)
        if connection is not None:
            connection.stop.set()

    async def stop_all(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            connection.stop.set()
        with anyio.move_on_after(CLOSE_TIMEOUT):
            for connection in connections:
                while connection.alive:
                    await anyio.sleep(0.02)

    # -- a session's life --------------------------------------------------------------------

    async def _listed(self, connection: Connection, tool: str) -> str:
        """The digest of ``tool`` in the connection's listing once it is current
        (:data:`~capgate.adapters.tools.mcp.listing.NOT_LISTED` if the server does not
        list it); NotSent if no current listing is read within the call timeout."""
        if not await connection.listing.wait_current(self.call_timeout) or not connection.alive:
            raise NotSent("the server's changed tool list could not be read again")
        return connection.listing.digest(tool)

    async def _connected(self, server_id: str) -> Connection:
        """The server's live session, started now if there is none (bounded)."""
        lock = self._connecting.setdefault(server_id, anyio.Lock())
        async with lock:
            connection = self._connections.get(server_id)
            if connection is not None and connection.alive and connection.client is not None:
                if not _closed(connection.client):
                    return connection
                connection.stop.set()  # the server went away between calls: start anew
            connection = Connection(self.servers[server_id])
            self._connections[server_id] = connection
            self._loop.tasks.start_soon(self._serve, connection)
            with anyio.move_on_after(self.connect_timeout):
                await connection.ready.wait()
            if connection.client is None or not connection.alive:
                connection.scope.cancel()
                connection.stop.set()
                self._connections.pop(server_id, None)
                raise NotSent(connection.error or f"no session within {self.connect_timeout:g}s")
            return connection

    async def _serve(self, connection: Connection) -> None:
        """Hold one server's session open until told to stop; never raises."""
        spec = connection.spec
        try:
            with connection.scope:
                async with AsyncExitStack() as stack:
                    client = Client(
                        await self._transport(stack, spec),
                        message_handler=self._on_message(connection),
                        client_info=types.Implementation(name="capgate", version=__version__),
                        cache=None,
                        mode=self.mode,
                    )
                    await stack.enter_async_context(client)
                    # Read, recorded and current before the connection is handed out:
                    # no call goes on a connection whose listing was not checked.
                    await self._relist(connection, client, "adapter")
                    connection.client, connection.alive = client, True
                    log.info(
                        "connected server=%s transport=%s protocol=%s",
                        spec.id,
                        spec.transport,
                        client.protocol_version,
                    )
                    async with anyio.create_task_group() as tasks:
                        tasks.start_soon(self._relister, connection, client)
                        capability = client.server_capabilities.tools
                        if capability is not None and capability.list_changed:
                            tasks.start_soon(self._listen, connection, client)
                        connection.ready.set()
                        await connection.stop.wait()
                        tasks.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            raise  # the loop is stopping
        except Exception as exc:  # a server that failed to start, or died: logged, not raised
            connection.error = why(exc)
            log.warning("server=%s session ended: %s", spec.id, connection.error)
        finally:
            connection.alive = False
            connection.ready.set()
            connection.listing.end()  # wakes calls waiting on it: they find it dead
            if self._connections.get(spec.id) is connection:
                del self._connections[spec.id]

    async def _transport(self, stack: AsyncExitStack, spec: ServerSpec) -> Any:
        if spec.url is not None:
            import httpx2

            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    trust_env=False,  # no proxy from the environment: loopback only
                    follow_redirects=False,
                    timeout=httpx2.Timeout(self.connect_timeout, read=300.0),
                )
            )
            return streamable_http_client(spec.url, http_client=http)
        errlog = self._errlog
        if errlog is None:
            errlog = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115
        # The SDK starts the server with a minimal environment (HOME, PATH, ...), never
        # the gateway's own: no credential of the gateway's reaches a server that way.
        params = StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]))
        return stdio_client(params, errlog=errlog)

    def _on_message(self, connection: Connection) -> Any:
        async def handle(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                connection.listing.stale()
            elif isinstance(message, Exception):  # a transport fault: its type only
                log.debug("server=%s transport: %s", connection.spec.id, type(message).__name__)

        return handle

    async def _listen(self, connection: Connection, client: Client) -> None:
        """On a 2026-07-28 connection, list changes arrive on a listen stream.

        There is no replay: after the stream ends, the tools are listed again (a change
        may have been missed) and a new stream is opened, once a second at most.
        """
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return  # handshake era: notifications come unasked, through the handler
        while not connection.stop.is_set() and not _closed(client):
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    async for _event in subscription:
                        connection.listing.stale()
            except Exception as exc:
                log.debug("server=%s listen ended: %s", connection.spec.id, type(exc).__name__)
            connection.listing.stale()
            await anyio.sleep(1.0)

    async def _relister(self, connection: Connection, client: Client) -> None:
        while True:
            await connection.listing.changed()
            try:
                await self._relist(connection, client, "adapter")
            except Exception as exc:
                # Calls wait for a current listing that will not come: end the session,
                # so they fail as not sent and the next call connects and lists anew.
                log.warning("server=%s re-list failed: %s", connection.spec.id, why(exc))
                connection.stop.set()

    async def _relist(
        self, connection: Connection, client: Client, source: str
    ) -> list[dict[str, Any]]:
        return await connection.listing.read(
            client, self.store, connection.spec.id, source, self.call_timeout
        )


def _closed(client: Client) -> bool:
    """Whether the session's connection is known to be gone (the server exited, the
    HTTP session ended). Read from the SDK's dispatcher; unknown counts as open, and
    a call on a closed connection then fails as any other would."""
    try:
        session = client.session
    except RuntimeError:  # the client has left its context: no session at all
        return True
    dispatcher = getattr(session, "_dispatcher", None)
    return getattr(dispatcher, "_closed", False) is True
