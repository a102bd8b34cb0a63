"""Listeners: who waits for a change, and how a committed transaction wakes them.

A transaction's notices (:meth:`~capgate.gateway.state.store.Tx.notify`) are kept
until it ends. When it commits, :class:`Notices` wakes every listener of this store
object on those channels at once, whatever the backend; on PostgreSQL the same
commit has also sent them with ``NOTIFY``, which wakes the listeners of every other
process through their backend listener. A rolled-back transaction wakes nobody.

A wake-up is a flag that stays up until the next :meth:`StoreListener.wait`
returns, so a notice that arrives while its waiter is busy elsewhere is not lost.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from capgate.gateway.state.backend import Backend, BackendListener
from capgate.gateway.state.store import CHANNELS, Channel

__all__ = ["Notices", "StoreListener"]


class StoreListener:
    """One waiter's listener (see :class:`~capgate.gateway.state.store.Listener`)."""

    def __init__(self, notices: Notices, channel: Channel, backend: Backend) -> None:
        self.channel = channel
        self._notices = notices
        self._event = threading.Event()
        self._closed = False
        notices.add(self)
        try:
            self._remote: BackendListener | None = backend.listener(channel, self.wake)
        except BaseException:
            notices.discard(self)
            raise

    @property
    def listening(self) -> bool:
        return not self._closed and self._remote is not None and self._remote.listening

    def wait(self, timeout: float) -> bool:
        woken = self._event.wait(max(timeout, 0.0))
        self._event.clear()
        return woken

    def wake(self) -> None:
        self._event.set()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._notices.discard(self)
        if self._remote is not None:
            self._remote.close()
        self.wake()

    def __enter__(self) -> StoreListener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Notices:
    """The listeners of one store object, by channel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[Channel, set[StoreListener]] = {name: set() for name in CHANNELS}

    def add(self, listener: StoreListener) -> None:
        with self._lock:
            self._listeners[listener.channel].add(listener)

    def discard(self, listener: StoreListener) -> None:
        with self._lock:
            self._listeners[listener.channel].discard(listener)

    def close_all(self) -> None:
        """Close every listener (the store is closing)."""
        with self._lock:
            every = [listener for group in self._listeners.values() for listener in group]
        for listener in every:
            listener.close()

    def committed(self, channels: Iterable[Channel]) -> None:
        """Wake this process's listeners of ``channels`` (a transaction committed)."""
        with self._lock:
            woken = [listener for name in set(channels) for listener in self._listeners[name]]
        for listener in woken:
            listener.wake()
