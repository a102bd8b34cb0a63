"""Leases: a live runner keeps its operation, a dead one lets it go.

An operation being run carries a lease in the store. While this process runs it, one
thread renews every held lease a third of the way through, so a duplicate elsewhere
waits for the outcome however long the tool takes; only a runner that died (and
stopped renewing) leaves its operation to be taken over or reconciled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from capgate.gateway.errors import CapgateError
from capgate.gateway.state.records import OperationRecord, OperationStatus
from capgate.gateway.state.store import Store

__all__ = ["Leases"]

log = logging.getLogger("capgate.service")


class Leases:
    """Renews the leases of the operations this gateway is running, from one thread.

    Every lease/3 the thread extends each held operation's lease by a whole lease,
    if that attempt still owns it. One thread per gateway, started on first use and
    gone again once nothing is held, so an idle gateway keeps no thread.
    """

    def __init__(self, store: Store, lease: timedelta) -> None:
        self._store = store
        self._lease = lease
        self._held: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def held(self, operation: OperationRecord) -> Iterator[None]:
        key = (operation.tenant, operation.operation_id)
        with self._lock:
            self._held[key] = operation.attempts
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._renew_forever, name="capgate-leases", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(key, None)

    def _renew_forever(self) -> None:
        interval = max(self._lease.total_seconds() / 3, 0.01)
        while not self._wake.wait(interval):
            with self._lock:
                held = dict(self._held)
                if not held:  # nothing runs: stop; the next held() starts a new thread
                    self._thread = None
                    return
            for (tenant, operation_id), attempts in held.items():
                try:
                    self._renew(tenant, operation_id, attempts)
                except CapgateError as exc:  # the next beat tries again; the run goes on
                    log.warning("could not renew the lease of operation=%s: %s", operation_id, exc)
                except Exception as exc:  # never let the renewing thread die
                    log.warning(
                        "could not renew the lease of operation=%s (%s)",
                        operation_id,
                        type(exc).__name__,
                    )

    def _renew(self, tenant: str, operation_id: str, attempts: int) -> None:
        with self._store.transaction() as tx:
            current = tx.get_operation(tenant, operation_id, for_update=True)
            if (
                current is None
                or current.status is not OperationStatus.RUNNING
                or current.attempts != attempts
            ):
                return  # finished, or taken over: not ours to renew
            tx.update_operation(
                tenant,
                operation_id,
                status=OperationStatus.RUNNING,
                outcome=None,
                attempts=attempts,
                lease_until=tx.now + self._lease,
            )
