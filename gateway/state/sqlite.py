"""The embedded default backend: one SQLite file, stdlib :mod:`sqlite3`.

- **WAL mode**, so readers never wait for the writer nor the writer for readers;
  ``synchronous=FULL``, so a committed step (a consumed approval, a ledger row)
  survives a power cut.
- **BEGIN IMMEDIATE** for every writing transaction: it takes SQLite's single
  writer lock at the start, so writers serialise in this process and in every
  other process on the same file, and a transaction that read something can never
  fail to upgrade to a writer later. Waiting for the lock is bounded by
  ``busy_timeout``; past it, :class:`~capgate.gateway.errors.StoreBusy`.
- **Writers of this process queue** on one in-process lock before ``BEGIN
  IMMEDIATE``. SQLite's own busy handler polls, sleeping 1, 2, 5 ... 100 ms
  between tries, so two threads of one gateway contending for the writer lock
  would lose milliseconds a call; the lock hands over as soon as the holder ends.
  Its wait counts against the same ``busy_timeout``, and other processes still
  meet SQLite's lock.
- **Foreign keys on** (SQLite's default is off) on every connection.
- **One connection per thread**: a :mod:`sqlite3` connection must not be used by
  two threads at once. Connections of threads that have ended are closed the
  next time a thread connects, and all of them on :meth:`SqliteBackend.close`.
- **Private file**: a new file is created ``0600`` before SQLite opens it (SQLite
  gives its ``-wal`` and ``-shm`` files the same mode), in a folder created
  ``0700`` when the folder is new.

An in-memory database is refused: each connection would get its own empty one.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from capgate.gateway.errors import StoreBusy, StoreError, cut
from capgate.gateway.state.backend import Dialect, LockName, Session

__all__ = ["DEFAULT_BUSY_TIMEOUT", "SQLITE", "SqliteBackend"]

#: Seconds a writer waits for another writer's transaction before StoreBusy.
DEFAULT_BUSY_TIMEOUT: Final = 30.0

SQLITE: Final = Dialect(
    name="sqlite",
    int_type="INTEGER",
    time_type="TEXT",
    identity_pk="INTEGER PRIMARY KEY AUTOINCREMENT",
    for_update="",  # a writing transaction holds the database's writer lock already
    for_update_skip_locked="",  # and no other writer can hold a row meanwhile
    notify="",  # no notices between processes: listeners elsewhere poll
)

# SQLite result codes (the low byte of an extended code).
_BUSY: Final = 5
_LOCKED: Final = 6
_READONLY: Final = 8


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


class _SqliteSession:
    """One connection, used only by the thread that made it."""

    def __init__(self, connection: sqlite3.Connection, backend: SqliteBackend) -> None:
        self.connection = connection
        self._backend = backend
        self._read_only = False
        self._writing = False
        self._closed = False

    @property
    def usable(self) -> bool:
        return not self._closed

    def _error(self, exc: sqlite3.Error) -> StoreError:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        where = self._backend.location
        if code in (_BUSY, _LOCKED):
            return StoreBusy(
                f"SQLite store {where} was locked by another writer (waited up to "
                f"{self._backend.busy_timeout:g} s); nothing of this transaction was kept"
            )
        if code == _READONLY and self._read_only:
            return StoreError(f"SQLite store {where}: a write in a read-only transaction")
        return StoreError(f"SQLite store {where}: {cut(str(exc), 200)}")

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> int:
        try:
            return self.connection.execute(sql, params or {}).rowcount
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        try:
            rows: list[dict[str, Any]] = self.connection.execute(sql, params or {}).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        return rows

    def begin(self, *, read_only: bool) -> None:
        if read_only:
            # A deferred BEGIN reads a snapshot without taking the writer lock;
            # query_only makes any write in it fail instead of upgrading.
            self.execute("PRAGMA query_only = ON")
            self._read_only = True
            try:
                self.execute("BEGIN DEFERRED")
            except StoreError:
                self._end_read_only()
                raise
        else:
            waited = self._backend.take_writer_gate()
            self._writing = True
            try:
                self._begin_immediate(waited)
            except BaseException:
                self._end_writing()
                raise

    def _begin_immediate(self, waited: float) -> None:
        """BEGIN IMMEDIATE, with SQLite's busy wait shortened by the gate's wait."""
        if waited <= 0:
            self.execute("BEGIN IMMEDIATE")
            return
        self.busy_wait(max(self._backend.busy_timeout - waited, 0.0))
        try:
            self.execute("BEGIN IMMEDIATE")
        except StoreError:
            with contextlib.suppress(StoreError):  # the BEGIN's error is the one to tell
                self.busy_wait(self._backend.busy_timeout)
            raise
        self.busy_wait(self._backend.busy_timeout)

    def busy_wait(self, seconds: float) -> None:
        """How long SQLite waits for another process's writer. A failure leaves the
        connection's state unknown: it is closed, never handed out again."""
        try:
            self.execute(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
        except StoreError:
            self.close()
            raise

    def finish(self, *, commit: bool) -> None:
        try:
            if commit:
                try:
                    self.execute("COMMIT")
                except StoreError:
                    self._rollback()
                    raise
            else:
                self._rollback()
        finally:
            self._end_read_only()
            self._end_writing()

    def _end_writing(self) -> None:
        # Only the owning thread ends its transaction (finish runs on every path out
        # of one, a failed rollback included), so only it gives the gate back.
        if self._writing:
            self._writing = False
            self._backend.give_writer_gate()

    def _rollback(self) -> None:
        try:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
        except sqlite3.Error:
            self.close()  # its state is unknown: never hand it out again

    def _end_read_only(self) -> None:
        if self._read_only:
            self._read_only = False
            try:
                self.connection.execute("PRAGMA query_only = OFF")
            except sqlite3.Error:
                self.close()

    def lock(self, name: LockName) -> None:
        """Nothing to take: BEGIN IMMEDIATE already holds the one writer lock."""

    def table_exists(self, table: str) -> bool:
        return bool(
            self.query(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name",
                {"name": table},
            )
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(sqlite3.Error):
                self.connection.close()


class SqliteBackend:
    """Sessions on one SQLite file, one connection per thread."""

    dialect = SQLITE

    def __init__(self, path: Path | str, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> None:
        self.path = Path(path).expanduser().absolute()
        #: The file's absolute path.
        self.location = str(self.path)
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._writer_gate = threading.Lock()
        self._sessions: list[tuple[weakref.ref[threading.Thread], _SqliteSession]] = []
        self._closed = False
        _prepare_file(self.path)

    def acquire(self) -> tuple[Session, bool]:
        if self._closed:
            raise StoreError(f"store {self.location} is closed")
        session: _SqliteSession | None = getattr(self._local, "session", None)
        if session is not None and session.usable:
            return session, False
        session = self._connect()
        with self._lock:
            if self._closed:
                session.close()
                raise StoreError(f"store {self.location} is closed")
            self._close_orphans()
            self._sessions.append((weakref.ref(threading.current_thread()), session))
        self._local.session = session
        return session, True

    def take_writer_gate(self) -> float:
        """Wait for this process's other writers; return the seconds waited.

        Raises StoreBusy past ``busy_timeout``, as SQLite's own wait would.
        """
        if self._writer_gate.acquire(blocking=False):
            return 0.0
        started = time.monotonic()
        if not self._writer_gate.acquire(timeout=self.busy_timeout):
            raise StoreBusy(
                f"SQLite store {self.location} was locked by another writer of this "
                f"process (waited {self.busy_timeout:g} s); nothing of this transaction "
                "was kept"
            )
        return time.monotonic() - started

    def give_writer_gate(self) -> None:
        self._writer_gate.release()

    def release(self, session: Session, *, healthy: bool) -> None:
        if not healthy and isinstance(session, _SqliteSession):
            session.close()
            if getattr(self._local, "session", None) is session:
                self._local.session = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
        for _thread, session in sessions:
            session.close()

    def listener(self, channel: str, wake: Callable[[], None]) -> None:
        """None: SQLite carries no notices between processes (listeners poll)."""
        del channel, wake

    def _close_orphans(self) -> None:
        """Close the connections of threads that have ended (caller holds the lock)."""
        alive = []
        for ref, session in self._sessions:
            thread = ref()
            if thread is not None and thread.is_alive() and session.usable:
                alive.append((ref, session))
            else:
                session.close()
        self._sessions = alive

    def _connect(self) -> _SqliteSession:
        try:
            connection = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # autocommit: the store issues BEGIN and COMMIT
                check_same_thread=False,  # closed from another thread by close() only
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self.location}: {exc}") from exc
        connection.row_factory = _dict_row
        session = _SqliteSession(connection, self)
        try:
            mode = session.query("PRAGMA journal_mode = WAL")
            if not mode or str(next(iter(mode[0].values()))).lower() != "wal":
                raise StoreError(
                    f"SQLite store {self.location} cannot use WAL mode (is it on a network "
                    "file system?); its concurrency guarantees need it"
                )
            session.execute("PRAGMA synchronous = FULL")
            session.execute("PRAGMA foreign_keys = ON")
            session.busy_wait(self.busy_timeout)
        except BaseException:
            session.close()
            raise
        return session


def _prepare_file(path: Path) -> None:
    """Create the folder (0700, when new) and the file (0600, when new)."""
    if path.is_dir():
        raise StoreError(f"SQLite store {path} is a folder, not a database file")
    folder = path.parent
    try:
        try:
            folder.mkdir(parents=True, mode=0o700)
        except FileExistsError:
            pass
        else:
            folder.chmod(0o700)  # mkdir's mode is reduced by the umask; make it exact
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, flags, 0o600))
    except OSError as exc:
        raise StoreError(
            f"cannot create SQLite store {path}: {exc.strerror or type(exc).__name__}"
        ) from None
