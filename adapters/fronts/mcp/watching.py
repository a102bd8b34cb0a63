"""Telling clients what changed: their tool list, and the proposals they follow.

Nothing tells the gateway that a connection was revoked, a definition quarantined or
a policy bundle replaced, nor that a reviewer approved a proposal or a worker
dispatched it: those happen in other processes, through the store or OPA. So each
watch looks again every ``poll_seconds`` (and right after each of its caller's
calls) and notifies on a difference:

- **Tool lists**: composed again, the visible names compared with what the client
  last saw or listed; ``notifications/tools/list_changed`` on a difference. The
  watch asks the dispatcher, not ``Gateway.compose``, so it writes no ledger row
  per poll (a ``tools/list`` does). A compose that fails counts as an empty set
  (fail closed), so a client is also told when its tools went away because no
  decision can be had.
- **Proposals** a client subscribed to (``capgate://proposals/<id>``,
  :mod:`capgate.adapters.fronts.mcp.proposal_resources`): read again, and
  ``notifications/resources/updated`` for each whose resource says something new.

On a handshake-era connection (protocol 2025-11-25 and before; what most clients
speak) the tool watch starts at the connection's first ``tools/list``, the proposal
watch at its first ``resources/subscribe``, and both notify on the connection's own
channel (stdio, or the HTTP session's GET stream), ending with it. On a 2026-07-28
connection, notifications travel only on a ``subscriptions/listen`` stream the client
opens; each stream runs its own watches for the caller that opened it, and ends
with it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from capgate.adapters.fronts.mcp.proposal_resources import proposal_of

if TYPE_CHECKING:
    from capgate.adapters.fronts.mcp.server import Caller

__all__ = ["Waker", "Watches", "connection_of"]

log = logging.getLogger("capgate.serve")

Context = ServerRequestContext[Any, Any]
#: ``Connection.state`` key of a handshake-era connection's tool watch.
_WATCH: Final = "capgate.adapters.fronts.mcp.watch"
#: ``Connection.state`` key of a handshake-era connection's proposal subscriptions.
_SUBSCRIBED: Final = "capgate.adapters.fronts.mcp.subscribed"


class Waker:
    """Wakes a watch before its next poll (after a call of its caller)."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._event.wait()
        self._event = anyio.Event()


