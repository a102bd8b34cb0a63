"""Run granted tools on MCP servers: the MCP transport, over stdio and streamable HTTP.

:class:`McpTools` implements the core's :class:`~capgate.gateway.tools.contract.Adapter`
protocol for the catalogue contracts that name an ``upstream`` (a server of the
``MCP_SERVERS`` gate and a tool on it). By the time :meth:`McpTools.run` is called,
OPA has allowed that exact call, so a denied call never reaches this module: no
server is started and no connection opened for it (servers are started on the first
*authorised* call, never when the adapter is built).

**Threading model.** The dispatcher is synchronous, the official ``mcp`` SDK is
async (anyio): each McpTools owns one :class:`~capgate.adapters.tools.mcp.loop.EventLoop`,
a daemon thread started by the first call that needs it. Each upstream server has
one long-lived task in that loop holding its ``mcp.Client`` session open (a
persistent stdio process, or a streamable-HTTP session), its ``subscriptions/listen``
stream on 2026-07-28 connections, and a task that re-lists the tools whenever the
server says ``notifications/tools/list_changed``. :meth:`McpTools.run` submits the
call to the loop and waits for it with a bound (the connect timeout, a call timeout
for a current listing and one for the call, and a grace second), so no call can hang
the calling thread, whatever the server does.

**Pinned definitions.** A tool runs only under a definition a person accepted
(:mod:`capgate.adapters.tools.mcp.pins`), and nothing is sent on a connection before
its listing has been read, recorded and checked against the accepted pins
(:mod:`capgate.adapters.tools.mcp.listing`). The gateway asks
:meth:`McpTools.definition_digest` before it writes the call's intent, which
connects, lists and compares, so a call whose tool the server now shows in another
version (a server restarted with a changed schema, say) is refused as
``tool_quarantined`` with nothing reserved; the same check runs again in the event
loop just before the request leaves. The digest it returns names, for the ledger,
the definition that serves the call, and is pinned for the operation. Arguments are
checked against the accepted input schema before anything is sent (the dispatcher
already checked them against the catalogue contract's), structured results against
the accepted output schema (:mod:`capgate.adapters.tools.mcp.schemas`).

**Placement.** Which catalogue tools run here (with ``unplaced=True``, also those
that name no ``upstream``, on the server where a tool of their name was accepted as
them), which are quarantined, and the pin each runs under are read in
:mod:`capgate.adapters.tools.mcp.placement`, from the catalogue and the store alone.

**Outcomes.** What each ending of a call means (``success``, ``refused``,
``retryable``, ``unknown``) is read in :mod:`capgate.adapters.tools.mcp.outcomes`:
retryable only when nothing was sent or the call is a ``read``. Output is data,
returned as the result and never reaching OPA's input.

**No lookup.** McpTools does not implement
:class:`~capgate.gateway.tools.contract.SupportsLookup`: MCP has no standard way to ask a
server what an earlier call did (``tools/call`` carries no operation id a server
must remember, and a server's tasks are not a receipt store). So an ``unknown``
outcome of a ``not_idempotent`` upstream tool is never sent again by the gateway;
an ``idempotent_with_key`` tool receives its key in the request's ``_meta``
(``io.capgate/idempotency-key``) and may be repeated.

**Credentials** are not forwarded: an upstream server acts with its own
configuration. The connection alias still gates which tools are callable; the
resolved secret stays in the gateway.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from capgate.adapters.tools.mcp.config import ServerSpec
from capgate.adapters.tools.mcp.listing import Listing
from capgate.adapters.tools.mcp.loop import CLOSE_TIMEOUT, EventLoop
from capgate.adapters.tools.mcp.outcomes import (
    Changed,
    NotSent,
    call_failed,
    call_result,
    connection_closed,
    not_sent,
    why,
)
from capgate.adapters.tools.mcp.placement import Placement
from capgate.adapters.tools.mcp.schemas import schema_problem
from capgate.gateway.errors import (
    UpstreamConfigError,
    UpstreamUnavailable,
    quote,
)
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.outcomes import ToolRefused
from capgate.gateway.state.records import PinRecord
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import CallContext, DefinitionChanged
from capgate.gateway.version import __version__

__all__ = ["IDEMPOTENCY_META_KEY", "McpTools"]

log = logging.getLogger("capgate.mcp")

#: Where a call's idempotency key travels: the tools/call request's ``_meta``.
IDEMPOTENCY_META_KEY: Final = "io.capgate/idempotency-key"


@dataclass(eq=False)
class _Connection:
    """One server's session, owned by one task in the loop."""

    spec: ServerSpec
    ready: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    client: Client | None = None
    error: str | None = None
    alive: bool = False
    listing: Listing = field(default_factory=Listing)


