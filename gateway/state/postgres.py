"""The server backend: PostgreSQL through psycopg 3, imported only when used.

- **READ COMMITTED** for writing transactions, with the explicit row locks and
  conditional statements of :mod:`capgate.gateway.state.sql`: each guarantee rests on a
  lock the database takes, not on the isolation level, so no transaction ever
  fails with a serialisation error and has to be retried.
- **Advisory locks** (``pg_advisory_xact_lock``), held until the transaction ends,
  serialise ledger appends (one hash chain) and schema migrations across every
  process on the database.
- **REPEATABLE READ, READ ONLY** for read-only transactions: one snapshot for
  everything read (a whole ledger verification), without blocking writers.
- **A bounded pool of connections**, not one per thread: server connections are
  a scarce resource (``max_connections`` is 100 by default, shared by every
  process), while a host application may run hundreds of threads. A transaction
  borrows one connection for its length; a thread that finds every connection
  busy waits up to ``busy_timeout`` (then :class:`~capgate.gateway.errors.StoreBusy`).
  Connections that broke are dropped, not reused. The pool is a few lines here
  rather than the ``psycopg_pool`` package: it needs no background thread and no
  further dependency, and this store asks nothing more of it.
- ``lock_timeout`` bounds every wait for a row or advisory lock the same way.
- **Notices** (``LISTEN``/``NOTIFY``): a transaction's notices go out with
  ``pg_notify`` when it commits, and a listener holds one connection of its own,
  outside the pool, in a thread that wakes its waiter for each notice and connects
  again when that connection fails (:class:`_PgListener`).

Messages name the database by :attr:`PostgresBackend.location`, which never holds
a password; the driver's own messages are cut to their first line.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final

from capgate.gateway.errors import StoreBusy, StoreError, cut
from capgate.gateway.state.backend import Dialect, LockName, Session, wire_channel

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import DictRow

__all__ = ["DEFAULT_POOL_SIZE", "POSTGRESQL", "PostgresBackend", "import_psycopg"]

_log = logging.getLogger("capgate.state")

#: Connections one store keeps open at most.
DEFAULT_POOL_SIZE: Final = 10
#: Seconds to wait for a lock or a pooled connection before StoreBusy.
DEFAULT_BUSY_TIMEOUT: Final = 30.0
#: Seconds to wait for the server when connecting (unless the URL says otherwise).
CONNECT_TIMEOUT: Final = 10

POSTGRESQL: Final = Dialect(
    name="postgresql",
    int_type="BIGINT",
    # Fixed-width ISO-8601 text compares correctly byte by byte; a linguistic
    # collation (en_US...) might not, so time columns use "C".
    time_type='TEXT COLLATE "C"',
    identity_pk="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    for_update=" FOR UPDATE",
    for_update_skip_locked=" FOR UPDATE SKIP LOCKED",
    notify="SELECT pg_notify(:channel, '')",
)

#: Advisory lock keys: "capgate" in ASCII, then 1 for the ledger, 2 for migrations.
_LOCK_KEYS: Final[dict[str, int]] = {
    "ledger": 0x63617067617465 << 8 | 1,
    "migrations": 0x63617067617465 << 8 | 2,
}
_PLACEHOLDER: Final = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
# SQLSTATEs after which waiting and trying again is the answer.
_BUSY_STATES: Final = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
}
_READ_ONLY_STATE: Final = "25006"


def import_psycopg() -> Any:
    """The psycopg module, or a StoreError saying how to install it."""
    try:
        import psycopg
        import psycopg.conninfo
        import psycopg.rows
    except ImportError:
        raise StoreError(
            "PostgreSQL stores need psycopg 3: pip install 'capgate[postgres]' "
            "(or 'psycopg[binary]>=3.2')"
        ) from None
    return psycopg


@lru_cache(maxsize=512)
def _to_pyformat(sql: str) -> str:
    """``:name`` placeholders as psycopg's ``%(name)s`` (and ``%`` escaped)."""
    return _PLACEHOLDER.sub(r"%(\1)s", sql.replace("%", "%%"))


