"""The store, held to its protocol on both backends: SQLite and a real PostgreSQL.

Every test that takes ``store`` (or ``store_url``) runs once per backend. Covered:
every Tx and Store method, round trips of every record type, rollback, the
injectable clock, schema migrations (a real upgrade, an old "version 0" store, a
store from a newer capgate refused, a failing step leaving nothing behind),
addresses and secrets, file permissions, and ledger tampering by direct SQL.
The races (threads and processes) are in test_store_concurrency.py.
"""

from __future__ import annotations

import itertools
import os
import stat
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from capgate.gateway.errors import CapgateError, InvalidInput
from capgate.gateway.model.facts import ConnectionStatus
from capgate.gateway.state import (
    GENESIS_HASH,
    SCHEMA_VERSION,
    BudgetNotReserved,
    DuplicateOperation,
    DuplicateRecord,
    StoreBusy,
    StoreError,
    StoreURLError,
    StoreVersionError,
    UnknownConnection,
    UnknownOperation,
    UnknownProposal,
    UnknownReview,
    UnknownTenant,
    hash_of,
    open_store,
    parse_store_url,
)
from capgate.gateway.state.ledger import row_hash
from capgate.gateway.state.migrations import MIGRATIONS, Migration
from capgate.gateway.state.open import backend_for
from capgate.gateway.state.records import (
    BudgetState,
    ConnectionRecord,
    EvidenceRecord,
    LedgerEntry,
    OperationRecord,
    OperationStatus,
    ProposalStatus,
    ReviewVerdict,
    TenantRecord,
)
from capgate.gateway.state.sql import SqlStore
from capgate.gateway.state.store import Store
from tests.hang import HANG_SECONDS
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_support import (
    DIGEST,
    OTHER_DIGEST,
    FakeClock,
    proposal,
    raw_query,
    raw_sql,
    raw_tables,
    review,
)

pytestmark = pytest.mark.integration

# The shared fixtures, bound here so pytest finds them (one server per session).
postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

LEASE = timedelta(seconds=30)


def _tenant(store: Store, limit: int | None = 10, tenant: str = "acme") -> None:
    with store.transaction() as tx:
        tx.put_tenant(tenant, budget_class="standard", budget_limit=limit)


def _operation(tx: Any, operation_id: str = "op-1", **overrides: Any) -> OperationRecord | None:
    args: dict[str, Any] = {
        "tool": "email.send",
        "params_digest": DIGEST,
        "cost": 2,
        "task_id": "task-1",
        "lease_until": tx.now + LEASE,
    }
    args.update(overrides)
    record: OperationRecord | None = tx.insert_operation("acme", operation_id, **args)
    return record


# -- opening: addresses, files, secrets -------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///:memory:",
        ":memory:",
        "sqlite:///tmp/x/:memory:",
        "mysql://db/capgate",
        "http://127.0.0.1/db",
        "sqlite://relative.db",
        "sqlite:///x.db?mode=ro",
        "host=/tmp dbname=capgate",
        "",
        "   ",
        "postgresql:dbname",
    ],
)
def test_addresses_of_no_accepted_form_are_refused_naming_the_forms(url: str):
    with pytest.raises(StoreURLError) as caught:
        open_store(url)
    assert isinstance(caught.value, ValueError)
    assert caught.value.code == "store_url_invalid"
    message = str(caught.value)
    assert "sqlite:///absolute/path.db" in message
    assert "postgresql://" in message
    if "memory" in url:
        assert "in-memory SQLite database is not allowed" in message


def test_addresses_name_the_backend_and_a_password_free_location(tmp_path: Path):
    assert parse_store_url("sqlite:///var/lib/capgate/state.db").target == (
        "/var/lib/capgate/state.db"
    )
    assert parse_store_url("sqlite:////var/lib/x.db").target == "/var/lib/x.db"
    bare = parse_store_url("state.db")
    assert bare.kind == "sqlite"
    assert bare.target == str(Path.cwd() / "state.db")
    tcp = parse_store_url(
        "postgresql://gate:s3cret-pw@db.internal:5432/capgate?sslmode=verify-full"
    )
    assert tcp.kind == "postgresql"
    assert tcp.location == "postgresql://gate@db.internal:5432/capgate?sslmode=verify-full"
    socket = parse_store_url("postgresql:///capgate?host=/run/pg&user=gate&password=s3cret-pw")
    assert socket.location == "postgresql:///capgate?host=/run/pg&user=gate"
    assert "s3cret" not in repr(parse_store_url("postgres://u:s3cret@h/db"))
    long_url = "mysql://" + "x" * 10_000
    with pytest.raises(StoreURLError) as caught:
        parse_store_url(long_url)
    assert len(str(caught.value)) < 600


def test_a_bare_path_opens_sqlite_in_a_private_new_folder(tmp_path: Path, clock: FakeClock):
    path = tmp_path / "new" / "deeper" / "state.db"
    store = open_store(str(path), clock=clock)
    try:
        assert store.backend == "sqlite"
        assert store.location == str(path)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        _tenant(store)
        for suffix in ("-wal", "-shm"):  # SQLite copies the database file's mode
            side = path.with_name(path.name + suffix)
            assert stat.S_IMODE(side.stat().st_mode) == 0o600, suffix
        assert raw_query(f"sqlite://{path}", "PRAGMA journal_mode") == [("wal",)]
    finally:
        store.close()


def test_an_existing_folder_keeps_its_mode(tmp_path: Path):
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    open_store(f"sqlite://{folder}/state.db").close()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((folder / "state.db").stat().st_mode) == 0o600


def test_a_folder_is_not_a_database(tmp_path: Path):
    with pytest.raises(StoreError, match="is a folder"):
        open_store(str(tmp_path))


def test_postgresql_location_never_holds_the_password(postgres_server: Any):
    name = postgres_server.create_database()
    try:
        url = postgres_server.url(name, password="hunter2-secret")
        store = open_store(url)
        try:
            assert store.backend == "postgresql"
            assert "hunter2" not in store.location
            assert name in store.location
            assert "hunter2" not in repr(store)
        finally:
            store.close()
    finally:
        postgres_server.drop_database(name)


def test_an_unreachable_postgresql_is_a_store_error_without_the_password(tmp_path: Path):
    url = f"postgresql:///nodb?host={tmp_path}&user=nobody&password=hunter2-secret"
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert "hunter2" not in str(caught.value)
    assert "cannot connect" in str(caught.value)


# -- schema version and migrations --------------------------------------------------------


