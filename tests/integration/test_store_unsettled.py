"""Finding what is unsettled, on SQLite and a real PostgreSQL: schema 4.

An ``unknown`` outcome is settled by a lookup, never by acting again; the reconciler
finds the operations to look up (``Tx.unsettled_operations``), and a new proposal
finds the operations of its very content whose outcome is still open
(``Tx.unsettled_twins``), through the ``outcome_status`` column schema 4 adds. These
tests hold both backends to it: a store of schema 3 upgraded with its outcomes
classified from their JSON (a tool result that merely contains the word "unknown"
is not an unknown outcome), every later write keeping the column true, and one
tenant never seeing another's operations.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from capgate.gateway.digest import canonical_json
from capgate.gateway.state import SCHEMA_VERSION, open_store
from capgate.gateway.state.migrations import MIGRATIONS
from capgate.gateway.state.open import backend_for
from capgate.gateway.state.records import OperationStatus
from capgate.gateway.state.sql import SqlStore
from capgate.gateway.state.store import Store
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_support import raw_sql

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


def _outcome(operation_id: str, status: str, **fields: Any) -> dict[str, Any]:
    return {
        "tool": "pay",
        "version": 1,
        "operation_id": operation_id,
        "status": status,
        "result": None,
        "error": None,
        "recovery": None,
        "retry_after_seconds": None,
        "decision_id": None,
        "provider_receipt": None,
        **fields,
    }


def test_a_version_3_store_is_upgraded_with_its_outcomes_classified(store_url: str):
    third = SqlStore(backend_for(store_url), migrations=list(MIGRATIONS[:3]))
    assert third.schema_version() == 3
    third.close()
    at = "2026-01-01T00:00:00.000000Z"
    rows = {
        "op-unknown": ("done", _outcome("op-unknown", "unknown", recovery="lookup_before_retry")),
        # A success whose (untrusted) result says "status": "unknown" inside.
        "op-success": ("done", _outcome("op-success", "success", result={"status": "unknown"})),
        "op-retryable": ("done", _outcome("op-retryable", "retryable")),
        "op-running": ("running", None),
    }
    statements: list[str | tuple[str, list[Any]]] = [
        (
            "INSERT INTO tenants (tenant, budget_class, budget_limit, reserved, spent, "
            "created_at, updated_at) VALUES ('acme', 'standard', 10, 1, 0, ?, ?)",
            [at, at],
        )
    ]
    for operation_id, (status, outcome) in rows.items():
        text = None if outcome is None else canonical_json(outcome).decode()
        statements.append(
            (
                "INSERT INTO operations (tenant, operation_id, tool, params_digest, task_id, "
                "status, outcome, cost, attempts, lease_until, created_at, updated_at, "
                "reserved) VALUES ('acme', ?, 'pay', ?, NULL, ?, ?, 1, 1, ?, ?, ?, 1)",
                [operation_id, DIGEST, status, text, at if outcome is None else None, at, at],
            )
        )
    raw_sql(store_url, statements)

    upgraded = open_store(store_url)
    try:
        assert upgraded.schema_version() == SCHEMA_VERSION >= 4
        with upgraded.transaction(read_only=True) as tx:
            assert [op.operation_id for op in tx.unsettled_operations()] == ["op-unknown"]
            # Running or unknown: the same content may already have been acted on.
            assert tx.unsettled_twins("acme", "pay", DIGEST) == ["op-running", "op-unknown"]
            assert tx.unsettled_twins("acme", "pay", OTHER) == []
            assert tx.unsettled_twins("acme", "refund", DIGEST) == []
    finally:
        upgraded.close()


def test_every_write_keeps_the_unsettled_operations_true(store: Store):
    with store.transaction() as tx:
        for tenant in ("acme", "globex"):
            tx.put_tenant(tenant, budget_class="standard", budget_limit=None)
        for tenant in ("acme", "globex"):
            tx.insert_operation(
                tenant, "op-1", tool="pay", params_digest=DIGEST, cost=0, task_id=None,
                lease_until=tx.now + timedelta(minutes=5),
            )  # fmt: skip
    with store.transaction(read_only=True) as tx:
        assert tx.unsettled_operations() == []  # running is not unknown
        assert tx.unsettled_twins("acme", "pay", DIGEST) == ["op-1"]

    def finish(tenant: str, status: str) -> None:
        with store.transaction() as tx:
            tx.update_operation(
                tenant, "op-1", status=OperationStatus.DONE,
                outcome=_outcome("op-1", status), attempts=1, lease_until=None,
            )  # fmt: skip

    finish("acme", "unknown")
    finish("globex", "success")
    with store.transaction(read_only=True) as tx:
        assert [(op.tenant, op.operation_id) for op in tx.unsettled_operations()] == [
            ("acme", "op-1")
        ]
        assert tx.unsettled_twins("acme", "pay", DIGEST) == ["op-1"]
        # One tenant never sees another's operations, whatever their content.
        assert tx.unsettled_twins("globex", "pay", DIGEST) == []
        assert tx.unsettled_twins("initech", "pay", DIGEST) == []
    finish("acme", "success")  # settled by a lookup, say
    with store.transaction(read_only=True) as tx:
        assert tx.unsettled_operations() == []
        assert tx.unsettled_twins("acme", "pay", DIGEST) == []
