"""Run granted tools on MCP servers: the MCP transport, over stdio and streamable HTTP.

:class:`McpTools` implements the core's :class:`~capgate.gateway.tools.contract.Adapter`
protocol for the catalogue contracts that name an ``upstream`` (a server of the
``MCP_SERVERS`` gate and a tool on it). By the time :meth:`McpTools.run` is called,
OPA has allowed that exact call, so a denied call never reaches this module: no
server is started and no connection opened for it (servers are started on the first
*authorised* call, never when the adapter is built).

This module is the adapter's face to the dispatcher and the gateway, and the order
of a call's checks; each job under it has a module of its own:

- :mod:`~capgate.adapters.tools.mcp.placement`: which catalogue tools run here, and
  the pin each runs under (unplaced tools, quarantine, the pin held for an
  operation);
- :mod:`~capgate.adapters.tools.mcp.loop`: the event-loop thread the synchronous
  caller reaches the async SDK through, each wait bounded;
- :mod:`~capgate.adapters.tools.mcp.sessions`: each server's session, started on
  demand, held open, stopped; the call itself;
- :mod:`~capgate.adapters.tools.mcp.listing`: a connection's listing, recorded and
  current before anything is sent on it;
- :mod:`~capgate.adapters.tools.mcp.schemas`: the accepted input and output schemas;
- :mod:`~capgate.adapters.tools.mcp.outcomes`: what each ending of a call means.

**A call's checks, in order.** The gateway asks :meth:`McpTools.definition_digest`
before it writes the call's intent, which connects, lists and compares what the
server shows with the accepted definition, so a call whose tool the server now shows
in another version (a server restarted with a changed schema, say) is refused as
``tool_quarantined`` with nothing reserved; the digest it returns names, for the
ledger, the definition that serves the call, and is pinned for the operation. Then
:meth:`McpTools.run` refuses a tool with no definition accepted as it, fails a
server found unreachable then as retryable without trying it again, and checks the
arguments against the accepted input schema (the dispatcher already checked them
against the catalogue contract's); only then is the call submitted, and the
definition is compared again in the event loop just before the request leaves. The
caller waits for it with a bound (the connect timeout, a call timeout for a current
listing and one for the call, and a grace second), so no call can hang the calling
thread, whatever the server does.

**No lookup.** McpTools does not implement
:class:`~capgate.gateway.tools.contract.SupportsLookup`: MCP has no standard way to ask a
server what an earlier call did (``tools/call`` carries no operation id a server
must remember, and a server's tasks are not a receipt store). So an ``unknown``
outcome of a ``not_idempotent`` upstream tool is never sent again by the gateway;
an ``idempotent_with_key`` tool receives its key in the request's ``_meta``
(``io.capgate/idempotency-key``) and may be repeated.

**Trace context** goes with every call: the current span's (``capgate.tool``) W3C
``traceparent`` and ``tracestate`` in ``_meta``, where MCP's convention puts them
(SEP-414, https://modelcontextprotocol.io/community/seps/414-request-meta, after
OpenTelemetry's MCP semantic conventions,
https://opentelemetry.io/docs/specs/semconv/gen-ai/mcp/), so an upstream that reads
them continues the gateway's trace. The MCP SDK (2.3) then opens its own client span
and injects *its* context with the application's global propagator over those keys
(so the upstream's parent is the SDK's span, a child of ``capgate.tool``); ours stay
the W3C form when that propagator is another. Not as HTTP headers to a
streamable-HTTP server: ``ClientSession.call_tool`` takes no per-request headers.
Never baggage, and nothing of the agent's request: a call's ``_meta`` is built here
from these and the idempotency key alone (:func:`_call_meta`), and the call is
submitted :func:`~capgate.gateway.tracing.without_baggage`, as the SDK would
otherwise inject whatever baggage the application's context holds. (An MCP client's
own ``_meta`` keys, baggage included, are not made current by the SDK's server;
tests/integration/test_mcp_upstream_trace.py checks that none reaches an upstream.)

**Credentials** are not forwarded: an upstream server acts with its own
configuration. The connection alias still gates which tools are callable; the
resolved secret stays in the gateway.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final, TextIO

import mcp_types as types
from mcp.shared.exceptions import MCPError

from capgate.adapters.tools.mcp.config import ServerSpec
from capgate.adapters.tools.mcp.loop import CLOSE_TIMEOUT, EventLoop
from capgate.adapters.tools.mcp.outcomes import (
    NotSent,
    call_failed,
    call_result,
    connection_closed,
    not_sent,
    why,
)
from capgate.adapters.tools.mcp.placement import Placement
from capgate.adapters.tools.mcp.schemas import schema_problem
from capgate.adapters.tools.mcp.sessions import Sessions
from capgate.gateway.errors import UpstreamConfigError, UpstreamUnavailable, quote
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.outcomes import ToolRefused
from capgate.gateway.state.records import PinRecord
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import CallContext, DefinitionChanged
from capgate.gateway.tracing import trace_context, without_baggage

__all__ = ["IDEMPOTENCY_META_KEY", "McpTools"]

log = logging.getLogger("capgate.mcp")

#: Where a call's idempotency key travels: the tools/call request's ``_meta``.
IDEMPOTENCY_META_KEY: Final = "io.capgate/idempotency-key"

_LIVE: weakref.WeakSet[McpTools] = weakref.WeakSet()


def _call_meta(context: CallContext) -> dict[str, Any] | None:
    """The ``_meta`` of a ``tools/call``: the current span's W3C trace context
    (:func:`capgate.gateway.tracing.trace_context`) and the idempotency key, if any;
    None when there is neither. Read in the calling thread, where the span is
    current (the request leaves from the event loop's thread)."""
    meta: dict[str, Any] = dict(trace_context())
    if context.idempotency_key:
        meta[IDEMPOTENCY_META_KEY] = context.idempotency_key
    return meta or None


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
    here too, on the server where a tool of their name was accepted as them (see
    :mod:`~capgate.adapters.tools.mcp.placement`). Close it (or use it as a context
    manager) to stop the servers; at interpreter exit every open McpTools is closed.
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
        self._placement = Placement(catalogue, self.servers, store, unplaced=unplaced)
        self._targets = self._placement.targets
        self._loop = EventLoop()
        self._sessions = Sessions(
            self.servers,
            store,
            self._loop,
            call_timeout=self.call_timeout,
            connect_timeout=self.connect_timeout,
            errlog=errlog,
            mode=mode,
        )
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
        meta = _call_meta(context)
        bound = self.connect_timeout + 2 * self.call_timeout + 1.0
        call = self._sessions.call
        try:
            # The task takes this thread's context (the span, for the trace); not its
            # baggage, which the SDK would pass on.
            with without_baggage():
                future = self._loop.submit(
                    call, server, tool, dict(params), meta, pin.accepted_digest
                )
            result: types.CallToolResult = future.result(bound)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                future.cancel()  # and with it the call's task in the loop
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
                future = self._loop.submit(self._sessions.discover, server_id)
                listings[server_id] = future.result(bound)
            except (NotSent, TimeoutError, concurrent.futures.TimeoutError, MCPError) as exc:
                raise UpstreamUnavailable(
                    f"server {server_id!r} could not be listed ({why(exc)})"
                ) from None
        return listings

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every server session and the event loop (idempotent)."""
        self._loop.close(self._sessions.stop_all)

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
            future = self._loop.submit(self._sessions.current_digest, server_id, tool)
            shown: str = future.result(bound)
        except (NotSent, TimeoutError, concurrent.futures.TimeoutError) as exc:
            log.info("server=%s: no listing to compare before the call (%s)", server_id, why(exc))
            return None, why(exc) if isinstance(exc, NotSent) else "no listing within the bound"
        except Exception as exc:
            log.warning("server=%s: listing not compared (%s)", server_id, why(exc))
            return None, why(exc)
        return shown, None

    def _drop(self, server_id: str) -> None:
        try:
            self._loop.submit(self._sessions.stop_one, server_id).result(CLOSE_TIMEOUT)
        except Exception as exc:
            log.debug("dropping server=%s: %s", server_id, type(exc).__name__)