def test_a_new_store_is_at_the_current_schema_version(store: Store, store_url: str):
    assert store.schema_version() == SCHEMA_VERSION == MIGRATIONS[-1].version
    assert {
        "schema_version",
        "tenants",
        "task_budgets",
        "connections",
        "evidence",
        "operations",
        "proposals",
        "reviews",
        "ledger",
    } <= raw_tables(store_url)


def test_a_store_from_a_newer_capgate_is_refused_untouched(store_url: str):
    open_store(store_url).close()
    raw_sql(store_url, ["UPDATE schema_version SET version = 999, written_by = '9.9.9'"])
    with pytest.raises(StoreVersionError) as caught:
        open_store(store_url)
    error = caught.value
    assert (error.found, error.supported, error.code) == (
        999,
        SCHEMA_VERSION,
        "store_version_unsupported",
    )
    assert "schema version 999" in str(error)
    assert "9.9.9" in str(error)
    assert f"up to {SCHEMA_VERSION}" in str(error)
    assert raw_query(store_url, "SELECT version FROM schema_version") == [(999,)]


def test_a_version_0_store_is_upgraded_and_keeps_what_it_had(store_url: str):
    # An older layout, as a pre-release capgate left it: the version table stamped 0
    # beside a table of the operator's own.
    raw_sql(
        store_url,
        [
            "CREATE TABLE schema_version (id INTEGER PRIMARY KEY CHECK (id = 1), "
            "version INTEGER NOT NULL, written_by TEXT NOT NULL, updated_at TEXT NOT NULL)",
            "INSERT INTO schema_version VALUES (1, 0, '0.0.1', '2020-01-01T00:00:00.000000Z')",
            "CREATE TABLE notes (body TEXT)",
            "INSERT INTO notes VALUES ('kept')",
        ],
    )
    store = open_store(store_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        _tenant(store)
        with store.transaction() as tx:
            assert tx.get_tenant("acme") is not None
    finally:
        store.close()
    assert raw_query(store_url, "SELECT body FROM notes") == [("kept",)]
    assert raw_query(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


def test_a_version_1_store_is_upgraded_to_the_current_schema(store_url: str):
    """The real upgrade path: a store written by the first release (schema 1) with an
    operation running in it opens under this code, migrated, its rows intact."""
    first = SqlStore(backend_for(store_url), migrations=list(MIGRATIONS[:1]))
    assert first.schema_version() == 1
    first.close()
    # Rows as the first release wrote them (its columns only), written as literals.
    raw_sql(
        store_url,
        [
            "INSERT INTO tenants (tenant, budget_class, budget_limit, reserved, spent, "
            "created_at, updated_at) VALUES ('acme', 'standard', 10, 1, 0, "
            "'2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')",
            "INSERT INTO operations (tenant, operation_id, tool, params_digest, task_id, "
            "status, outcome, cost, attempts, lease_until, created_at, updated_at) VALUES "
            "('acme', 'op-1', 't', "
            "'sha256:0000000000000000000000000000000000000000000000000000000000000000', "
            "NULL, 'running', NULL, 1, 1, '2026-01-01T00:00:00.000000Z', "
            "'2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z')",
        ],
    )
    store = open_store(store_url)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        with store.transaction() as tx:
            operation = tx.get_operation("acme", "op-1")
            assert operation is not None
            assert operation.reserved is True  # what schema 1 meant: every attempt reserves
            assert tx.proposal_for_operation("acme", "op-1") is None
    finally:
        store.close()


def _step_2(*statements: str) -> list[Migration]:
    step = SCHEMA_VERSION + 1
    return [*MIGRATIONS, Migration(step, "test step", lambda _dialect: list(statements))]


def test_an_older_store_is_migrated_on_open_keeping_its_rows(store_url: str):
    store = open_store(store_url)
    _tenant(store)
    store.close()
    upgraded = SqlStore(
        backend_for(store_url),
        migrations=_step_2(
            "CREATE TABLE extra (id INTEGER PRIMARY KEY)",
            "ALTER TABLE tenants ADD COLUMN note TEXT",
        ),
    )
    try:
        assert upgraded.schema_version() == SCHEMA_VERSION + 1
        with upgraded.transaction() as tx:
            assert tx.get_tenant("acme") == TenantRecord(
                tenant="acme", budget_class="standard", budget_limit=10
            )
    finally:
        upgraded.close()
    assert "extra" in raw_tables(store_url)
    # This code reads up to SCHEMA_VERSION: the upgraded store is refused from now on.
    with pytest.raises(StoreVersionError, match=f"schema version {SCHEMA_VERSION + 1}"):
        open_store(store_url)


def test_a_failing_migration_step_leaves_nothing_behind(store_url: str):
    open_store(store_url).close()
    with pytest.raises(StoreError):
        SqlStore(
            backend_for(store_url),
            migrations=_step_2("CREATE TABLE extra (id INTEGER PRIMARY KEY)", "NOT SQL AT ALL"),
        )
    assert "extra" not in raw_tables(store_url)
    assert raw_query(store_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    reopened = open_store(store_url)
    assert reopened.schema_version() == SCHEMA_VERSION
    reopened.close()


def test_a_failing_first_migration_creates_no_table(store_url: str):
    raw_sql(store_url, ["CREATE TABLE ledger (taken TEXT)"])  # v1's CREATE TABLE ledger fails
    with pytest.raises(StoreError):
        open_store(store_url)
    assert raw_tables(store_url) == {"ledger"}


def test_a_sqlite_thread_connecting_after_an_upgrade_by_a_newer_capgate_is_refused(
    tmp_path: Path,
):
    url = f"sqlite://{tmp_path}/state.db"
    store = open_store(url)
    try:
        raw_sql(url, ["UPDATE schema_version SET version = 999, written_by = '9.9.9'"])
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                with store.transaction():
                    pass
            except BaseException as exc:
                errors.append(exc)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert len(errors) == 1
        assert isinstance(errors[0], StoreVersionError)
    finally:
        store.close()


# -- transactions, the clock ------------------------------------------------------------


def test_a_transaction_that_raises_leaves_nothing(store: Store, clock: FakeClock):
    _tenant(store)

    def doomed() -> None:
        with store.transaction() as tx:
            tx.put_tenant("globex", budget_class="standard", budget_limit=5)
            assert tx.reserve_budget("acme", "task-1", 3)
            tx.put_connection("acme", "crm", status=ConnectionStatus.ACTIVE, account="a@x.test")
            tx.record_evidence("acme", "task-1", "quote_checked", source="operation:op-0")
            _operation(tx)
            tx.insert_proposal(proposal(tx.now))
            tx.insert_review(review(tx.now))
            tx.append(LedgerEntry(kind="intent", tenant="acme"))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        doomed()
    with store.transaction() as tx:
        assert tx.get_tenant("globex") is None
        assert tx.budget("acme").reserved == 0
        assert tx.connections("acme") == {}
        assert tx.evidence("acme", "task-1") == set()
        assert tx.get_operation("acme", "op-1") is None
        assert tx.list_proposals() == []
        assert tx.reviews("pr-1") == []
        first = tx.append(LedgerEntry(kind="after"))
    assert store.ledger() == [first]
    assert first.seq == 1  # the rolled-back append used no sequence number


def test_a_failed_statement_rolls_back_the_whole_transaction_even_if_caught(store: Store):
    def caught_and_carried_on() -> None:
        with store.transaction() as tx:
            tx.put_tenant("acme", budget_class="standard", budget_limit=1)
            with pytest.raises(StoreError):
                tx._run("SELECT * FROM no_such_table")  # type: ignore[attr-defined]

    with pytest.raises(StoreError, match="rolled back"):
        caught_and_carried_on()
    with store.transaction() as tx:
        assert tx.get_tenant("acme") is None


def test_the_clock_is_read_once_per_transaction(store: Store, clock: FakeClock):
    _tenant(store)
    before = clock.calls
    with store.transaction() as tx:
        tx.put_connection("acme", "crm", status=ConnectionStatus.ACTIVE, account="a@x.test")
        clock.advance(seconds=5)  # the transaction keeps the time it began with
        evidence = tx.record_evidence("acme", "task-1", "e1", source="review:rv-1")
        op = _operation(tx)
        row = tx.append(LedgerEntry(kind="intent"))
        assert tx.now == clock.now - timedelta(seconds=5)
    assert clock.calls == before + 1
    assert op is not None
    assert evidence.recorded_at == op.created_at == row.at == clock.now - timedelta(seconds=5)
    with store.transaction() as tx:
        assert tx.now == clock.now
        assert tx.connections("acme")["crm"].updated_at == clock.now - timedelta(seconds=5)


def test_clock_readings_in_any_zone_are_stored_in_utc(store_url: str):
    clock = FakeClock(datetime(2030, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=2))))
    store = open_store(store_url, clock=clock)
    try:
        with store.transaction() as tx:
            assert tx.now.tzinfo == UTC
            row = tx.append(LedgerEntry(kind="x"))
        assert row.at == datetime(2030, 6, 1, 10, 0, tzinfo=UTC)
        assert store.ledger()[0].at.utcoffset() == timedelta(0)
    finally:
        store.close()


def test_a_clock_without_a_timezone_is_refused(store_url: str):
    clock = FakeClock(datetime(2030, 1, 1))  # naive
    with pytest.raises(StoreError, match="timezone"):
        open_store(store_url, clock=clock)


def test_transactions_do_not_nest_and_end_with_their_block(store: Store):
    with store.transaction() as tx:
        with pytest.raises(StoreError, match="do not nest"), store.transaction():
            pass
        with pytest.raises(StoreError, match="do not nest"):
            store.ledger()
    with pytest.raises(StoreError, match="ended"):
        tx.get_tenant("acme")


def test_a_transaction_belongs_to_its_thread(store: Store):
    errors: list[BaseException] = []
    with store.transaction() as tx:

        def elsewhere() -> None:
            try:
                tx.get_tenant("acme")
            except BaseException as exc:
                errors.append(exc)

        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
    assert len(errors) == 1
    assert isinstance(errors[0], StoreError)
    assert "thread" in str(errors[0])


def test_read_only_transactions_read_and_refuse_writes(store: Store):
    _tenant(store)
    with store.transaction(read_only=True) as tx:
        assert tx.get_tenant("acme") is not None
        assert tx.budget("acme").limit == 10
    with pytest.raises(StoreError), store.transaction(read_only=True) as tx:
        tx.put_tenant("globex", budget_class="standard", budget_limit=1)
    with store.transaction() as tx:
        assert tx.get_tenant("globex") is None


def test_a_closed_store_refuses_work(store_url: str):
    store = open_store(store_url)
    store.close()
    with pytest.raises(StoreError, match="closed"), store.transaction():
        pass


# -- tenants and budgets ------------------------------------------------------------------


def test_tenants_are_created_read_and_updated_keeping_their_spending(store: Store):
    with store.transaction() as tx:
        assert tx.get_tenant("acme") is None
        made = tx.put_tenant("acme", budget_class="standard", budget_limit=10)
        assert made == TenantRecord(tenant="acme", budget_class="standard", budget_limit=10)
        assert tx.get_tenant("acme") == made
        assert tx.reserve_budget("acme", None, 4)
        tx.settle_budget("acme", None, 1, spent=True)
        again = tx.put_tenant("acme", budget_class="premium", budget_limit=20)
        assert tx.get_tenant("acme") == again
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=20, reserved=3, spent=1)
        assert tx.set_budget_limit("acme", None).budget_limit is None
        assert tx.budget("acme").remaining is None
        with pytest.raises(UnknownTenant) as caught:
            tx.set_budget_limit("nobody", 5)
        assert caught.value.code == "unknown_tenant"
        with pytest.raises(InvalidInput):
            tx.put_tenant("not a tenant!", budget_class="standard", budget_limit=1)
        with pytest.raises(InvalidInput):
            tx.put_tenant("acme", budget_class="standard", budget_limit=-1)