class _PgSession:
    """One server connection, lent to one thread at a time by the pool."""

    def __init__(self, connection: psycopg.Connection[DictRow], backend: PostgresBackend):
        self.connection = connection
        self._backend = backend
        self._pq = backend.psycopg.pq

    @property
    def usable(self) -> bool:
        conn = self.connection
        return (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == self._pq.TransactionStatus.IDLE
        )

    def _error(self, exc: Exception) -> StoreError:
        where = self._backend.location
        state = getattr(exc, "sqlstate", None)
        first = cut(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        if state in _BUSY_STATES:
            return StoreBusy(
                f"PostgreSQL store {where}: waited more than {self._backend.busy_timeout:g} s "
                f"for a lock, or was chosen to give way ({first}); nothing of this "
                "transaction was kept"
            )
        if state == _READ_ONLY_STATE:
            return StoreError(f"PostgreSQL store {where}: a write in a read-only transaction")
        if isinstance(exc, self._backend.psycopg.OperationalError) and state is None:
            return StoreError(f"PostgreSQL store {where} failed or is unreachable: {first}")
        return StoreError(f"PostgreSQL store {where}: {first}" + (f" [{state}]" if state else ""))

    def _cursor_run(self, sql: str, params: Mapping[str, Any] | None) -> Any:
        cursor = self.connection.cursor()
        try:
            if params is None:
                cursor.execute(sql.encode("utf-8"))
            else:
                cursor.execute(_to_pyformat(sql).encode("utf-8"), dict(params))
        except self._backend.psycopg.Error as exc:
            cursor.close()
            raise self._error(exc) from exc
        return cursor

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> int:
        with self._cursor_run(sql, params) as cursor:
            rowcount: int = cursor.rowcount
            return rowcount

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._cursor_run(sql, params) as cursor:
            try:
                rows: list[dict[str, Any]] = cursor.fetchall()
            except self._backend.psycopg.Error as exc:
                raise self._error(exc) from exc
            return rows

    def begin(self, *, read_only: bool) -> None:
        self.execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            if read_only
            else "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE"
        )

    def finish(self, *, commit: bool) -> None:
        if commit:
            try:
                with self._cursor_run("COMMIT", None) as cursor:
                    status = cursor.statusmessage
            except StoreError:
                self._rollback()
                raise
            if status != "COMMIT":
                # The server answers ROLLBACK to a COMMIT of a transaction that failed
                # earlier; a caller must never take that for a commit.
                raise StoreError(
                    f"PostgreSQL store {self._backend.location}: the transaction had failed "
                    "and was rolled back, not committed"
                )
        else:
            self._rollback()

    def _rollback(self) -> None:
        try:
            if not self.connection.closed:
                self.connection.execute(b"ROLLBACK")
        except self._backend.psycopg.Error:
            self.close()  # its state is unknown: never hand it out again

    def lock(self, name: LockName) -> None:
        self.execute("SELECT pg_advisory_xact_lock(:key)", {"key": _LOCK_KEYS[name]})

    def table_exists(self, table: str) -> bool:
        rows = self.query("SELECT to_regclass(:name) IS NOT NULL AS present", {"name": table})
        return bool(rows and rows[0]["present"])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()


