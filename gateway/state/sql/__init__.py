"""The store, written once in SQL for both backends (see :mod:`capgate.gateway.state.sql.core`)."""

from capgate.gateway.state.sql.pins import MAX_DEFINITION_BYTES
from capgate.gateway.state.sql.store import SqlStore
from capgate.gateway.state.sql.tx import SqlTx

__all__ = ["MAX_DEFINITION_BYTES", "SqlStore", "SqlTx"]