def test_reservations_never_exceed_the_limit_and_settle_exactly(store: Store):
    _tenant(store, limit=10)
    with store.transaction() as tx:
        assert tx.reserve_budget("acme", None, 4)
        assert tx.reserve_budget("acme", None, 6)
        assert not tx.reserve_budget("acme", None, 1)
        assert tx.reserve_budget("acme", None, 0)  # nothing to spend always fits
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=10, reserved=10, spent=0)
        assert tx.budget("acme").remaining == 0
        tx.settle_budget("acme", None, 4, spent=True)
        tx.settle_budget("acme", None, 6, spent=False)
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=10, reserved=0, spent=4)
        assert tx.budget("acme").remaining == 6
        with pytest.raises(BudgetNotReserved) as caught:
            tx.settle_budget("acme", None, 1, spent=True)
        assert caught.value.code == "budget_not_reserved"
        assert tx.budget("acme").spent == 4
        assert not tx.reserve_budget("acme", None, 7)
        tx.set_budget_limit("acme", 2)  # below what is spent: nothing more fits
        assert tx.budget("acme").remaining == -2
        assert not tx.reserve_budget("acme", None, 1)


def test_settling_nothing_changes_nothing_but_still_needs_the_tenant(store: Store):
    _tenant(store, limit=10)
    with store.transaction() as tx:
        assert tx.reserve_budget("acme", "task-1", 3)
        tx.settle_budget("acme", "task-1", 0, spent=True)
        tx.settle_budget("acme", "never-reserved", 0, spent=False)
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=10, reserved=3, spent=0)
        assert tx.budget("acme", "task-1").reserved == 3
        with pytest.raises(UnknownTenant):
            tx.settle_budget("nobody", None, 0, spent=True)