class PostgresBackend:
    """Sessions on one PostgreSQL database, from a bounded pool."""

    dialect = POSTGRESQL

    def __init__(
        self,
        conninfo: str,
        *,
        location: str,
        pool_size: int = DEFAULT_POOL_SIZE,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.psycopg = import_psycopg()
        self._conninfo = conninfo
        #: Where the database is, without any password.
        self.location = location
        self.pool_size = pool_size
        self.busy_timeout = busy_timeout
        self._cond = threading.Condition()
        self._idle: list[_PgSession] = []
        self._count = 0  # connections open: idle and lent
        self._closed = False

    def acquire(self) -> tuple[Session, bool]:
        deadline = time.monotonic() + self.busy_timeout
        with self._cond:
            while True:
                if self._closed:
                    raise StoreError(f"store {self.location} is closed")
                while self._idle:
                    session = self._idle.pop()
                    if session.usable:
                        return session, False
                    session.close()
                    self._count -= 1
                if self._count < self.pool_size:
                    self._count += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreBusy(
                        f"PostgreSQL store {self.location}: all {self.pool_size} connections "
                        f"stayed in use for {self.busy_timeout:g} s"
                    )
                self._cond.wait(remaining)
        try:
            return self._connect(), True
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def release(self, session: Session, *, healthy: bool) -> None:
        if not isinstance(session, _PgSession):  # pragma: no cover - a programming error
            raise TypeError("not a session of this backend")
        with self._cond:
            if healthy and session.usable and not self._closed:
                self._idle.append(session)
            else:
                session.close()
                self._count -= 1
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for session in idle:
            session.close()

    def listener(self, channel: str, wake: Callable[[], None]) -> _PgListener:
        """``LISTEN`` on ``channel`` on a connection of its own (outside the pool),
        calling ``wake`` for each notice; see :class:`_PgListener`."""
        return _PgListener(self, channel, wake)

    def connection(self) -> psycopg.Connection[DictRow]:
        """A new autocommit connection (StoreError naming the store if it fails)."""
        driver = self.psycopg
        extra: dict[str, Any] = {"autocommit": True, "row_factory": driver.rows.dict_row}
        given = driver.conninfo.conninfo_to_dict(self._conninfo)
        if "connect_timeout" not in given:
            extra["connect_timeout"] = CONNECT_TIMEOUT
        if "application_name" not in given:
            extra["application_name"] = "capgate"
        try:
            connection: psycopg.Connection[DictRow] = driver.connect(self._conninfo, **extra)
        except driver.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreError(
                f"cannot connect to PostgreSQL store {self.location}: {cut(first, 300)}"
            ) from None
        return connection

    def _connect(self) -> _PgSession:
        session = _PgSession(self.connection(), self)
        try:
            # lock_timeout bounds waits for row and advisory locks; SET takes no
            # parameters, and this is an integer this code computed.
            session.execute(f"SET lock_timeout = {int(self.busy_timeout * 1000)}")
        except BaseException:
            session.close()
            raise
        return session


#: Seconds a listener blocks for notices at a time (how soon it sees it is closed).
_LISTEN_SLICE: Final = 0.5
#: The longest wait before a listener whose connection failed connects again.
_RECONNECT_LONGEST: Final = 30.0
_CHANNEL: Final = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


class _PgListener:
    """``LISTEN capgate_<channel>`` in a thread of its own, on its own connection.

    Every notice calls ``wake``; so does every (re)connection, because notices sent
    while nobody listened are lost and the waiter must look for itself. A connection
    that fails is logged (by the store's location, never a password) and made again
    after a wait that doubles up to 30 s; :attr:`listening` is False meanwhile, and
    the waiter polls. Construction returns once the first ``LISTEN`` is in place (or
    the first connection failed).
    """

    def __init__(self, backend: PostgresBackend, channel: str, wake: Callable[[], None]) -> None:
        if not _CHANNEL.match(channel):  # an identifier in SQL text: checked, never quoted
            raise ValueError(f"not a channel name: {channel!r}")
        self._backend = backend
        self._channel = wire_channel(channel)
        self._wake = wake
        self._stop = threading.Event()
        self._first = threading.Event()
        self._listening = False
        self._thread = threading.Thread(
            target=self._run, name=f"capgate-listen-{channel}", daemon=True
        )
        self._thread.start()
        self._first.wait(CONNECT_TIMEOUT + 5)

    @property
    def listening(self) -> bool:
        return self._listening

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        psycopg = self._backend.psycopg
        delay = _LISTEN_SLICE
        while not self._stop.is_set():
            try:
                connection = self._backend.connection()
            except StoreError as exc:
                _log.warning("not listening for %s: %s", self._channel, exc)
                self._first.set()
                self._stop.wait(delay)
                delay = min(delay * 2, _RECONNECT_LONGEST)
                continue
            try:
                connection.execute(f"LISTEN {self._channel}".encode())
                self._listening = True
                self._first.set()
                self._wake()  # what was sent while nobody listened: look now
                delay = _LISTEN_SLICE
                while not self._stop.is_set():
                    for _notice in connection.notifies(timeout=_LISTEN_SLICE):
                        self._wake()
            except psycopg.Error as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                _log.warning(
                    "stopped listening for %s on %s (%s%s); connecting again",
                    self._channel,
                    self._backend.location,
                    type(exc).__name__,
                    f": {cut(first, 200)}" if first else "",
                )
            finally:
                self._listening = False
                self._wake()  # polling from now on, until listening again
                with contextlib.suppress(Exception):
                    connection.close()
            self._stop.wait(delay)
            delay = min(delay * 2, _RECONNECT_LONGEST)
