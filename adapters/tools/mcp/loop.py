"""The one event loop through which a synchronous caller reaches the MCP sessions.

The dispatcher is synchronous, the official ``mcp`` SDK is async (anyio). Each
:class:`~capgate.adapters.tools.mcp.client.McpTools` owns one :class:`EventLoop`:
one daemon thread running one event loop, reached through an anyio blocking portal,
with a task group in which the sessions' long-lived tasks run
(:mod:`capgate.adapters.tools.mcp.sessions`). The thread is started by the first
:meth:`EventLoop.submit`, never when the adapter is built, so a denied call starts
nothing. A caller waits for what it submitted with a bound of its own: no call can
hang the calling thread, whatever a server does.

Apart from the sessions because it is the one place that crosses between threads;
everything it runs is the sessions' and knows nothing of threads.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final

import anyio
import anyio.abc
from anyio.from_thread import BlockingPortal

from capgate.adapters.tools.mcp.outcomes import NotSent

__all__ = ["CLOSE_TIMEOUT", "EventLoop"]

log = logging.getLogger("capgate.mcp")

#: How long close() waits for the servers to stop, per server and in all.
CLOSE_TIMEOUT: Final = 10.0


class _Thread:
    """One event loop in one daemon thread, reached through a blocking portal."""

    def __init__(self, name: str) -> None:
        self._ready = threading.Event()
        self._portal: BlockingPortal | None = None
        self.tasks: anyio.abc.TaskGroup | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._portal is None:
            raise RuntimeError(f"the MCP event loop did not start ({self._failure!r})")

    def _main(self) -> None:
        async def main() -> None:
            async with BlockingPortal() as portal, anyio.create_task_group() as tasks:
                self._portal, self.tasks = portal, tasks
                self._ready.set()
                await portal.sleep_until_stopped()
                tasks.cancel_scope.cancel()

        try:
            anyio.run(main)
        except BaseException as exc:  # pragma: no cover - reported by __init__ or stop
            self._failure = exc
        finally:
            self._ready.set()

    @property
    def portal(self) -> BlockingPortal:
        if self._portal is None or not self._thread.is_alive():
            raise RuntimeError("the MCP event loop is not running")
        return self._portal

    def stop(self, timeout: float) -> None:
        portal = self._portal
        if portal is not None and self._thread.is_alive():
            try:
                portal.start_task_soon(portal.stop, True).result(timeout)
            except Exception as exc:  # already stopping, or too slow: the thread is a daemon
                log.debug("stopping the MCP event loop: %s", type(exc).__name__)
        self._thread.join(timeout)


class EventLoop:
    """The loop thread, started on the first submit and stopped once by close."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: _Thread | None = None
        self._closed = False
        self._ids = itertools.count(1)

    @property
    def tasks(self) -> anyio.abc.TaskGroup:
        """The loop's task group, for tasks that outlive the call that starts them;
        read only by code running in the loop."""
        thread = self._thread
        assert thread is not None
        assert thread.tasks is not None
        return thread.tasks

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args)`` in the loop (starting it if need be); NotSent if it cannot."""
        with self._lock:
            if self._closed:
                raise NotSent("the adapter is closed")
            if self._thread is None:
                try:
                    self._thread = _Thread(f"capgate-mcp-{next(self._ids)}")
                except RuntimeError as exc:
                    raise NotSent(str(exc)) from None
            thread = self._thread
        try:
            return thread.portal.start_task_soon(fn, *args)
        except RuntimeError as exc:  # the loop stopped
            raise NotSent(str(exc)) from None

    def close(self, last: Callable[[], Awaitable[None]]) -> None:
        """Run ``last`` in the loop (bounded), then stop the loop; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            thread.portal.start_task_soon(last).result(CLOSE_TIMEOUT)
        except Exception as exc:
            log.debug("stopping MCP sessions: %s", type(exc).__name__)
        thread.stop(CLOSE_TIMEOUT)