class Watches:
    """The watches of one server, each for one caller: what it may see, and the
    proposals it follows. The server gives the lookups (each run in its decision
    threads) and the task group handshake-era watches run in."""

    def __init__(
        self,
        *,
        poll_seconds: float,
        visible: Callable[[Caller, list[bool]], Awaitable[frozenset[str]]],
        fingerprints: Callable[[Caller, set[str]], Awaitable[dict[str, Any]]],
        tasks: Callable[[], anyio.abc.TaskGroup | None],
    ) -> None:
        self.poll_seconds = poll_seconds
        self._visible = visible
        self._fingerprints = fingerprints
        self._tasks = tasks
        self._wakers: dict[str, set[Waker]] = {}

    def wake(self, key: str) -> None:
        """Wake the caller's watches before their next poll (after one of its calls)."""
        for waker in list(self._wakers.get(key, ())):
            waker.wake()

    async def tools(
        self,
        caller: Caller,
        seen: Callable[[], frozenset[str]],
        saw: Callable[[frozenset[str]], None],
        notify: Callable[[], Any],
    ) -> None:
        """Compose every ``poll_seconds`` (or when woken); notify when the visible set
        differs from the last one the client was told about or listed."""
        waker = Waker()
        self._wakers.setdefault(caller.key, set()).add(waker)
        log.debug("watching the tools visible to %s", caller.key)
        failing = [False]
        try:
            while True:
                await waker.wait(self.poll_seconds)
                current = await self._visible(caller, failing)
                if current != seen():
                    saw(current)
                    log.info("the tools visible to %s changed: notifying", caller.key)
                    await notify()
        finally:
            self._wakers.get(caller.key, set()).discard(waker)
            log.debug("the watch of the tools visible to %s ended", caller.key)

    def connection(self, ctx: Context, caller: Caller, listed: frozenset[str]) -> None:
        """Start (or update) the watch of a handshake-era connection."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return  # subscriptions/listen streams carry the notifications there
        connection = connection_of(ctx)
        tasks = self._tasks()
        if connection is None or tasks is None:
            return
        watch = connection.state.get(_WATCH)
        if isinstance(watch, _ConnectionWatch):
            watch.listed = listed
            return
        watch = _ConnectionWatch(listed)
        connection.state[_WATCH] = watch

        async def run() -> None:
            with watch.scope:
                await self.tools(
                    caller,
                    lambda: watch.listed,
                    watch.set_listed,
                    connection.send_tool_list_changed,
                )

        connection.exit_stack.callback(watch.scope.cancel)
        tasks.start_soon(run)

    def subscribe(self, ctx: Context, caller: Caller, uri: str) -> None:
        """``resources/subscribe`` (handshake era): watch the proposal, and send
        ``notifications/resources/updated`` on this connection when it changes."""
        if proposal_of(uri) is None:
            raise MCPError(types.INVALID_PARAMS, "only capgate://proposals/<id> can be subscribed")
        connection = connection_of(ctx)
        tasks = self._tasks()
        if connection is None or tasks is None:
            raise MCPError(
                types.INVALID_REQUEST,
                "no connection to notify: subscribe through subscriptions/listen",
            )
        subscribed = connection.state.get(_SUBSCRIBED)
        if not isinstance(subscribed, _Subscribed):
            subscribed = _Subscribed()
            connection.state[_SUBSCRIBED] = subscribed

            async def run() -> None:
                with subscribed.scope:
                    await self.resources(
                        caller, lambda: set(subscribed.uris), connection.send_resource_updated
                    )

            connection.exit_stack.callback(subscribed.scope.cancel)
            tasks.start_soon(run)
        subscribed.uris.add(uri)

    def unsubscribe(self, ctx: Context, uri: str) -> None:
        """``resources/unsubscribe``: this connection stops hearing of the proposal."""
        connection = connection_of(ctx)
        subscribed = connection.state.get(_SUBSCRIBED) if connection is not None else None
        if isinstance(subscribed, _Subscribed):
            subscribed.uris.discard(uri)

    async def resources(
        self,
        caller: Caller,
        uris: Callable[[], set[str]],
        notify: Callable[[str], Awaitable[None]],
    ) -> None:
        """Read the subscribed proposals every ``poll_seconds`` (or when the caller's
        call wakes the watch) and notify each whose resource says something new."""
        waker = Waker()
        self._wakers.setdefault(caller.key, set()).add(waker)
        try:
            last: dict[str, Any] = {}
            while True:
                wanted = uris()
                now = await self._fingerprints(caller, wanted)
                for uri, value in now.items():
                    if uri in last and last[uri] != value:
                        log.info("proposal resource %s changed: notifying", uri)
                        await notify(uri)
                last = now
                await waker.wait(self.poll_seconds)
        finally:
            self._wakers.get(caller.key, set()).discard(waker)

    async def listen(
        self, ctx: Context, caller: Caller, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """``subscriptions/listen`` (2026-07-28): acknowledge, then notify this stream of
        every change to its caller's visible tools and of each subscribed proposal's
        resource. ``toolsListChanged`` and ``resourceSubscriptions`` (of
        ``capgate://proposals/...``) are honoured: this server has no prompts."""
        subscription = ctx.request_id
        if subscription is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen needs a request id")
        meta = {SUBSCRIPTION_ID_META_KEY: subscription}
        wanted = bool(params.notifications.tools_list_changed)
        uris = sorted(
            {
                str(uri)
                for uri in params.notifications.resource_subscriptions or ()
                if proposal_of(str(uri)) is not None
            }
        )
        honoured = types.SubscriptionFilter(
            tools_list_changed=True if wanted else None, resource_subscriptions=uris or None
        )
        # The baseline first, so a change right after the acknowledgement is not lost.
        baseline = [await self._visible(caller, [False])] if wanted else []
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(
                params=types.SubscriptionsAcknowledgedNotificationParams(
                    notifications=honoured, _meta=meta
                )
            ),
            related_request_id=subscription,
        )

        async def notify() -> None:
            await ctx.session.send_notification(
                types.ToolListChangedNotification(params=types.NotificationParams(_meta=meta)),
                related_request_id=subscription,
            )

        async def updated(uri: str) -> None:
            await ctx.session.send_notification(
                types.ResourceUpdatedNotification(
                    params=types.ResourceUpdatedNotificationParams(uri=uri, _meta=meta)
                ),
                related_request_id=subscription,
            )

        def saw(current: frozenset[str]) -> None:
            baseline[0] = current

        async with anyio.create_task_group() as streams:
            if wanted:
                streams.start_soon(self.tools, caller, lambda: baseline[0], saw, notify)
            if uris:
                streams.start_soon(self.resources, caller, lambda: set(uris), updated)
            await anyio.sleep_forever()
        return types.SubscriptionsListenResult(_meta=meta)  # pragma: no cover - never ends


class _Subscribed:
    """A handshake-era connection's proposal subscriptions, and their watch's scope."""

    def __init__(self) -> None:
        self.uris: set[str] = set()
        self.scope = anyio.CancelScope()


class _ConnectionWatch:
    """A handshake-era connection's watch: what it last listed, and its cancel scope."""

    def __init__(self, listed: frozenset[str]) -> None:
        self.listed = listed
        self.scope = anyio.CancelScope()

    def set_listed(self, names: frozenset[str]) -> None:
        self.listed = names


def connection_of(ctx: Context) -> Connection | None:
    """The connection a request arrived on.

    mcp 2.3's ``ServerRequestContext`` does not carry the ``Connection`` (upstream's
    context rework, "L54", is to add it); its ``ServerSession`` holds it. This is the
    one place that reaches for it: should a later SDK move it, handshake-era change
    notifications stop (``tests/integration/test_mcp_server.py`` fails) while
    ``subscriptions/listen`` streams keep working.
    """
    connection = getattr(ctx.session, "_connection", None)
    return connection if isinstance(connection, Connection) else None