def test_a_tenant_without_a_limit_reserves_anything(store: Store):
    _tenant(store, limit=None)
    with store.transaction() as tx:
        assert tx.reserve_budget("acme", None, 2**40)
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=None, reserved=2**40, spent=0)


@pytest.mark.parametrize("cost", [-1, True, 1.5, "3", 2**63])
def test_costs_must_be_whole_non_negative_numbers(store: Store, cost: Any):
    _tenant(store)
    with store.transaction() as tx, pytest.raises(InvalidInput, match="cost"):
        tx.reserve_budget("acme", None, cost)


def test_budgets_of_unknown_tenants_are_errors(store: Store):
    with store.transaction() as tx:
        with pytest.raises(UnknownTenant):
            tx.reserve_budget("nobody", None, 1)
        with pytest.raises(UnknownTenant):
            tx.settle_budget("nobody", None, 1, spent=True)
        with pytest.raises(UnknownTenant):
            tx.budget("nobody")
        with pytest.raises(UnknownTenant):
            tx.set_task_budget("nobody", "task-1", 3)


def test_task_budgets_are_checked_together_with_the_tenant_budget(store: Store):
    _tenant(store, limit=10)
    with store.transaction() as tx:
        tx.set_task_budget("acme", "small", 3)
        assert tx.reserve_budget("acme", "small", 2)
        # The task's limit refuses; nothing is reserved for the tenant either.
        assert not tx.reserve_budget("acme", "small", 2)
        assert tx.budget("acme").reserved == 2
        assert tx.budget("acme", "small") == BudgetState(
            tenant="acme", task_id="small", limit=3, reserved=2, spent=0
        )
        assert tx.reserve_budget("acme", None, 5)
        # The tenant's limit refuses; nothing is reserved for the task either.
        tx.set_task_budget("acme", "big", 100)
        assert not tx.reserve_budget("acme", "big", 4)
        assert tx.budget("acme", "big").reserved == 0
        assert tx.reserve_budget("acme", "big", 3)
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=10, reserved=10, spent=0)
        # A task without a limit of its own reports the tenant's budget...
        assert tx.budget("acme", "unlimited") == tx.budget("acme")
        tx.settle_budget("acme", "small", 2, spent=True)
        assert tx.budget("acme", "small") == BudgetState(
            tenant="acme", task_id="small", limit=3, reserved=0, spent=2
        )
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=10, reserved=8, spent=2)
        # ... and removing a limit keeps the task's spending for a later limit.
        tx.set_task_budget("acme", "small", None)
        assert tx.budget("acme", "small").task_id is None
        tx.set_task_budget("acme", "small", 3)
        assert tx.budget("acme", "small").spent == 2
        assert not tx.reserve_budget("acme", "small", 2)
        # Settling more than the task holds changes nothing, for the tenant either.
        with pytest.raises(BudgetNotReserved, match="task 'small'"):
            tx.settle_budget("acme", "small", 1, spent=False)
        assert tx.budget("acme") == BudgetState(tenant="acme", limit=10, reserved=8, spent=2)


def test_a_task_counts_its_spending_before_it_has_a_limit(store: Store):
    _tenant(store, limit=100)
    with store.transaction() as tx:
        assert tx.reserve_budget("acme", "t", 5)
        tx.settle_budget("acme", "t", 5, spent=True)
        tx.set_task_budget("acme", "t", 6)
        assert tx.budget("acme", "t") == BudgetState(
            tenant="acme", task_id="t", limit=6, reserved=0, spent=5
        )
        assert not tx.reserve_budget("acme", "t", 2)
        with pytest.raises(InvalidInput, match="task_id"):
            tx.reserve_budget("acme", "not a task id", 1)


# -- connections and evidence -------------------------------------------------------------


def test_connections_are_kept_per_tenant_with_their_status(store: Store, clock: FakeClock):
    _tenant(store)
    _tenant(store, tenant="globex")
    with store.transaction() as tx:
        crm = tx.put_connection(
            "acme", "crm", status=ConnectionStatus.ACTIVE, account="sales@acme.test"
        )
        assert crm == ConnectionRecord(
            tenant="acme",
            alias="crm",
            status=ConnectionStatus.ACTIVE,
            account="sales@acme.test",
            updated_at=clock.now,
        )
        tx.put_connection("acme", "mail", status=ConnectionStatus.DISABLED, account="m@acme.test")
        tx.put_connection("globex", "crm", status=ConnectionStatus.ACTIVE, account="g@x.test")
        with pytest.raises(UnknownTenant):
            tx.put_connection("nobody", "crm", status=ConnectionStatus.ACTIVE, account="a")
        with pytest.raises(InvalidInput):
            tx.put_connection("acme", "crm", status=ConnectionStatus.ACTIVE, account="")
    clock.advance(minutes=1)
    with store.transaction() as tx:
        revoked = tx.set_connection_status("acme", "crm", ConnectionStatus.REVOKED)
        assert revoked == crm.model_copy(
            update={"status": ConnectionStatus.REVOKED, "updated_at": clock.now}
        )
        with pytest.raises(UnknownConnection) as caught:
            tx.set_connection_status("acme", "nope", ConnectionStatus.ACTIVE)
        assert caught.value.code == "unknown_connection"
        with pytest.raises(InvalidInput):
            tx.set_connection_status("acme", "crm", "broken")  # type: ignore[arg-type]
    with store.transaction(read_only=True) as tx:
        acme = tx.connections("acme")
        assert sorted(acme) == ["crm", "mail"]
        assert acme["crm"] == revoked
        assert acme["mail"].status is ConnectionStatus.DISABLED
        assert tx.connections("globex")["crm"].account == "g@x.test"
        assert tx.connections("nobody") == {}


