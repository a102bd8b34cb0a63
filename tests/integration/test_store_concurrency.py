"""The store's concurrency guarantees, raced for real on both backends.

Threads of one process (one store object, a connection per thread or per
transaction) and separate OS processes (each opening the same SQLite file or the
same PostgreSQL database by URL) make every attempt in its own transaction, all
released at once by a barrier:

- 100 reservations of 1 against a limit of 10: exactly 10 succeed, 10 reserved;
- 50 inserts of one (tenant, operation_id): exactly one gets a record;
- 20 consumptions of one approval: exactly one succeeds;
- 8 x 50 ledger appends: 400 consecutive sequence numbers, and the chain verifies;
- 40 claims of one job each from a queue of 20: exactly 20 succeed, each job
  claimed once (its ``tries`` is 1).
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from capgate.gateway.state import open_store
from capgate.gateway.state.store import SCHEMA_VERSION, Store, Tx
from tests.hang import HANG_SECONDS
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_races import attempt, run_races
from tests.integration.store_support import proposal, review

pytestmark = pytest.mark.integration

# The shared fixtures, bound here so pytest finds them (one server per session).
postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

T = TypeVar("T")


def _race(store: Store, threads: int, body: Callable[[Tx, int], T]) -> list[T]:
    """``threads`` threads, released together, each running ``body`` in its own
    transaction; their results (any exception fails the test)."""
    start = threading.Barrier(threads)

    def one(n: int) -> T:
        start.wait(timeout=HANG_SECONDS)
        with store.transaction() as tx:
            return body(tx, n)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, range(threads)))


def _prepare(store: Store, *, limit: int = 10, with_review: bool = False, jobs: int = 0) -> None:
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=limit)
        if with_review:
            tx.insert_proposal(proposal(tx.now))
            tx.insert_review(review(tx.now))
        for n in range(jobs):
            tx.insert_proposal(proposal(tx.now, id=f"pr-q{n}", operation_id=f"op-q{n}"))
            tx.queue_dispatch(f"pr-q{n}")


def _claimed_once(store: Store, jobs: int) -> None:
    with store.transaction(read_only=True) as tx:
        queued = tx.dispatches()
    assert len(queued) == jobs
    assert {job.tries for job in queued} == {1}
    assert len({job.claimed_by for job in queued}) == jobs


# -- threads ------------------------------------------------------------------------------


def test_100_threads_reserve_against_a_limit_of_10(store: Store):
    _prepare(store, limit=10)
    results = _race(store, 100, lambda tx, n: attempt(tx, "budget", 0, n))
    assert results.count(True) == 10
    with store.transaction() as tx:
        budget = tx.budget("acme")
    assert (budget.reserved, budget.spent, budget.remaining) == (10, 0, 0)


def test_50_threads_insert_one_operation_once(store: Store):
    _prepare(store)
    results = _race(store, 50, lambda tx, n: attempt(tx, "operation", 0, n))
    assert results.count(True) == 1
    with store.transaction() as tx:
        record = tx.get_operation("acme", "op-shared")
    assert record is not None
    assert record.attempts == 1


def test_20_threads_consume_one_approval_once(store: Store):
    _prepare(store, with_review=True)
    results = _race(store, 20, lambda tx, n: attempt(tx, "review", 0, n))
    assert results.count(True) == 1


def test_8_threads_append_400_rows_to_one_chain(store: Store):
    start = threading.Barrier(8)

    def appender(worker: int) -> None:
        start.wait(timeout=HANG_SECONDS)
        for n in range(50):
            with store.transaction() as tx:
                attempt(tx, "ledger", worker, n)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(appender, range(8)))
    rows = store.ledger()
    assert [row.seq for row in rows] == list(range(1, 401))
    assert sorted((r.detail["worker"], r.detail["n"]) for r in rows) == [
        (w, n) for w in range(8) for n in range(50)
    ]
    report = store.verify_ledger()
    assert report.ok, report.problem
    assert report.rows == 400


def test_40_threads_claim_20_jobs_each_once(store: Store):
    _prepare(store, jobs=20)
    wins = _race(store, 40, lambda tx, n: attempt(tx, "claim", 0, n))
    assert sum(wins) == 20
    _claimed_once(store, 20)


# -- processes ----------------------------------------------------------------------------


def _race_processes(url: str, race: str, processes: int, attempts_each: int) -> int:
    """Run ``race`` in ``processes`` spawned processes at once; total wins."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(processes)
    results: Any = ctx.Queue()
    children = [
        ctx.Process(target=run_races, args=(url, race, n, attempts_each, start, results))
        for n in range(processes)
    ]
    for child in children:
        child.start()
    reports = []
    # Every child must report and then exit (its exit status is asserted): one hang
    # bound for all of them, never a pace.
    deadline = time.monotonic() + HANG_SECONDS
    try:
        for _ in children:
            reports.append(results.get(timeout=max(0.0, deadline - time.monotonic())))
    except queue.Empty:
        pytest.fail(f"only {len(reports)} of {processes} processes reported: {reports}")
    finally:
        for child in children:
            child.join(timeout=max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join()
    errors = [error for _worker, _wins, error in reports if error]
    assert errors == []
    assert all(child.exitcode == 0 for child in children)
    return sum(wins for _worker, wins, _error in reports)


def test_processes_reserve_exactly_the_limit(store: Store, store_url: str):
    _prepare(store, limit=10)
    assert _race_processes(store_url, "budget", processes=4, attempts_each=25) == 10
    with store.transaction() as tx:
        assert tx.budget("acme").reserved == 10


def test_processes_insert_one_operation_once(store: Store, store_url: str):
    _prepare(store)
    assert _race_processes(store_url, "operation", processes=5, attempts_each=10) == 1


def test_processes_consume_one_approval_once(store: Store, store_url: str):
    _prepare(store, with_review=True)
    assert _race_processes(store_url, "review", processes=4, attempts_each=5) == 1


def test_processes_claim_each_job_once(store_url: str):
    # The system clock, as the children's: jobs queued at the fake clock's 2030 are
    # not due for them.
    system = open_store(store_url)
    try:
        _prepare(system, jobs=20)
        assert _race_processes(store_url, "claim", processes=4, attempts_each=10) == 20
        _claimed_once(system, 20)
    finally:
        system.close()


def test_processes_append_to_one_chain(store: Store, store_url: str):
    assert _race_processes(store_url, "ledger", processes=3, attempts_each=20) == 60
    rows = store.ledger()
    assert [row.seq for row in rows] == list(range(1, 61))
    assert store.verify_ledger().ok


def test_processes_opening_a_new_store_at_once_migrate_it_once(store_url: str):
    # Nothing prepared: every process finds an empty database and migrates it under
    # the migration lock (or SQLite's writer lock); all of them then work on it.
    assert _race_processes(store_url, "ledger", processes=3, attempts_each=2) == 6
    opened = open_store(store_url)
    try:
        assert opened.schema_version() == SCHEMA_VERSION
        assert opened.verify_ledger().rows == 6
    finally:
        opened.close()
