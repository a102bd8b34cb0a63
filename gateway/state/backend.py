"""What the shared SQL store needs from a database: a dialect and sessions.

The store's logic is written once (:mod:`capgate.gateway.state.sql`); a backend supplies
only what differs between SQLite and PostgreSQL:

- a :class:`Dialect`: the few words of DDL that differ (integer, time and
  identity column types), the row-lock suffixes of a ``SELECT`` and the statement
  that sends a notice at commit (PostgreSQL's ``NOTIFY``; SQLite has none);
- :class:`Session` objects, one database connection each, used by one thread at a
  time: statements with ``:name`` placeholders, transaction begin and end, the
  transaction-scoped locks that serialise ledger appends and migrations, and the
  translation of driver exceptions into :class:`~capgate.gateway.errors.StoreError`;
- a :class:`Backend` handing sessions out (per thread for SQLite, from a bounded
  pool for PostgreSQL) and taking them back, and listening for notices from other
  processes where the database carries them (:meth:`Backend.listener`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["Backend", "BackendListener", "Dialect", "LockName", "Session", "wire_channel"]

#: The transaction-scoped locks a session can take.
LockName = Literal["ledger", "migrations"]


def wire_channel(channel: str) -> str:
    """The database's name of a notice channel (PostgreSQL's ``LISTEN`` name)."""
    return f"capgate_{channel}"


@dataclass(frozen=True)
class Dialect:
    """The SQL text that differs between backends."""

    #: ``sqlite`` or ``postgresql``.
    name: str
    #: A 64-bit integer column.
    int_type: str
    #: A time column (fixed-width ISO-8601 text that must compare byte-wise).
    time_type: str
    #: An auto-numbered primary key column, for insertion order.
    identity_pk: str
    #: Appended to a ``SELECT`` to lock its rows until the transaction ends.
    for_update: str
    #: The same, passing over rows another transaction holds locked (so concurrent
    #: claims of queued work each take other rows instead of waiting in line).
    for_update_skip_locked: str
    #: A statement that sends a notice on channel ``:channel`` when the transaction
    #: commits; empty where the database has no such thing.
    notify: str


class Session(Protocol):
    """One database connection; used by one thread at a time.

    Every method raises :class:`~capgate.gateway.errors.StoreError` (or a subclass)
    for a database failure, never the driver's own exception.
    """

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> int:
        """Run one statement with ``:name`` placeholders; return the rows it changed."""

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run one query; its rows as dicts keyed by column name."""

    def begin(self, *, read_only: bool) -> None:
        """Begin a transaction: a writing one takes what serialises writers."""

    def finish(self, *, commit: bool) -> None:
        """Commit, or roll back. A failed commit is rolled back and raised; a rollback
        never raises (a failure there makes the session unusable instead), so it can
        run while another exception propagates without hiding it."""

    def lock(self, name: LockName) -> None:
        """Take a lock held until the transaction ends (serialises its holders)."""

    def table_exists(self, table: str) -> bool: ...

    @property
    def usable(self) -> bool:
        """False once the connection is closed or broken (do not hand it out again)."""


class BackendListener(Protocol):
    """Notices from other processes on one channel, while :attr:`listening`."""

    @property
    def listening(self) -> bool: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """Hands out sessions on one database."""

    dialect: Dialect
    #: Where the database is, without any password.
    location: str

    def acquire(self) -> tuple[Session, bool]:
        """A session for this thread, and whether it is a new connection."""

    def release(self, session: Session, *, healthy: bool) -> None:
        """Give a session back; an unhealthy one is closed, not reused."""

    def close(self) -> None:
        """Close every connection; later ``acquire`` calls raise StoreError."""

    def listener(self, channel: str, wake: Callable[[], None]) -> BackendListener | None:
        """Call ``wake`` for every notice on ``channel`` from any process (and whenever
        notices may have been missed, e.g. after reconnecting), until closed; None
        where the database carries no notices between processes."""
