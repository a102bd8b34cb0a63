"""The store's errors, each with a stable ``code``.

They live here until the store joins :mod:`capgate.gateway.errors`; all of them are
:class:`~capgate.gateway.errors.CapgateError` subclasses, so a caller that catches capgate's
errors catches these too. Malformed values (a negative cost, an identifier that is
not one, a naive datetime) are :class:`~capgate.gateway.errors.InvalidInput`, as everywhere
else in capgate::

    StoreError               store_error               the backend failed, or refused a request
    ├── StoreBusy            store_busy                no lock or connection in time: retry later
    ├── StoreVersionError    store_version_unsupported the store was written by a newer capgate
    ├── StoreURLError        store_url_invalid         not a store address (also a ValueError)
    ├── UnknownTenant        unknown_tenant            no such tenant
    ├── UnknownConnection    unknown_connection        the tenant has no connection of that alias
    ├── UnknownOperation     unknown_operation         the tenant has no operation of that id
    ├── UnknownProposal      unknown_proposal          no proposal of that id
    ├── UnknownReview        unknown_review            no review of that id
    ├── UnknownPin           unknown_pin               no pin of that upstream server and tool
    ├── PinStale             pin_stale                 the server shows another definition now
    ├── DuplicateRecord      duplicate_record          a record of that id exists already
    │   └── DuplicateOperation duplicate_operation     the tenant has a proposal for that operation
    └── BudgetNotReserved    budget_not_reserved       settling more than is reserved

Messages name what is wrong and quote caller-supplied identifiers only through
:func:`capgate.gateway.errors.quote` (cut to about 80 characters). They never carry a
password: a PostgreSQL store is named by :attr:`Store.location`, which has none.
"""

from __future__ import annotations

from typing import ClassVar

from capgate.gateway.errors import CapgateError, quote

__all__ = [
    "BudgetNotReserved",
    "DuplicateOperation",
    "DuplicateRecord",
    "PinStale",
    "StoreBusy",
    "StoreError",
    "StoreURLError",
    "StoreVersionError",
    "UnknownConnection",
    "UnknownOperation",
    "UnknownPin",
    "UnknownProposal",
    "UnknownReview",
    "UnknownTenant",
]


class StoreError(CapgateError):
    """The store failed (backend error, closed store, misuse) or refused a request.

    Backend exceptions (``sqlite3.Error``, ``psycopg.Error``) are translated into
    this family where they happen; the original is chained as ``__cause__``.
    """

    code: ClassVar[str] = "store_error"


class StoreBusy(StoreError):
    """A lock, a database file or a pooled connection was not had in time.

    The transaction was rolled back whole; repeating it later is safe.
    """

    code: ClassVar[str] = "store_busy"


class StoreVersionError(StoreError):
    """The store's schema is newer than this code reads; nothing was changed.

    Reading a schema this code does not know could misread a fact that grants
    something, so the store is refused instead.
    """

    code: ClassVar[str] = "store_version_unsupported"

    def __init__(
        self, location: str, found: int, supported: int, written_by: str | None = None
    ) -> None:
        self.location = location
        self.found = found
        self.supported = supported
        self.written_by = written_by
        who = f" (written by capgate {quote(written_by, 40)})" if written_by else ""
        super().__init__(
            f"store {location} has schema version {found}{who}; this capgate reads schema "
            f"versions up to {supported}: open it with the capgate that wrote it, or a newer one"
        )


class StoreURLError(StoreError, ValueError):
    """Not an address :func:`~capgate.gateway.state.open.open_store` accepts."""

    code: ClassVar[str] = "store_url_invalid"


class UnknownTenant(StoreError):
    """The store has no tenant of that name."""

    code: ClassVar[str] = "unknown_tenant"

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        super().__init__(
            f"unknown tenant {quote(tenant)}: the gateway's store has no such tenant "
            "(capgate tenants add)"
        )


