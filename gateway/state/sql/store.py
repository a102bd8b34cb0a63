"""A store's transactions: where each one begins and how it ends.

:class:`SqlStore` implements :class:`~capgate.gateway.state.store.Store` over any
:class:`~capgate.gateway.state.backend.Backend`. What a transaction does is
:class:`~capgate.gateway.state.sql.tx.SqlTx`'s business; this module owns only its
life, because that is where a step is kept whole or not at all: the schema is
migrated (or refused) when the store opens; each new connection checks that no newer
capgate has upgraded the store since; a pooled connection the server dropped is
replaced before anything is done on it; transactions do not nest in a thread; and
one in which a statement failed is rolled back even if the caller caught the error.
A committed transaction's notices wake this store's listeners (:meth:`SqlStore.listen`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from capgate.gateway.errors import InvalidInput, StoreError, StoreVersionError, quote
from capgate.gateway.state.backend import Backend, Session
from capgate.gateway.state.migrations import (
    MIGRATIONS,
    Migration,
    check_steps,
    migrate,
    read_version,
)
from capgate.gateway.state.records import LedgerRow, VerifyReport
from capgate.gateway.state.sql.core import _amount
from capgate.gateway.state.sql.listen import Notices, StoreListener
from capgate.gateway.state.sql.tx import SqlTx
from capgate.gateway.state.store import CHANNELS, Channel
from capgate.gateway.state.times import Clock, read_clock, system_clock, to_text
from capgate.gateway.tracing import start_span

__all__ = ["SqlStore"]

_log = logging.getLogger("capgate.state")


class _Transaction:
    """The context manager :meth:`SqlStore.transaction` returns."""

    def __init__(self, store: SqlStore, *, read_only: bool) -> None:
        self._store = store
        self._read_only = read_only
        self._session: Session | None = None
        self._tx: SqlTx | None = None
        self._span: Any = None  # capgate.gateway.tracing's, ended with the transaction

    def __enter__(self) -> SqlTx:
        store = self._store
        if getattr(store._active, "open", False):
            raise StoreError(
                f"a transaction on store {store.location} is already open in this thread; "
                "transactions do not nest: finish it first"
            )
        store._active.open = True
        try:
            session = self._begin()
            try:
                now = read_clock(store._clock)  # after BEGIN: a waiting writer reads it late
            except BaseException:
                session.finish(commit=False)
                store._release(session)
                raise
        except BaseException:
            store._active.open = False
            raise
        self._session = session
        self._tx = SqlTx(session, store._dialect, now, read_only=self._read_only)
        self._span = start_span("capgate.store.transaction", read_only=self._read_only)
        return self._tx

    def _begin(self) -> Session:
        """A session with a transaction begun on it.

        A pooled connection the server has since closed (restart, idle timeout,
        failover) fails at BEGIN, before anything was done: it is dropped and the
        transaction begins once more on a new connection. Any other failure raises.
        """
        store = self._store
        while True:
            session, fresh = store._acquire()
            try:
                session.begin(read_only=self._read_only)
            except BaseException:
                store._release(session)
                if fresh or session.usable:
                    raise
                _log.info("store %s: dropped a connection the server had closed", store.location)
                continue
            return session

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session, tx = self._session, self._tx
        assert session is not None
        assert tx is not None
        tx._open = False
        try:
            if exc_type is None and tx._failed is None:
                session.finish(commit=True)
                if tx._notices:
                    self._store._notices.committed(tx._notices)
            else:
                session.finish(commit=False)
                if exc_type is None:
                    raise StoreError(
                        "the transaction was rolled back: one of its statements failed "
                        f"({tx._failed}); no part of it was kept"
                    ) from tx._failed
        finally:
            self._store._active.open = False
            self._store._release(session)
            if self._span is not None:
                self._span.end()


class SqlStore:
    """A gateway's state in a SQL database (see :class:`~capgate.gateway.state.store.Store`).

    Opening migrates the schema (:mod:`capgate.gateway.state.migrations`) or refuses a newer
    one. One store object serves every thread of a process; each thread gets its
    own connection for the length of a transaction. Close it when done (or use it
    as a context manager); transactions still open then end with an error.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        clock: Clock | None = None,
        migrations: Sequence[Migration] = MIGRATIONS,
    ) -> None:
        self._backend = backend
        self._dialect = backend.dialect
        #: ``sqlite`` or ``postgresql``.
        self.backend = backend.dialect.name
        #: Where it is, without any password.
        self.location = backend.location
        self._clock: Clock = clock or system_clock
        self._supported = check_steps(migrations)
        self._active = threading.local()
        self._closed = False
        self._notices = Notices()
        try:
            session, _fresh = backend.acquire()
            try:
                migrate(
                    session,
                    location=self.location,
                    now=to_text(read_clock(self._clock)),
                    steps=migrations,
                    dialect=self._dialect,
                )
            finally:
                backend.release(session, healthy=session.usable)
        except BaseException:
            backend.close()
            raise

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SqlStore {self.backend} {self.location}>"

    def _acquire(self) -> tuple[Session, bool]:
        """A session from the backend and whether its connection is new (checked)."""
        if self._closed:
            raise StoreError(f"store {self.location} is closed")
        session, fresh = self._backend.acquire()
        if fresh:
            # A newer capgate may have upgraded the store since it was opened here.
            try:
                found, written_by = read_version(session)
            except BaseException:
                self._backend.release(session, healthy=False)
                raise
            if found > self._supported:
                self._backend.release(session, healthy=False)
                raise StoreVersionError(self.location, found, self._supported, written_by)
        return session, fresh

    def _release(self, session: Session) -> None:
        self._backend.release(session, healthy=session.usable)

    def transaction(self, *, read_only: bool = False) -> _Transaction:
        """Begin a transaction; commit on a normal exit, roll back on any exception.

        A writing transaction serialises with every other writer on this store (in
        any process); ``read_only=True`` reads one consistent snapshot without
        waiting for writers, and any write in it is a StoreError.
        """
        return _Transaction(self, read_only=read_only)

    def ledger(
        self,
        *,
        tenant: str | None = None,
        operation_id: str | None = None,
        proposal_id: str | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[LedgerRow]:
        """Ledger rows in sequence order, filtered (all filters must match)."""
        after = _amount(after_seq, "after_seq")
        count = None if limit is None else _amount(limit, "limit")
        with self.transaction(read_only=True) as tx:
            return tx._ledger(
                tenant=tenant,
                operation_id=operation_id,
                proposal_id=proposal_id,
                after_seq=after,
                limit=count,
            )

    def verify_ledger(self) -> VerifyReport:
        """Recompute the whole hash chain in one snapshot; report the first bad row."""
        with self.transaction(read_only=True) as tx:
            return tx._verify()

    def listen(self, channel: Channel) -> StoreListener:
        """Listen on ``channel`` (see :class:`~capgate.gateway.state.store.Listener`):
        this store object's commits wake it at once, and on PostgreSQL every
        process's, through a connection of its own. Close it when done."""
        if channel not in CHANNELS:
            raise InvalidInput(f"no notice channel {quote(channel)}")
        if self._closed:
            raise StoreError(f"store {self.location} is closed")
        return StoreListener(self._notices, channel, self._backend)

    def schema_version(self) -> int:
        """The schema version the store is at."""
        with self.transaction(read_only=True) as tx:
            return tx._schema_version()

    def close(self) -> None:
        """Close every connection; the store cannot be used afterwards."""
        self._closed = True
        self._notices.close_all()
        self._backend.close()
