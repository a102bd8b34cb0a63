"""What every statement of a store transaction goes through, whatever it is about.

The aggregates (tenants and budgets, connections, evidence, operations, proposals
and reviews, pins, the ledger) each write their SQL over :class:`TxCore`, so the
promises that do not depend on what a statement does are kept once, here: a
transaction is used only by the thread that began it and only while it is open; the
first statement that fails marks it, so it is rolled back when it ends even if the
caller caught the error; a row is locked with the backend's own words; and one
clock reading serves the whole transaction. The helpers turn a caller's values into
validated records (``InvalidInput`` naming the field) and stored rows back into
records (a row that does not validate is a damaged store, ``StoreError``), the same
way for every aggregate.

The helpers keep their leading underscore: they are this package's own, imported by
its modules and by nothing outside it.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from capgate.gateway.digest import canonical_json
from capgate.gateway.errors import InvalidInput, StoreError, UnknownTenant, quote
from capgate.gateway.model.facts import checked_identifier
from capgate.gateway.state.backend import Dialect, LockName, Session, wire_channel
from capgate.gateway.state.migrations import read_version
from capgate.gateway.state.records import MAX_AMOUNT, OperationRecord
from capgate.gateway.state.store import CHANNELS, Channel
from capgate.gateway.state.times import from_text, to_text

__all__ = ["TxCore"]

_M = TypeVar("_M", bound=BaseModel)
#: The name check every aggregate applies to a bare tenant, task or id argument.
_identifier = checked_identifier

_TENANT_COLUMNS: Final = "tenant, budget_class, budget_limit, reserved, spent"


# -- values in and out ------------------------------------------------------------------


def _validated(model: type[_M], data: Mapping[str, Any], where: str) -> _M:
    """A record built from a caller's values; InvalidInput naming the bad fields."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidInput.from_validation(exc, where) from None


def _stored(model: type[_M], data: Mapping[str, Any], what: str) -> _M:
    """A record built from a row; a row that does not validate is a damaged store."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
        raise StoreError(
            f"a stored {what} does not validate (field(s) {', '.join(fields) or '?'}): "
            "the database was changed outside capgate or is damaged"
        ) from None


def _amount(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_AMOUNT:
        raise InvalidInput(f"{what}: must be a whole number from 0 to 2**62, not {quote(value)}")
    return int(value)


def _dump(value: Any) -> str:
    """Canonical JSON text (InvalidInput for anything that is not plain JSON)."""
    return canonical_json(value).decode("utf-8")


def _load(text: object, what: str) -> Any:
    if not isinstance(text, str):
        raise StoreError(f"a stored {what} is not JSON text")
    try:
        return json.loads(text)
    except ValueError:
        raise StoreError(f"a stored {what} is not JSON") from None


def _time(text: object) -> datetime | None:
    return None if text is None else from_text(str(text))


# -- the transaction ----------------------------------------------------------------------


class TxCore:
    """What each aggregate's methods build on: the session, the clock reading, the
    statements that mark a failed transaction, and the operations it holds."""

    def __init__(self, session: Session, dialect: Dialect, now: datetime, *, read_only: bool):
        #: The store clock's reading for this transaction (timezone-aware UTC).
        self.now = now
        self.read_only = read_only
        self._at = to_text(now)
        self._session = session
        self._dialect = dialect
        self._thread = threading.get_ident()
        self._open = True
        self._failed: StoreError | None = None
        # Operations this transaction holds (read for update, inserted or updated by
        # it): no other transaction can change their rows before it ends, so an
        # update starts from the record held here instead of reading the row again.
        self._held: dict[tuple[str, str], OperationRecord] = {}
        #: The channels to wake once this transaction commits.
        self._notices: set[Channel] = set()

    # -- statements (every one goes through here) --------------------------------------

    def _check(self) -> None:
        if not self._open:
            raise StoreError("this transaction has ended; begin a new one")
        if threading.get_ident() != self._thread:
            raise StoreError("a transaction can be used only by the thread that began it")

    def _run(self, sql: str, params: Mapping[str, Any] | None = None) -> int:
        self._check()
        try:
            return self._session.execute(sql, params)
        except StoreError as exc:
            self._failed = self._failed or exc
            raise

    def _rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        self._check()
        try:
            return self._session.query(sql, params)
        except StoreError as exc:
            self._failed = self._failed or exc
            raise

    def _row(self, sql: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        rows = self._rows(sql, params)
        return rows[0] if rows else None

    def _lock(self, name: LockName) -> None:
        self._check()
        try:
            self._session.lock(name)
        except StoreError as exc:
            self._failed = self._failed or exc
            raise

    def _locked(self, lock: bool) -> str:
        return self._dialect.for_update if lock else ""

    def _tenant_row(self, tenant: str, *, lock: bool = False) -> dict[str, Any]:
        """The tenant's row (locked when asked), ``UnknownTenant`` if there is none:
        budgets, connections, evidence, operations and proposals belong to a tenant,
        and each checks it here."""
        row = self._row(
            f"SELECT {_TENANT_COLUMNS} FROM tenants WHERE tenant = :tenant{self._locked(lock)}",
            {"tenant": tenant},
        )
        if row is None:
            raise UnknownTenant(tenant)
        return row

    def notify(self, channel: Channel) -> None:
        """Wake the channel's listeners once this transaction commits: this store
        object's at once (:mod:`capgate.gateway.state.sql.listen`), every process's
        on PostgreSQL (``pg_notify``, sent by the commit). Once per channel."""
        if channel not in CHANNELS:
            raise InvalidInput(f"no notice channel {quote(channel)}")
        if self.read_only:
            raise StoreError("a notice in a read-only transaction")
        if channel not in self._notices and self._dialect.notify:
            self._run(self._dialect.notify, {"channel": wire_channel(channel)})
        self._notices.add(channel)

    def _schema_version(self) -> int:
        self._check()
        return read_version(self._session)[0]
