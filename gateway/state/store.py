"""The store interface: one protocol, two real backends (SQLite, PostgreSQL).

Everything that changes state happens inside :meth:`Store.transaction`, which
yields a :class:`Tx`: the primitive reads and writes below, applied atomically
(all or nothing) and isolated from concurrent transactions in this and in other
gateway processes sharing the store. The gateway composes them into its steps
(propose, review, dispatch, call) so each step is one transaction: a crash leaves
either all of a step or none of it.

Concurrency guarantees every backend must give (``tests/integration/test_store*.py``
hold both backends to them, with threads and with separate processes):

- :meth:`Tx.insert_operation` inserts at most once per ``(tenant, operation_id)``
  however many callers race, in one process or several;
- :meth:`Tx.reserve_budget` never lets reservations plus spending exceed a limit;
- :meth:`Tx.consume_review` succeeds exactly once per approval;
- :meth:`Tx.append` keeps one hash chain: rows get consecutive sequence numbers
  and each row's ``prev_hash`` is the previous row's ``hash``.

Those who wait for a change (an execution worker waiting for approved proposals)
:meth:`Store.listen` on a :data:`Channel`, and a transaction that makes such a change
calls :meth:`Tx.notify`: the listeners wake once it commits. On PostgreSQL that is
``LISTEN``/``NOTIFY``, so every process on the database wakes; SQLite has no such
thing, so only listeners of the same store object wake at once, and a listener in
another process finds the change at its next poll (:attr:`Listener.listening` says
which it is). A notice is a hint to look, never a fact: whoever wakes reads the
store, and whoever polls misses nothing.

Times come from the store's clock (``Tx.now``, read once per transaction), so one
step records one time, and tests can move the clock.

A transaction in which a statement failed is rolled back whole when it ends, even
if the caller caught the error: no step is ever half kept. Transactions do not
nest, and a Tx belongs to the thread that began it.

Implemented once in SQL (:mod:`capgate.gateway.state.sql`) for SQLite
(:mod:`capgate.gateway.state.sqlite`) and PostgreSQL (:mod:`capgate.gateway.state.postgres`); open
one with :func:`capgate.gateway.state.open.open_store`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from capgate.gateway.model.facts import ConnectionStatus, EvidenceSubject, ResourceRef
from capgate.gateway.state.records import (
    BudgetState,
    ConnectionRecord,
    ContractPin,
    DispatchJob,
    DispatchStatus,
    EvidenceRecord,
    LedgerEntry,
    LedgerRow,
    NoticeAttempt,
    NoticeCursor,
    NoticeDelivery,
    NoticeStatus,
    OperationRecord,
    OperationStatus,
    PinRecord,
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    TaskLinkRecord,
    TenantRecord,
    VerifyReport,
)

__all__ = ["CHANNELS", "SCHEMA_VERSION", "Channel", "Listener", "Store", "Tx"]

#: The schema version this code writes. A store at a lower version is migrated on
#: open; a store at a higher one (written by a newer capgate) is refused.
SCHEMA_VERSION = 10

#: What a listener can wait for: ``dispatch``, a proposal queued for dispatch (or a
#: claim given back); ``proposal_rows``, a ledger row naming a proposal appended (what
#: the notifier turns into webhook notices). A new channel is a name added here;
#: nothing else changes.
Channel = Literal["dispatch", "proposal_rows"]
CHANNELS: tuple[Channel, ...] = ("dispatch", "proposal_rows")


class Listener(Protocol):
    """Waits for notices on one channel (:meth:`Store.listen`). Thread-safe."""

    @property
    def listening(self) -> bool:
        """Whether notices from other processes reach it now (PostgreSQL, while its
        connection is up). When False, those who wait must also poll."""

    def wait(self, timeout: float) -> bool:
        """Block until a notice came since the last wait (or :meth:`wake` was called),
        or ``timeout`` seconds passed; True if one did."""

    def wake(self) -> None:
        """Make the current (or the next) :meth:`wait` return at once."""

    def close(self) -> None:
        """Stop listening (idempotent)."""

    def __enter__(self) -> Listener: ...

    def __exit__(self, *exc_info: object) -> None: ...


class Tx(Protocol):
    """One open transaction. Methods raise ``StoreError`` on backend failures."""

    #: The store clock's reading for this transaction (timezone-aware UTC).
    now: datetime

    # -- tenants and budgets ---------------------------------------------------------

    def put_tenant(
        self, tenant: str, *, budget_class: str, budget_limit: int | None
    ) -> TenantRecord:
        """Create or update a tenant (its reservations and spending are kept)."""

    def get_tenant(self, tenant: str) -> TenantRecord | None: ...

    def tenants(self) -> list[TenantRecord]:
        """Every tenant, by name."""

    def set_budget_limit(self, tenant: str, limit: int | None) -> TenantRecord:
        """Change the tenant's limit; ``UnknownTenant`` if there is no such tenant."""

    def set_task_budget(self, tenant: str, task_id: str, limit: int | None) -> None:
        """Give one task its own limit (``None`` removes it); spending is kept."""

    def budget(self, tenant: str, task_id: str | None = None) -> BudgetState:
        """The tenant's budget, or the task's when the task has its own limit."""

    def reserve_budget(self, tenant: str, task_id: str | None, cost: int) -> bool:
        """Reserve ``cost`` against the tenant's limit and, if the task has one, the
        task's; False (nothing reserved) when either would be exceeded."""

    def settle_budget(self, tenant: str, task_id: str | None, cost: int, *, spent: bool) -> None:
        """End a reservation of ``cost``: count it as spent, or release it.
        ``BudgetNotReserved`` (nothing changed) if less than ``cost`` is reserved."""

    # -- connections ------------------------------------------------------------------

    def put_connection(
        self, tenant: str, alias: str, *, status: ConnectionStatus, account: str
    ) -> ConnectionRecord:
        """Create or replace the connection; ``UnknownTenant`` if there is no such tenant."""

    def set_connection_status(
        self, tenant: str, alias: str, status: ConnectionStatus
    ) -> ConnectionRecord:
        """``UnknownConnection`` if the tenant has no connection with that alias."""

    def connections(self, tenant: str) -> dict[str, ConnectionRecord]:
        """The tenant's connections by alias (empty for an unknown tenant)."""

    # -- evidence ---------------------------------------------------------------------

    def record_evidence(
        self,
        tenant: str,
        task_id: str,
        name: str,
        *,
        source: str,
        subject: EvidenceSubject | None = None,
        expires_at: datetime | None = None,
    ) -> EvidenceRecord:
        """Record it once per name and subject; recording it again keeps (and returns)
        the first record, unless the first expires before the new one would: then the
        new source, time and expiry replace it (evidence shown again is renewed).
        ``UnknownTenant`` if there is no such tenant."""

    def evidence(self, tenant: str, task_id: str) -> set[str]:
        """The names of the evidence recorded for the task, whatever it is about and
        whether or not it has expired."""

    def evidence_records(self, tenant: str, task_id: str) -> list[EvidenceRecord]:
        """Every piece of evidence recorded for the task, by name and subject."""

    # -- contract versions ------------------------------------------------------------

    def pin_contract(self, tool: str, version: int, digest: str) -> tuple[ContractPin, bool]:
        """Pin the tool's version to ``digest`` unless it is pinned already: the pin,
        and whether this call made it (False: the first pin stands, whatever
        ``digest`` is; the caller compares)."""

    def contract_pins(self) -> list[ContractPin]:
        """Every pin, by tool and version."""

    # -- task links -------------------------------------------------------------------

    def link_resource(
        self, tenant: str, task_id: str, resource: ResourceRef, *, by: str
    ) -> tuple[TaskLinkRecord, bool]:
        """Link the resource to the task, once: the link and whether this call made it
        (False: it was linked already, and the first link is returned unchanged).
        ``UnknownTenant`` if there is no such tenant; InvalidInput past
        :data:`~capgate.gateway.state.sql.links.MAX_LINKS` links on one task."""

    def unlink_resource(
        self, tenant: str, task_id: str, resource: ResourceRef
    ) -> TaskLinkRecord | None:
        """Remove the link; the link it removed, or None if there was none.
        ``UnknownTenant`` if there is no such tenant."""

    def task_links(self, tenant: str, task_id: str) -> list[TaskLinkRecord]:
        """The task's links, by resource type and id."""

    # -- operations -------------------------------------------------------------------

    def insert_operation(
        self,
        tenant: str,
        operation_id: str,
        *,
        tool: str,
        params_digest: str,
        cost: int,
        task_id: str | None,
        lease_until: datetime,
        reserved: bool = True,
    ) -> OperationRecord | None:
        """Insert a RUNNING operation (attempts 1, ``task_id`` kept for settling);
        None if the id exists already. ``UnknownTenant`` if there is no such tenant.
        ``reserved`` says whether this attempt holds a budget reservation."""

    def get_operation(
        self, tenant: str, operation_id: str, *, for_update: bool = False
    ) -> OperationRecord | None:
        """``for_update`` locks the row until the transaction ends (PostgreSQL)."""

    def update_operation(
        self,
        tenant: str,
        operation_id: str,
        *,
        status: OperationStatus,
        outcome: dict[str, Any] | None,
        attempts: int,
        lease_until: datetime | None,
        reserved: bool | None = None,
    ) -> OperationRecord:
        """``UnknownOperation`` if the tenant has no such operation; ``reserved`` None
        keeps the reservation flag as it is."""

    def stale_operations(self) -> list[OperationRecord]:
        """RUNNING operations whose lease ended before ``now``."""

    def unsettled_operations(self) -> list[OperationRecord]:
        """Finished operations whose outcome is ``unknown``, least recently touched first."""

    def unsettled_twins(self, tenant: str, tool: str, params_digest: str) -> list[str]:
        """Ids of the tenant's running or ``unknown`` operations of ``tool`` with exactly
        these parameters."""

    # -- proposals and reviews --------------------------------------------------------

    def insert_proposal(self, proposal: ProposalRecord) -> ProposalRecord:
        """``DuplicateOperation`` if the tenant already has a proposal for that id."""

    def get_proposal(
        self, proposal_id: str, *, for_update: bool = False
    ) -> ProposalRecord | None: ...

    def proposal_for_operation(self, tenant: str, operation_id: str) -> ProposalRecord | None:
        """The tenant's proposal of that operation id, if any (there is at most one)."""

    def update_proposal(
        self, proposal_id: str, *, status: ProposalStatus, reason_codes: list[str]
    ) -> ProposalRecord:
        """``UnknownProposal`` if there is no such proposal."""

    def list_proposals(
        self, *, tenant: str | None = None, status: ProposalStatus | None = None
    ) -> list[ProposalRecord]:
        """Proposals in insertion order, filtered by tenant and status when given."""

    def insert_review(self, review: ReviewRecord) -> ReviewRecord:
        """``UnknownProposal`` for a proposal that does not exist, ``DuplicateRecord``
        for a review id that does."""

    def reviews(self, proposal_id: str) -> list[ReviewRecord]:
        """Every review of the proposal, oldest first."""

    def consume_review(self, review_id: str) -> bool:
        """Mark an approval used at ``now``; False if it was used already (or is a
        rejection); ``UnknownReview`` if there is no such review."""

    # -- the dispatch queue -----------------------------------------------------------

    def queue_dispatch(self, proposal_id: str) -> DispatchJob:
        """Queue an approved proposal for the execution workers, due now, and notify
        ``dispatch``; queued already: the existing job, unchanged. ``UnknownProposal``
        if there is no such proposal."""

    def get_dispatch(self, proposal_id: str) -> DispatchJob | None: ...

    def claim_dispatches(self, worker: str, *, limit: int, claim: timedelta) -> list[DispatchJob]:
        """Claim up to ``limit`` queued jobs that are due and not claimed (or whose
        claim is over) for ``worker`` until ``now + claim``, counting a try on each;
        oldest due first. However many workers race, in any process, each job goes
        to one of them (PostgreSQL skips rows another claim holds locked)."""

    def renew_dispatches(
        self, worker: str, proposal_ids: list[str], *, claim: timedelta
    ) -> list[str]:
        """Extend ``worker``'s claims of these jobs to ``now + claim``; the ids it still
        held (a claim taken over by another worker is not renewed)."""

    def settle_dispatch(
        self,
        proposal_id: str,
        worker: str,
        *,
        status: DispatchStatus,
        result: str | None,
        not_before: datetime | None = None,
    ) -> DispatchJob | None:
        """End ``worker``'s claim: the job is done, given up, or queued again for
        ``not_before`` (default now; notifying ``dispatch`` when it is due at once).
        None, changing nothing, if the worker no longer holds the claim."""

    def next_dispatch_due(self) -> datetime | None:
        """When the next queued job becomes claimable (its ``not_before``, or the end
        of the claim holding it), if any is queued."""

    def dispatches(
        self, *, status: DispatchStatus | None = None, tenant: str | None = None
    ) -> list[DispatchJob]:
        """Jobs in the order they were queued, filtered by status and tenant."""

    # -- webhook notices (the ledger is their outbox) ---------------------------------

    def claim_notices(self, tenant: str, notifier: str, *, claim: timedelta) -> NoticeCursor | None:
        """Hold the tenant's notices for ``notifier`` until ``now + claim`` (renewing its
        own hold), or None while another notifier's hold lasts. A tenant without a
        cursor gets one at the ledger's last row: notices start from now, not from
        the ledger's history. However many notifiers race, one holds it."""

    def advance_notices(self, tenant: str, notifier: str, after_seq: int) -> bool:
        """Move the tenant's cursor forward to ``after_seq``, if ``notifier`` still holds
        it (False, changing nothing, if not). Never moves it back."""

    def release_notices(self, tenant: str, notifier: str) -> None:
        """End ``notifier``'s hold (if it has one), so another may take over at once."""

    def record_notice_attempt(
        self,
        delivery: NoticeDelivery,
        *,
        result: str,
        status_code: int | None,
    ) -> NoticeDelivery:
        """Record one attempt of a notice: the delivery row (created at its first
        attempt) takes ``delivery``'s status and one more attempt, and the attempt
        its own row. Returns the delivery as stored."""

    def get_notice(self, event_id: str) -> NoticeDelivery | None: ...

    def notices(
        self, *, tenant: str | None = None, status: NoticeStatus | None = None
    ) -> list[NoticeDelivery]:
        """Deliveries in ledger order, filtered by tenant and status."""

    def notice_attempts(self, event_id: str) -> list[NoticeAttempt]:
        """Every attempt of a notice, first first."""

    # -- notices ----------------------------------------------------------------------

    def notify(self, channel: Channel) -> None:
        """Wake the channel's listeners once this transaction commits (nothing if it
        rolls back). StoreError in a read-only transaction."""

    # -- pins of upstream MCP tool definitions ------------------------------------------

    def observe_pin(self, server: str, tool: str, definition: dict[str, Any] | None) -> PinRecord:
        """Record what the server shows of the tool now (``None``: it no longer lists
        it) and set the pin's status from it: ``accepted`` when it is the accepted
        definition, ``rejected`` when it is the rejected one, else ``changed`` (some
        definition was accepted before) or ``pending`` (never accepted). The digest is
        the store's own (:func:`~capgate.gateway.state.records.definition_digest`)."""

    def get_pin(self, server: str, tool: str, *, for_update: bool = False) -> PinRecord | None: ...

    def pins(self, *, server: str | None = None) -> list[PinRecord]:
        """Every pin (of one server when given), by server and tool."""

    def accept_pin(
        self, server: str, tool: str, *, digest: str, catalogue_tool: str, by: str
    ) -> PinRecord:
        """Accept the definition the server shows, as ``catalogue_tool``, if its digest
        is ``digest`` (the one the person reviewed): ``UnknownPin`` if there is no
        pin, ``PinStale`` if the server shows another definition (or none) now."""

    def reject_pin(self, server: str, tool: str, *, digest: str, by: str) -> PinRecord:
        """Reject the definition the server shows, if its digest is ``digest``; the
        tool stays quarantined while the server shows it (``UnknownPin``,
        ``PinStale`` as for accept)."""

    # -- ledger -----------------------------------------------------------------------

    def append(self, entry: LedgerEntry) -> LedgerRow:
        """Append one row to the hash chain (serialised across processes)."""


class Store(Protocol):
    """A gateway's state, shared by every gateway process that opens the same URL."""

    #: ``sqlite`` or ``postgresql``.
    backend: str
    #: Where it is, without any password (for logs and ``capgate doctor``).
    location: str

    def transaction(self, *, read_only: bool = False) -> AbstractContextManager[Tx]:
        """Begin a transaction; commit on a normal exit, roll back on error.

        A writing transaction serialises with every other writer on the store;
        ``read_only=True`` reads one snapshot without waiting for writers (for
        decision-time reads), and any write in it raises StoreError.
        """

    def ledger(
        self,
        *,
        tenant: str | None = None,
        operation_id: str | None = None,
        proposal_id: str | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[LedgerRow]:
        """Ledger rows in sequence order, filtered."""

    def verify_ledger(self) -> VerifyReport:
        """Recompute the whole hash chain; report the first row that does not fit."""

    def listen(self, channel: Channel) -> Listener:
        """Start listening on ``channel`` (close the listener when done). On
        PostgreSQL it holds a connection of its own, outside the pool, and comes back
        once listening (or once connecting failed: it keeps trying, not listening
        meanwhile)."""

    def schema_version(self) -> int: ...

    def close(self) -> None: ...