def test_evidence_is_recorded_once(store: Store, clock: FakeClock):
    _tenant(store)
    with store.transaction() as tx:
        first = tx.record_evidence("acme", "task-1", "quote_checked", source="operation:op-1")
        assert first == EvidenceRecord(
            tenant="acme",
            task_id="task-1",
            name="quote_checked",
            source="operation:op-1",
            recorded_at=clock.now,
        )
    clock.advance(seconds=10)
    with store.transaction() as tx:
        again = tx.record_evidence("acme", "task-1", "quote_checked", source="review:rv-9")
        assert again == first  # the first record stays, with its source and time
        tx.record_evidence("acme", "task-1", "customer_confirmed", source="review:rv-9")
        tx.record_evidence("acme", "task-2", "other", source="operation:op-2")
        assert tx.evidence("acme", "task-1") == {"quote_checked", "customer_confirmed"}
        assert tx.evidence("acme", "task-2") == {"other"}
        assert tx.evidence("acme", "task-3") == set()
        with pytest.raises(UnknownTenant):
            tx.record_evidence("nobody", "task-1", "x", source="s")
        with pytest.raises(InvalidInput):
            tx.record_evidence("acme", "task-1", "bad name!", source="s")


# -- operations ---------------------------------------------------------------------------


def test_operations_are_inserted_once_read_and_updated(store: Store, clock: FakeClock):
    _tenant(store)
    _tenant(store, tenant="globex")
    with store.transaction() as tx:
        op = _operation(tx)
        assert op == OperationRecord(
            tenant="acme",
            operation_id="op-1",
            tool="email.send",
            params_digest=DIGEST,
            task_id="task-1",
            status=OperationStatus.RUNNING,
            outcome=None,
            cost=2,
            attempts=1,
            lease_until=clock.now + LEASE,
            created_at=clock.now,
            updated_at=clock.now,
        )
        assert _operation(tx) is None  # same id: not inserted again
        assert _operation(tx, params_digest=OTHER_DIGEST, tool="other") is None
        assert tx.get_operation("acme", "op-1") == op
        assert tx.get_operation("acme", "op-1", for_update=True) == op
        assert tx.get_operation("globex", "op-1") is None  # ids are per tenant
        with pytest.raises(UnknownTenant):
            tx.insert_operation(
                "nobody",
                "op-1",
                tool="t",
                params_digest=DIGEST,
                cost=0,
                task_id=None,
                lease_until=tx.now,
            )
        with pytest.raises(InvalidInput):
            _operation(tx, "op-2", params_digest="md5:abc")
    clock.advance(seconds=3)
    outcome = {"status": "success", "result": {"id": "m-1", "note": "ünïcode"}, "n": 1.5}
    with store.transaction() as tx:
        done = tx.update_operation(
            "acme",
            "op-1",
            status=OperationStatus.DONE,
            outcome=outcome,
            attempts=2,
            lease_until=None,
        )
        assert done == op.model_copy(
            update={
                "status": OperationStatus.DONE,
                "outcome": outcome,
                "attempts": 2,
                "lease_until": None,
                "updated_at": clock.now,
            }
        )
        assert tx.get_operation("acme", "op-1") == done
        with pytest.raises(UnknownOperation) as caught:
            tx.update_operation(
                "acme",
                "op-9",
                status=OperationStatus.DONE,
                outcome=None,
                attempts=1,
                lease_until=None,
            )
        assert caught.value.code == "unknown_operation"


def test_each_update_of_an_operation_starts_from_the_last_one(store: Store, clock: FakeClock):
    # An update keeps whatever it is not given from the operation as this transaction
    # last left it: read for update, inserted, or updated by an earlier statement.
    _tenant(store)
    with store.transaction() as tx:
        inserted = _operation(tx)
        assert inserted is not None
        assert inserted.reserved
        released = tx.update_operation(
            "acme",
            "op-1",
            status=OperationStatus.RUNNING,
            outcome=None,
            attempts=1,
            lease_until=inserted.lease_until,
            reserved=False,
        )
        kept = tx.update_operation(
            "acme",
            "op-1",
            status=OperationStatus.DONE,
            outcome={"status": "success"},
            attempts=1,
            lease_until=None,
        )
        assert not released.reserved
        assert not kept.reserved
        assert tx.get_operation("acme", "op-1") == kept
    clock.advance(seconds=1)
    with store.transaction() as tx:
        locked = tx.get_operation("acme", "op-1", for_update=True)
        assert locked == kept
        again = tx.update_operation(
            "acme",
            "op-1",
            status=OperationStatus.RUNNING,
            outcome=None,
            attempts=2,
            lease_until=tx.now + LEASE,
        )
        assert again == kept.model_copy(
            update={
                "status": OperationStatus.RUNNING,
                "outcome": None,
                "attempts": 2,
                "lease_until": tx.now + LEASE,
                "updated_at": tx.now,
            }
        )
    with store.transaction(read_only=True) as tx:
        assert tx.get_operation("acme", "op-1") == again


def test_stale_operations_are_running_ones_past_their_lease(store: Store, clock: FakeClock):
    _tenant(store)
    with store.transaction() as tx:
        _operation(tx, "expired", lease_until=tx.now + timedelta(seconds=10))
        _operation(tx, "expired-earlier", lease_until=tx.now + timedelta(seconds=5))
        _operation(tx, "ends-exactly-now", lease_until=tx.now + timedelta(seconds=60))
        _operation(tx, "still-leased", lease_until=tx.now + timedelta(hours=1))
        _operation(tx, "finished", lease_until=tx.now + timedelta(seconds=1))
        tx.update_operation(
            "acme",
            "finished",
            status=OperationStatus.DONE,
            outcome={"status": "success"},
            attempts=1,
            lease_until=tx.now + timedelta(seconds=1),
        )
        assert tx.stale_operations() == []
    clock.advance(seconds=60)
    with store.transaction() as tx:
        stale = tx.stale_operations()
    assert [op.operation_id for op in stale] == ["expired-earlier", "expired"]
    assert all(op.status is OperationStatus.RUNNING for op in stale)


# -- proposals and reviews ----------------------------------------------------------------