_LIVE: weakref.WeakSet[McpTools] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:  # pragma: no cover - runs at interpreter exit
    for tools in list(_LIVE):
        tools.close()


class McpTools:
    """Runs catalogue tools that name an ``upstream`` on the configured MCP servers.

    ``servers`` are the gate's (:func:`capgate.adapters.tools.mcp.config.servers_from_env`);
    ``store`` is the gateway's, where definitions are pinned and accepted.
    ``call_timeout`` bounds one call once connected; ``connect_timeout`` bounds
    starting a server and its handshake. A server's stderr goes to ``errlog``
    (default: discarded). ``mode="legacy"`` skips the 2026-07-28 ``server/discover``
    probe and always uses the ``initialize`` handshake (for a server whose probe
    misbehaves). With ``unplaced``, the catalogue tools that name no ``upstream`` run
    here too, on the server where a tool of their name was accepted as them (see the
    module doc). Close it (or use it as a context manager) to stop the
    servers; at interpreter exit every open McpTools is closed.
    """

    def __init__(
        self,
        catalogue: Catalogue | None,
        servers: Iterable[ServerSpec],
        store: Store,
        *,
        call_timeout: float = 30.0,
        connect_timeout: float = 15.0,
        errlog: TextIO | None = None,
        mode: str = "auto",
        unplaced: bool = False,
    ) -> None:
        self.servers: dict[str, ServerSpec] = {}
        for spec in servers:
            if not isinstance(spec, ServerSpec):
                raise UpstreamConfigError(f"a server is a ServerSpec, not a {type(spec).__name__}")
            if spec.id in self.servers:
                raise UpstreamConfigError(f"two servers have the id {quote(spec.id)}")
            self.servers[spec.id] = spec
        for name, value in (("call_timeout", call_timeout), ("connect_timeout", connect_timeout)):
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not 0 < value < 3600
            ):
                raise UpstreamConfigError(f"{name} must be a number of seconds, above 0")
        if mode not in ("auto", "legacy"):
            raise UpstreamConfigError("mode is 'auto' (negotiate the protocol era) or 'legacy'")
        self.store = store
        self.mode = mode
        self.call_timeout = float(call_timeout)
        self.connect_timeout = float(connect_timeout)
        self._errlog = errlog
        self._placement = Placement(catalogue, self.servers, store, unplaced=unplaced)
        self._targets = self._placement.targets
        self._loop = EventLoop()
        self._connections: dict[str, _Connection] = {}
        self._connecting: dict[str, anyio.Lock] = {}
        _LIVE.add(self)

    # -- the Adapter protocol --------------------------------------------------------------

    def names(self) -> Iterable[str]:
        return sorted(self._targets)

    def has(self, name: str) -> bool:
        return name in self._targets

    def describe(self, name: str) -> str | None:
        """The catalogue's reviewed description, never the one a server announces."""
        contract = self._targets.get(name)
        return contract.description if contract is not None else None

    def run(self, name: str, params: Mapping[str, Any], context: CallContext) -> Mapping[str, Any]:
        """Call the tool on its server under its accepted definition; see the module doc."""
        contract = self._targets[name]
        pin, unreached = self._placement.pin_for(name, context.operation_id)
        definition = pin.accepted_definition if pin is not None else None
        if pin is None or definition is None or pin.catalogue_tool != contract.name:
            raise ToolRefused(
                f"tool {contract.name!r} has no upstream definition accepted as it; "
                "nothing was sent"
            )
        server, tool = pin.server, pin.tool
        if unreached is not None:  # just now, before the intent: not tried a second time
            raise not_sent(server, unreached)
        problem = schema_problem(definition.get("inputSchema"), dict(params))
        if problem is not None:
            raise ToolRefused(
                f"the arguments do not fit the accepted input schema of tool {tool!r} "
                f"of server {server!r} ({problem}); nothing was sent"
            )
        meta = {IDEMPOTENCY_META_KEY: context.idempotency_key} if context.idempotency_key else None
        bound = self.connect_timeout + 2 * self.call_timeout + 1.0
        try:
            future = self._loop.submit(
                self._call, server, tool, dict(params), meta, pin.accepted_digest
            )
            result: types.CallToolResult = future.result(bound)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                future.cancel()
            elif connection_closed(exc):
                self._drop(server)
            call_failed(exc, contract, server, tool, self.call_timeout)
        return call_result(contract, definition, result)

    def quarantined(self, names: Collection[str], pins: Sequence[PinRecord]) -> set[str]:
        """Those of ``names`` whose pin is not accepted as that very catalogue tool (for
        an unplaced tool: no configured server has one accepted as it)."""
        return self._placement.quarantined(names, pins)

    def definition_digest(self, name: str, operation_id: str | None = None) -> str | None:
        """The digest of the accepted definition ``name`` runs under, or None.

        Connects to the tool's server if no session is open (its listing is read and
        recorded on connecting) and compares what the server shows now with the
        accepted definition: DefinitionChanged if they differ, or if the server no
        longer lists the tool. A server that cannot be reached is not compared here:
        its run is then ``retryable`` at once (nothing sent), rather than waiting for a
        second connect. Given an operation id, that definition is pinned for the
        operation: its run uses exactly it, even if a person accepts another version
        meanwhile.
        """
        contract = self._targets.get(name)
        if contract is None:
            return None
        pin = self._placement.read_pin(contract)
        if pin is None or pin.accepted_digest is None:
            return None
        shown, unreached = self._shown(pin.server, pin.tool)
        if shown is not None and shown != pin.accepted_digest:
            raise DefinitionChanged(
                f"server {pin.server!r} shows a definition of tool {pin.tool!r} other than "
                "the accepted one"
            )
        if operation_id is not None:
            self._placement.hold(operation_id, name, pin, unreached)
        return pin.accepted_digest if pin is not None else None

    # -- discovery ---------------------------------------------------------------------------

    def discover(self, server_ids: Iterable[str] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Connect to the servers (all, or those named), list and record their tools.

        Returns each server's listing (the tools' JSON, wire names); a server that
        cannot be reached raises UpstreamUnavailable naming it. Used by ``capgate mcp
        discover``; the adapter also lists on every connect and list change.
        """
        listings = {}
        for server_id in server_ids if server_ids is not None else sorted(self.servers):
            if server_id not in self.servers:
                raise UpstreamConfigError(f"no configured server has the id {quote(server_id)}")
            bound = self.connect_timeout + self.call_timeout + 1.0
            try:
                listings[server_id] = self._loop.submit(self._discover, server_id).result(bound)
            except (NotSent, TimeoutError, concurrent.futures.TimeoutError, MCPError) as exc:
                raise UpstreamUnavailable(
                    f"server {server_id!r} could not be listed ({why(exc)})"
                ) from None
        return listings

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every server session and the event loop (idempotent)."""
        self._loop.close(self._stop_all)

    def __enter__(self) -> McpTools:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<McpTools servers={sorted(self.servers)} tools={len(self._targets)}>"

    # -- inside the calling thread ---------------------------------------------------------

    def _shown(self, server_id: str, tool: str) -> tuple[str | None, str | None]:
        """The digest of ``tool`` in the server's latest listing (connecting first if
        need be; :data:`~capgate.adapters.tools.mcp.listing.NOT_LISTED` if it lists no
        such tool), or None and why the server could not be reached or listed within
        the bounds."""
        if server_id not in self.servers:
            return None, None
        bound = self.connect_timeout + self.call_timeout + 1.0
        try:
            shown: str = self._loop.submit(self._current_digest, server_id, tool).result(bound)
        except (NotSent, TimeoutError, concurrent.futures.TimeoutError) as exc:
            log.info("server=%s: no listing to compare before the call (%s)", server_id, why(exc))
            return None, why(exc) if isinstance(exc, NotSent) else "no listing within the bound"
        except Exception as exc:
            log.warning("server=%s: listing not compared (%s)", server_id, why(exc))
            return None, why(exc)
        return shown, None

    def _drop(self, server_id: str) -> None:
        try:
            self._loop.submit(self._stop_one, server_id).result(CLOSE_TIMEOUT)
        except Exception as exc:
            log.debug("dropping server=%s: %s", server_id, type(exc).__name__)

    # -- inside the event loop -------------------------------------------------------------

    async def _call(
        self,
        server_id: str,
        tool: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
        accepted: str | None,
    ) -> types.CallToolResult:
        connection = await self._connected(server_id)
        # Checked in the loop, with no await between the check and the request: what
        # the connection last listed is what this call is sent under.
        if await self._listed(connection, tool) != accepted:
            raise Changed
        client = connection.client
        assert client is not None
        with anyio.fail_after(self.call_timeout):
            return await client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]

    async def _current_digest(self, server_id: str, tool: str) -> str:
        return await self._listed(await self._connected(server_id), tool)

    async def _listed(self, connection: _Connection, tool: str) -> str:
        """The digest of ``tool`` in the connection's listing once it is current
        (:data:`~capgate.adapters.tools.mcp.listing.NOT_LISTED` if the server does not
        list it); NotSent if no current listing is read within the call timeout."""
        if not await connection.listing.wait_current(self.call_timeout) or not connection.alive:
            raise NotSent("the server's changed tool list could not be read again")
        return connection.listing.digest(tool)

    async def _discover(self, server_id: str) -> list[dict[str, Any]]:
        connection = await self._connected(server_id)
        assert connection.client is not None
        return await self._relist(connection, connection.client, "capgate mcp discover")

    async def _connected(self, server_id: str) -> _Connection:
        """The server's live session, started now if there is none (bounded)."""
        lock = self._connecting.setdefault(server_id, anyio.Lock())
        async with lock:
            connection = self._connections.get(server_id)
            if connection is not None and connection.alive and connection.client is not None:
                if not _closed(connection.client):
                    return connection
                connection.stop.set()  # the server went away between calls: start anew
            connection = _Connection(self.servers[server_id])
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

    async def _serve(self, connection: _Connection) -> None:
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

    def _on_message(self, connection: _Connection) -> Any:
        async def handle(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                connection.listing.stale()
            elif isinstance(message, Exception):  # a transport fault: its type only
                log.debug("server=%s transport: %s", connection.spec.id, type(message).__name__)

        return handle

    async def _listen(self, connection: _Connection, client: Client) -> None:
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

    async def _relister(self, connection: _Connection, client: Client) -> None:
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
        self, connection: _Connection, client: Client, source: str
    ) -> list[dict[str, Any]]:
        return await connection.listing.read(
            client, self.store, connection.spec.id, source, self.call_timeout
        )

    async def _stop_one(self, server_id: str) -> None:
        connection = self._connections.pop(server_id, None)
        if connection is not None:
            connection.stop.set()

    async def _stop_all(self) -> None:
        connections = list(self._connections.values())
        self._connections.clear()
        for connection in connections:
            connection.stop.set()
        with anyio.move_on_after(CLOSE_TIMEOUT):
            for connection in connections:
                while connection.alive:
                    await anyio.sleep(0.02)


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
