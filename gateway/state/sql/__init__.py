"""The store, written once in SQL for both backends (see :mod:`capgate.gateway.state.sql.core`)."""

from capgate.gateway.state.sql.core import MAX_DEFINITION_BYTES, SqlTx
from capgate.gateway.state.sql.store import SqlStore

__all__ = ["MAX_DEFINITION_BYTES", "SqlStore", "SqlTx"]