def test_proposals_round_trip_and_filter(store: Store, clock: FakeClock):
    _tenant(store)
    _tenant(store, tenant="globex")
    local = datetime(2030, 1, 2, 5, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    with store.transaction() as tx:
        first = tx.insert_proposal(proposal(local))
        assert tx.get_proposal("pr-1") == first
        assert tx.get_proposal("pr-1", for_update=True) == first
        assert tx.get_proposal("pr-1").created_at.utcoffset() == timedelta(0)  # type: ignore[union-attr]
        tx.insert_proposal(proposal(tx.now, id="pr-2", operation_id="op-2"))
        tx.insert_proposal(proposal(tx.now, id="pr-3", tenant="globex", operation_id="op-1"))
        with pytest.raises(DuplicateOperation) as dup_op:
            tx.insert_proposal(proposal(tx.now, id="pr-4", operation_id="op-1"))
        assert dup_op.value.code == "duplicate_operation"
        with pytest.raises(DuplicateRecord) as dup_id:
            tx.insert_proposal(proposal(tx.now, id="pr-1", operation_id="op-9"))
        assert dup_id.value.code == "duplicate_record"
        with pytest.raises(UnknownTenant):
            tx.insert_proposal(proposal(tx.now, id="pr-5", tenant="nobody"))
    clock.advance(seconds=7)
    with store.transaction() as tx:
        approved = tx.update_proposal("pr-2", status=ProposalStatus.APPROVED, reason_codes=[])
        assert approved.updated_at == clock.now
        assert approved.created_at == clock.now - timedelta(seconds=7)
        assert approved.reason_codes == []
        with pytest.raises(UnknownProposal) as caught:
            tx.update_proposal("nope", status=ProposalStatus.APPROVED, reason_codes=[])
        assert caught.value.code == "unknown_proposal"

        def ids(**filters: Any) -> list[str]:
            return [p.id for p in tx.list_proposals(**filters)]

        assert ids() == ["pr-1", "pr-2", "pr-3"]
        assert ids(tenant="acme") == ["pr-1", "pr-2"]
        assert ids(status=ProposalStatus.PENDING) == ["pr-1", "pr-3"]
        assert ids(tenant="acme", status=ProposalStatus.APPROVED) == ["pr-2"]
        assert ids(tenant="globex", status=ProposalStatus.APPROVED) == []
        assert ids(tenant="nobody") == []
        assert tx.get_proposal("pr-2") == approved
        assert tx.get_proposal("nope") is None


def test_reviews_are_listed_oldest_first_and_consumed_exactly_once(store: Store, clock: FakeClock):
    _tenant(store)
    with store.transaction() as tx:
        tx.insert_proposal(proposal(tx.now))
        rejection = tx.insert_review(review(tx.now, id="rv-0", verdict=ReviewVerdict.REJECTED))
        approval = tx.insert_review(review(tx.now + timedelta(seconds=1), id="rv-1"))
        assert tx.reviews("pr-1") == [rejection, approval]
        assert tx.reviews("pr-9") == []
        with pytest.raises(DuplicateRecord):
            tx.insert_review(review(tx.now, id="rv-1"))
        with pytest.raises(UnknownProposal):
            tx.insert_review(review(tx.now, id="rv-2", proposal_id="pr-9"))
    clock.advance(seconds=30)
    with store.transaction() as tx:
        assert tx.consume_review("rv-1")
        assert not tx.consume_review("rv-1")
        assert not tx.consume_review("rv-0")  # a rejection grants nothing to consume
        with pytest.raises(UnknownReview) as caught:
            tx.consume_review("rv-9")
        assert caught.value.code == "unknown_review"
    with store.transaction() as tx:
        assert not tx.consume_review("rv-1")
        used = tx.reviews("pr-1")[1]
    assert used == approval.model_copy(update={"consumed_at": clock.now})


# -- the ledger ---------------------------------------------------------------------------


def _fill_ledger(store: Store, clock: FakeClock, rows: int = 5) -> None:
    for n in range(1, rows + 1):
        with store.transaction() as tx:
            tx.append(
                LedgerEntry(
                    kind="decision",
                    tenant="acme" if n % 2 else "globex",
                    principal="sales-bot/sales",
                    tool="email.send",
                    contract_version=3,
                    operation_id=f"op-{n}",
                    proposal_id="pr-1" if n <= 2 else None,
                    decision_id=f"dec-{n}",
                    policy_revision="rev-7",
                    outcome="allow",
                    reason_codes=["a", "b"] if n == 3 else [],
                    detail={"n": n, "nested": {"ok": True, "text": "ü"}},
                )
            )
        clock.advance(seconds=1)


def test_ledger_rows_form_one_hash_chain(store: Store, clock: FakeClock):
    start = clock.now
    _fill_ledger(store, clock)
    rows = store.ledger()
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
    assert rows[0].prev_hash == GENESIS_HASH == "sha256:" + "0" * 64
    for before, after in itertools.pairwise(rows):
        assert after.prev_hash == before.hash
    for row in rows:
        assert row.hash == hash_of(row)
    assert rows[2].reason_codes == ["a", "b"]
    assert rows[0].at == start
    assert rows[4].detail == {"n": 5, "nested": {"ok": True, "text": "ü"}}
    # The hash covers every field but itself, as documented.
    fields = rows[3].model_dump(mode="json", exclude={"hash"})
    fields["at"] = rows[3].at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert row_hash(fields) == rows[3].hash
    report = store.verify_ledger()
    assert report.ok
    assert report.rows == 5
    assert report.last_hash == rows[-1].hash
    assert report.first_bad_seq is None


def test_ledger_reads_filter_and_page(store: Store, clock: FakeClock):
    _fill_ledger(store, clock)
    assert [r.seq for r in store.ledger(tenant="acme")] == [1, 3, 5]
    assert [r.seq for r in store.ledger(operation_id="op-4")] == [4]
    assert [r.seq for r in store.ledger(proposal_id="pr-1")] == [1, 2]
    assert [r.seq for r in store.ledger(proposal_id="pr-1", tenant="globex")] == [2]
    assert [r.seq for r in store.ledger(after_seq=2, limit=2)] == [3, 4]
    assert [r.seq for r in store.ledger(after_seq=5)] == []
    assert store.ledger(limit=0) == []
    assert store.ledger(tenant="nobody") == []
    with pytest.raises(InvalidInput):
        store.ledger(after_seq=-1)


def test_an_empty_ledger_verifies(store: Store):
    report = store.verify_ledger()
    assert (report.ok, report.rows, report.last_hash) == (True, 0, None)


def test_ledger_entries_must_be_small_plain_json(store: Store):
    with store.transaction() as tx:
        with pytest.raises(InvalidInput, match="larger than"):
            tx.append(LedgerEntry(kind="x", detail={"blob": "x" * 70_000}))
        with pytest.raises(InvalidInput):
            tx.append(LedgerEntry(kind="x", detail={"bad": float("nan")}))


_FORGED_AT = "2030-01-01T00:00:00.000000Z"


def _forged_insert(store_url: str, prev_hash: str) -> tuple[str, list[Any]]:
    fields: dict[str, Any] = {
        "seq": 3,
        "at": _FORGED_AT,
        "prev_hash": prev_hash,
        "kind": "decision",
        "tenant": "acme",
        "principal": None,
        "tool": None,
        "contract_version": None,
        "operation_id": None,
        "proposal_id": None,
        "decision_id": None,
        "policy_revision": None,
        "outcome": "allow",
        "reason_codes": [],
        "detail": {},
    }
    forged = row_hash(fields)
    return (
        "INSERT INTO ledger (seq, at, prev_hash, hash, kind, tenant, outcome, reason_codes, "
        "detail) VALUES (3, ?, ?, ?, 'decision', 'acme', 'allow', '[]', '{}')",
        [_FORGED_AT, prev_hash, forged],
    )


@pytest.mark.parametrize(
    ("tampering", "first_bad", "problem"),
    [
        ("edit a field", 3, "hash does not match"),
        ("edit the time", 3, "hash does not match"),
        ("reformat the time", 3, "not in the store's form"),
        ("alter a hash", 3, "hash does not match"),
        ("delete a row", 4, "row 3 is missing"),
        ("delete two rows", 4, "rows 2 to 3 are missing"),
        ("reorder rows", 2, "prev_hash"),
        ("insert a row", 4, "prev_hash"),
        ("break the json", 3, "detail is not JSON"),
        ("rewrite the first prev_hash", 1, "genesis"),
    ],
)
def test_verify_ledger_finds_the_first_tampered_row(
    store: Store, store_url: str, clock: FakeClock, tampering: str, first_bad: int, problem: str
):
    _fill_ledger(store, clock)
    rows = store.ledger()
    tamperings: dict[str, list[Any]] = {
        "edit a field": ["UPDATE ledger SET outcome = 'deny' WHERE seq = 3"],
        "edit the time": [
            ("UPDATE ledger SET at = ? WHERE seq = 3", ["2030-01-02T03:04:07.678902Z"])
        ],
        "reformat the time": [
            ("UPDATE ledger SET at = ? WHERE seq = 3", ["2030-01-02 03:04:07.678901+00:00"])
        ],
        "alter a hash": [("UPDATE ledger SET hash = ? WHERE seq = 3", ["sha256:" + "f" * 64])],
        "delete a row": ["DELETE FROM ledger WHERE seq = 3"],
        "delete two rows": ["DELETE FROM ledger WHERE seq IN (2, 3)"],
        "reorder rows": [
            "UPDATE ledger SET seq = 1000 WHERE seq = 2",
            "UPDATE ledger SET seq = 2 WHERE seq = 4",
            "UPDATE ledger SET seq = 4 WHERE seq = 1000",
        ],
        "insert a row": [
            "UPDATE ledger SET seq = 6 WHERE seq = 5",
            "UPDATE ledger SET seq = 5 WHERE seq = 4",
            "UPDATE ledger SET seq = 4 WHERE seq = 3",
            # A forged row whose own hash is right and whose prev_hash is row 2's hash:
            # the chain breaks at the next row.
            _forged_insert(store_url, rows[1].hash),
        ],
        "break the json": ["UPDATE ledger SET detail = '{not json' WHERE seq = 3"],
        "rewrite the first prev_hash": [
            ("UPDATE ledger SET prev_hash = ? WHERE seq = 1", ["sha256:" + "1" * 64])
        ],
    }
    raw_sql(store_url, tamperings[tampering])
    report = store.verify_ledger()
    assert not report.ok
    assert report.first_bad_seq == first_bad
    assert report.problem is not None
    assert problem in report.problem
    assert report.last_hash is None


def test_a_long_ledger_is_verified_across_pages(store: Store, store_url: str):
    with store.transaction() as tx:
        for n in range(2_100):  # VERIFY_PAGE is 1000: three pages
            tx.append(LedgerEntry(kind="k", detail={"n": n}))
    assert store.verify_ledger().rows == 2_100
    raw_sql(store_url, ["UPDATE ledger SET kind = 'x' WHERE seq = 2050"])
    report = store.verify_ledger()
    assert (report.ok, report.first_bad_seq, report.rows) == (False, 2050, 2050)


# -- errors -------------------------------------------------------------------------------


def test_store_error_codes_are_stable():
    # The store's errors, as the store package offers them (they are defined with the
    # rest of the tree in capgate.gateway.errors).
    from capgate.gateway import errors, state

    codes = {
        name: getattr(state, name).code
        for name in state.__all__
        if isinstance(getattr(state, name), type)
        and issubclass(getattr(state, name), errors.StoreError)
    }
    assert codes == {
        "BudgetNotReserved": "budget_not_reserved",
        "DuplicateOperation": "duplicate_operation",
        "DuplicateRecord": "duplicate_record",
        "PinStale": "pin_stale",
        "StoreBusy": "store_busy",
        "StoreError": "store_error",
        "StoreURLError": "store_url_invalid",
        "StoreVersionError": "store_version_unsupported",
        "UnknownConnection": "unknown_connection",
        "UnknownOperation": "unknown_operation",
        "UnknownPin": "unknown_pin",
        "UnknownProposal": "unknown_proposal",
        "UnknownReview": "unknown_review",
        "UnknownTenant": "unknown_tenant",
    }
    assert all(issubclass(getattr(errors, n), CapgateError) for n in codes)
    assert issubclass(StoreBusy, StoreError)


def test_messages_cut_long_caller_values(store: Store):
    with store.transaction() as tx, pytest.raises(UnknownTenant) as caught:
        tx.reserve_budget("t" * 100_000, None, 1)
    assert len(str(caught.value)) < 200
    assert "100000 characters" in str(caught.value)


def test_the_sqlite_busy_timeout_ends_in_store_busy(tmp_path: Path):
    from capgate.gateway.state.sqlite import SqliteBackend

    url = f"sqlite://{tmp_path}/state.db"
    open_store(url).close()
    impatient = SqlStore(SqliteBackend(tmp_path / "state.db", busy_timeout=0.2))
    holder = open_store(url)
    try:
        with holder.transaction() as tx:
            tx.put_tenant("acme", budget_class="standard", budget_limit=1)
            with pytest.raises(StoreBusy) as caught:
                impatient.transaction().__enter__()
            assert "was locked by another writer" in str(caught.value)
            # Readers do not wait for the writer.
            with impatient.transaction(read_only=True) as reader:
                assert reader.get_tenant("acme") is None
    finally:
        impatient.close()
        holder.close()
    assert os.path.exists(tmp_path / "state.db")


def _in_thread(work: Any) -> tuple[threading.Thread, list[BaseException], list[Any]]:
    """Start ``work`` in a thread; what it raised and returned are collected."""
    raised: list[BaseException] = []
    returned: list[Any] = []

    def run() -> None:
        try:
            returned.append(work())
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, raised, returned


def test_writers_of_one_sqlite_store_queue_and_readers_do_not(tmp_path: Path):
    from capgate.gateway.state.sqlite import SqliteBackend

    # The writers that must get in wait by the hang bound, however busy the machine;
    # only the one that must give up is given a busy timeout it reaches (2 s).
    backend = SqliteBackend(tmp_path / "state.db", busy_timeout=HANG_SECONDS)
    store = SqlStore(backend)
    try:
        _tenant(store, limit=None)
        entered = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with store.transaction() as tx:
                tx.set_budget_limit("acme", 5)
                entered.set()
                release.wait(HANG_SECONDS)

        holder, holder_raised, _ = _in_thread(hold)
        assert entered.wait(HANG_SECONDS)
        # Another writer of this process waits its busy timeout, then StoreBusy.
        backend.busy_timeout = 2.0
        waiter, waiter_raised, _ = _in_thread(lambda: store.transaction().__enter__())
        waiter.join(HANG_SECONDS)
        backend.busy_timeout = HANG_SECONDS
        assert [type(exc) for exc in waiter_raised] == [StoreBusy]
        assert "another writer of this process" in str(waiter_raised[0])
        # A reader does not queue behind the writer, and sees the last commit.
        with store.transaction(read_only=True) as reader:
            record = reader.get_tenant("acme")
            assert record is not None
            assert record.budget_limit is None

        # A writer that starts while the holder still runs goes on once it ends.
        def write() -> int | None:
            with store.transaction() as tx:
                tx.set_budget_limit("acme", 7)
                record = tx.get_tenant("acme")
                return None if record is None else record.budget_limit

        second, second_raised, second_returned = _in_thread(write)
        time.sleep(0.05)
        release.set()
        holder.join(HANG_SECONDS)
        second.join(HANG_SECONDS)
        assert holder_raised == []
        assert second_raised == []
        assert second_returned == [7]

        # A writer that failed (rolled back) lets the next one in at once.
        def fail() -> None:
            with store.transaction() as tx:
                tx.set_budget_limit("acme", 1)
                raise RuntimeError("the step failed")

        with pytest.raises(RuntimeError):
            fail()
        third, third_raised, third_returned = _in_thread(write)
        third.join(HANG_SECONDS)
        assert third_raised == []
        assert third_returned == [7]
    finally:
        store.close()


def test_a_writer_waits_once_for_this_process_and_sqlite_together(tmp_path: Path):
    # Another process holds SQLite's writer lock. This process's first writer waits
    # for it inside SQLite; its second waits for the first at the gate, then in SQLite
    # for what is left: the busy timeout bounds its whole wait, not each of the two.
    from capgate.gateway.state.sqlite import SqliteBackend

    url = f"sqlite://{tmp_path}/state.db"
    other_process = open_store(url)
    store = SqlStore(SqliteBackend(tmp_path / "state.db", busy_timeout=2.0))
    waits: list[float] = []

    def begin_write() -> None:
        started = time.monotonic()
        try:
            store.transaction().__enter__()
        finally:
            waits.append(time.monotonic() - started)

    try:
        with other_process.transaction() as tx:
            tx.put_tenant("acme", budget_class="standard", budget_limit=1)
            first, first_raised, _ = _in_thread(begin_write)
            time.sleep(0.5)
            second, second_raised, _ = _in_thread(begin_write)
            first.join(HANG_SECONDS)
            second.join(HANG_SECONDS)
        assert [type(exc) for exc in first_raised + second_raised] == [StoreBusy, StoreBusy]
        assert len(waits) == 2
        # Against the first writer's wait in this run (one plain busy timeout, on this
        # machine however loaded), not against a number of seconds: the second waits
        # about as long, since its wait at the gate counts; waiting twice it would wait
        # 1.5 s more (for the first to give up at the gate, then 2 s in SQLite). Half of
        # that is the slack for how unevenly a loaded machine wakes the two.
        assert max(waits) < min(waits) + 0.75, waits
        with store.transaction() as tx:  # the gate was given back after both failures
            tx.put_tenant("globex", budget_class="standard", budget_limit=1)
    finally:
        store.close()
        other_process.close()


# -- the PostgreSQL pool and the test server --------------------------------------------


def test_a_full_pool_ends_in_store_busy(postgres_url: str):
    from capgate.gateway.state.open import parse_store_url
    from capgate.gateway.state.postgres import PostgresBackend

    address = parse_store_url(postgres_url)
    store = SqlStore(
        PostgresBackend(address.target, location=address.location, pool_size=1, busy_timeout=0.3)
    )
    held = threading.Event()
    done = threading.Event()

    def hold_the_only_connection() -> None:
        with store.transaction():
            held.set()
            done.wait(timeout=HANG_SECONDS)

    holder = threading.Thread(target=hold_the_only_connection)
    holder.start()
    try:
        assert held.wait(timeout=HANG_SECONDS)
        with pytest.raises(StoreBusy, match="all 1 connections"):
            store.schema_version()
    finally:
        done.set()
        holder.join()
    assert store.schema_version() == SCHEMA_VERSION  # the connection came back to the pool
    store.close()


def test_a_pooled_connection_the_server_closed_is_replaced(postgres_server: Any, postgres_url: str):
    store = open_store(postgres_url)
    try:
        _tenant(store)
        dbname = postgres_url.split("///", 1)[1].split("?", 1)[0]
        with postgres_server.admin() as admin:
            ended = admin.execute(
                b"SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                b"WHERE datname = %s AND application_name = 'capgate'",
                (dbname,),
            ).fetchall()
        assert ended
        assert all(row[0] for row in ended)
        with store.transaction() as tx:  # begins on a new connection, transparently
            assert tx.get_tenant("acme") is not None
    finally:
        store.close()


def test_missing_postgresql_binaries_fail_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setattr("shutil.which", lambda _name: None)
    monkeypatch.setattr(pg_fixtures, "PACKAGE_BIN_GLOB", str(tmp_path / "none" / "*" / "bin"))
    with pytest.raises(pytest.fail.Exception, match="apt-get install postgresql"):
        pg_fixtures.find_bin_dir()


def test_the_core_and_sqlite_work_without_psycopg(tmp_path: Path):
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from gateway.state import StoreError, open_store\n"
        f"store = open_store({str(tmp_path / 'state.db')!r}); store.close()\n"
        "try:\n"
        f"    open_store('postgresql:///db?host={tmp_path}')\n"
        "except StoreError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=True,
    )
    assert "pip install 'capgate[postgres]'" in done.stdout
