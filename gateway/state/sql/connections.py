"""A tenant's connections by alias: the account each acts as, and whether it may.

A connection's status is a fact that grants (a revoked one hides its tools), read
here at decision time; the secret it stands for is never stored, only resolved at
dispatch (:mod:`capgate.gateway.service.credentials`).
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import InvalidInput, UnknownConnection, quote
from capgate.gateway.model.facts import ConnectionStatus
from capgate.gateway.state.records import ConnectionRecord
from capgate.gateway.state.sql.core import TxCore, _stored, _time, _validated

__all__ = ["ConnectionsTx"]

_CONNECTION_COLUMNS: Final = "tenant, alias, status, account, updated_at"


def _connection(row: Mapping[str, Any]) -> ConnectionRecord:
    return _stored(ConnectionRecord, {**row, "updated_at": _time(row["updated_at"])}, "connection")


class ConnectionsTx(TxCore):
    """Connections: which accounts a tenant's tools act through."""

    def put_connection(
        self, tenant: str, alias: str, *, status: ConnectionStatus, account: str
    ) -> ConnectionRecord:
        """Create or replace the tenant's connection of that alias."""
        record = _validated(
            ConnectionRecord,
            {
                "tenant": tenant,
                "alias": alias,
                "status": status,
                "account": account,
                "updated_at": self.now,
            },
            "connection",
        )
        self._tenant_row(tenant)
        self._run(
            "INSERT INTO connections (tenant, alias, status, account, updated_at) VALUES "
            "(:tenant, :alias, :status, :account, :now) ON CONFLICT (tenant, alias) DO UPDATE "
            "SET status = excluded.status, account = excluded.account, "
            "updated_at = excluded.updated_at",
            {
                "tenant": tenant,
                "alias": alias,
                "status": record.status.value,
                "account": record.account,
                "now": self._at,
            },
        )
        return record

    def set_connection_status(
        self, tenant: str, alias: str, status: ConnectionStatus
    ) -> ConnectionRecord:
        """``UnknownConnection`` if the tenant has no connection with that alias."""
        try:
            value = ConnectionStatus(status)
        except ValueError:
            raise InvalidInput(f"status: {quote(status)} is not a connection status") from None
        row = self._row(
            f"SELECT {_CONNECTION_COLUMNS} FROM connections WHERE tenant = :tenant AND "
            f"alias = :alias{self._locked(True)}",
            {"tenant": tenant, "alias": alias},
        )
        if row is None:
            raise UnknownConnection(tenant, alias)
        self._run(
            "UPDATE connections SET status = :status, updated_at = :now "
            "WHERE tenant = :tenant AND alias = :alias",
            {"tenant": tenant, "alias": alias, "status": value.value, "now": self._at},
        )
        return _connection({**row, "status": value.value, "updated_at": self._at})

    def connections(self, tenant: str) -> dict[str, ConnectionRecord]:
        """Every connection of the tenant by alias (none for an unknown tenant)."""
        rows = self._rows(
            f"SELECT {_CONNECTION_COLUMNS} FROM connections WHERE tenant = :tenant ORDER BY alias",
            {"tenant": tenant},
        )
        return {row["alias"]: _connection(row) for row in rows}