class UnknownConnection(StoreError):
    """The tenant has no connection of that alias."""

    code: ClassVar[str] = "unknown_connection"

    def __init__(self, tenant: str, alias: str) -> None:
        self.tenant = tenant
        self.alias = alias
        super().__init__(f"tenant {quote(tenant)} has no connection {quote(alias)}")


class UnknownOperation(StoreError):
    """The tenant has no operation of that id."""

    code: ClassVar[str] = "unknown_operation"

    def __init__(self, tenant: str, operation_id: str) -> None:
        self.tenant = tenant
        self.operation_id = operation_id
        super().__init__(f"tenant {quote(tenant)} has no operation {quote(operation_id)}")


class UnknownProposal(StoreError):
    """No proposal has that id."""

    code: ClassVar[str] = "unknown_proposal"

    def __init__(self, proposal_id: str) -> None:
        self.proposal_id = proposal_id
        super().__init__(f"unknown proposal {quote(proposal_id)}")


class UnknownReview(StoreError):
    """No review has that id."""

    code: ClassVar[str] = "unknown_review"

    def __init__(self, review_id: str) -> None:
        self.review_id = review_id
        super().__init__(f"unknown review {quote(review_id)}")


class UnknownPin(StoreError):
    """No definition of that tool of that upstream server was ever recorded."""

    code: ClassVar[str] = "unknown_pin"

    def __init__(self, server: str, tool: str) -> None:
        self.server = server
        self.tool = tool
        super().__init__(
            f"no definition of tool {quote(tool)} of upstream server {quote(server)} was "
            "recorded (capgate mcp discover records them)"
        )


class PinStale(StoreError):
    """The definition a person reviewed is no longer the one the server shows.

    Accepting or rejecting must be about the definition that was looked at: when the
    server changed it meanwhile, nothing is recorded and the new one is to be
    reviewed.
    """

    code: ClassVar[str] = "pin_stale"

    def __init__(self, server: str, tool: str, reviewed: str, shown: str | None) -> None:
        self.server = server
        self.tool = tool
        self.reviewed = reviewed
        self.shown = shown
        now = f"shows {shown}" if shown is not None else "no longer lists it"
        super().__init__(
            f"tool {quote(tool)} of upstream server {quote(server)}: the definition reviewed "
            f"was {quote(reviewed)}, the server {now}; review it again (capgate mcp pending)"
        )


class DuplicateRecord(StoreError):
    """A record with that id exists already; the store kept the first one."""

    code: ClassVar[str] = "duplicate_record"

    def __init__(self, what: str, record_id: str, message: str | None = None) -> None:
        self.what = what
        self.record_id = record_id
        super().__init__(message or f"a {what} with id {quote(record_id)} exists already")


class DuplicateOperation(DuplicateRecord):
    """The tenant already has a proposal for that operation id.

    An operation id is the idempotency key its tool receives, so two proposals must
    never share one: approving the second would replay the first's key.
    """

    code: ClassVar[str] = "duplicate_operation"

    def __init__(self, tenant: str, operation_id: str) -> None:
        self.tenant = tenant
        self.operation_id = operation_id
        super().__init__(
            "proposal",
            operation_id,
            f"tenant {quote(tenant)} already has a proposal for operation {quote(operation_id)}",
        )


class BudgetNotReserved(StoreError):
    """Settling a cost that is not reserved (settled twice, or never reserved).

    Letting the reservation go negative would hand out budget nobody reserved, so
    the settlement is refused and nothing changes.
    """

    code: ClassVar[str] = "budget_not_reserved"

    def __init__(self, tenant: str, task_id: str | None, reserved: int, cost: int) -> None:
        self.tenant = tenant
        self.task_id = task_id
        self.reserved = reserved
        self.cost = cost
        whose = f"tenant {quote(tenant)}"
        if task_id is not None:
            whose += f", task {quote(task_id)}"
        super().__init__(f"{whose} has {reserved} reserved, cannot settle a cost of {cost}")
