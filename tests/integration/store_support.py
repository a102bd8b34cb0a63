"""Fixtures and helpers shared by the store tests (both backends).

``store_url`` is parametrised over ``sqlite`` (a file in the test's tmp_path) and
``postgresql`` (a fresh database on the session's throw-away server, started only
when a PostgreSQL test runs). ``store`` opens it with a :class:`FakeClock`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from capgate.gateway.model.facts import Principal, Reviewer
from capgate.gateway.state import open_store
from capgate.gateway.state.records import (
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
)
from capgate.gateway.state.store import Store

BACKENDS = ["sqlite", "postgresql"]
DIGEST = "sha256:" + "ab" * 32
OTHER_DIGEST = "sha256:" + "cd" * 32


class FakeClock:
    """A store clock the test moves by hand; counts how often it is read."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        self.calls = 0

    def __call__(self) -> datetime:
        self.calls += 1
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """An address of an empty store of each backend."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/state/gateway.db"  # tmp_path is absolute: sqlite:///...
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(store_url: str, clock: FakeClock) -> Iterator[Store]:
    opened = open_store(store_url, clock=clock)
    try:
        yield opened
    finally:
        opened.close()


def raw_sql(url: str, statements: Sequence[str | tuple[str, Sequence[Any]]]) -> None:
    """Run statements on the store's database directly, outside capgate (tampering).

    Parameters are written ``?`` (turned into ``%s`` for PostgreSQL). A SQLite file
    that does not exist yet is created, as a database made by hand would be.
    """
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path)
        try:
            for statement in statements:
                sql, params = (statement, ()) if isinstance(statement, str) else statement
                conn.execute(sql, params)
            conn.commit()
        finally:
            conn.close()
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            for statement in statements:
                sql, params = (statement, ()) if isinstance(statement, str) else statement
                pg.execute(sql.replace("?", "%s").encode(), params)


def raw_query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of one query, read directly from the store's database."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            return list(conn.execute(sql).fetchall())
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        return list(pg.execute(sql.encode()).fetchall())


def raw_tables(url: str) -> set[str]:
    if url.startswith("sqlite:///"):
        rows = raw_query(url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        rows = raw_query(url, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    return {str(row[0]) for row in rows if not str(row[0]).startswith("sqlite_")}


def proposal(
    now: datetime,
    *,
    id: str = "pr-1",
    tenant: str = "acme",
    operation_id: str = "op-1",
    status: ProposalStatus = ProposalStatus.PENDING,
    params: dict[str, Any] | None = None,
) -> ProposalRecord:
    return ProposalRecord(
        id=id,
        tenant=tenant,
        task_id="task-1",
        proposer=Principal(agent="sales-bot", role="sales", tenant=tenant),
        environment="production",
        task={"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c-42"}]},
        tool="email.send",
        contract_version=3,
        execution_action="email.send",
        params=params or {"to": "ada@example.test", "body": "Grüße ✓", "n": [1, 2.5, None]},
        params_digest=DIGEST,
        operation_id=operation_id,
        decision_id="dec-1",
        status=status,
        reason_codes=["approval_required"],
        created_at=now,
        updated_at=now,
    )


def review(
    now: datetime,
    *,
    id: str = "rv-1",
    proposal_id: str = "pr-1",
    verdict: ReviewVerdict = ReviewVerdict.APPROVED,
) -> ReviewRecord:
    return ReviewRecord(
        id=id,
        proposal_id=proposal_id,
        reviewer=Reviewer(
            id="ada", role="sales_manager", tenant="acme", authenticated_by="test:fixture"
        ),
        verdict=verdict,
        kind="human",
        tenant="acme",
        tool="email.send",
        operation_id="op-1",
        digest=DIGEST,
        expires_at=now + timedelta(hours=1),
        decision_id=None,
        created_at=now,
    )
