"""Gateway-owned state: tenants, connections, budgets, evidence, operations,
proposals, reviews and the hash-chained ledger, behind one store protocol with a
SQLite and a PostgreSQL backend.

The gateway, not its caller, is the source of every fact that grants something;
these facts live here and are read at decision time. Open a store with
:func:`open_store`; everything that changes it happens in a
:meth:`Store.transaction`. PostgreSQL needs the ``postgres`` extra (psycopg 3),
imported only when such a store is opened.

Modules: ``store`` (the protocols and their guarantees), ``records`` (what the
store returns), ``open`` (addresses), ``sql`` (the one implementation), ``sqlite``
and ``postgres`` (the backends), ``migrations``, ``ledger`` (the hash chain),
``times`` (the stored time form), ``backend`` (what a backend provides). The store's
errors are part of the one tree in :mod:`capgate.gateway.errors`.
"""

from capgate.gateway.errors import (
    BudgetNotReserved,
    DuplicateOperation,
    DuplicateRecord,
    PinStale,
    StoreBusy,
    StoreError,
    StoreURLError,
    StoreVersionError,
    UnknownConnection,
    UnknownOperation,
    UnknownPin,
    UnknownProposal,
    UnknownReview,
    UnknownTenant,
)
from capgate.gateway.state.ledger import GENESIS_HASH, hash_of, verify_rows
from capgate.gateway.state.open import open_store, parse_store_url
from capgate.gateway.state.store import SCHEMA_VERSION, Store, Tx

__all__ = [
    "GENESIS_HASH",
    "SCHEMA_VERSION",
    "BudgetNotReserved",
    "DuplicateOperation",
    "DuplicateRecord",
    "PinStale",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreURLError",
    "StoreVersionError",
    "Tx",
    "UnknownConnection",
    "UnknownOperation",
    "UnknownPin",
    "UnknownProposal",
    "UnknownReview",
    "UnknownTenant",
    "hash_of",
    "open_store",
    "parse_store_url",
    "verify_rows",
]
