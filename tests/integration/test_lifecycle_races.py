"""Budgets and duplicate operations raced through whole gateways, on both backends.

Issue #7: "100 concurrent calls against a budget of 10 run exactly 10, in one
process and across two gateway processes"; "50 concurrent duplicates cause exactly
one provider call, across processes too". Each race goes through everything a call
goes through (the store's facts, a real OPA decision, the claim, the tool, the
record), with threads of one gateway, and with two spawned gateway processes that
each start their own OPA and share only the store (the same SQLite file or
PostgreSQL database) and the provider's file, where every run of the tool body
appends one line.

The tool, ``meter.tick``, costs 1 unit and is ``not_idempotent`` without a lookup
(``tests/integration/lifecycle_support.py``): a second run of it would be a second
effect, and the provider's file shows it.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import open_store
from capgate.gateway.state.records import OperationStatus
from capgate.gateway.state.store import Store
from tests.hang import HANG_SECONDS
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_children import Result, call_race, race_child
from tests.integration.lifecycle_support import (
    TENANT,
    FileProvider,
    make_gateway,
    seed,
)

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url

BUDGET = 10


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    try:
        seed(opened, budget_limit=BUDGET, budget_class="standard")
        yield opened
    finally:
        opened.close()


@pytest.fixture
def provider(tmp_path: Path) -> FileProvider:
    made = FileProvider(tmp_path / "effects.jsonl")
    made.delay = 0.05  # a tool body that takes a while: duplicates overlap it
    return made


@pytest.fixture
def gateway(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
) -> Gateway:
    return make_gateway(lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools())


def race_processes(
    url: str, lifecycle_catalogue_dir: Path, effects: Path, race: str, processes: int, threads: int
) -> list[Result]:
    """``race`` in ``processes`` spawned gateway processes at once; every call's result."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(processes)
    results: Any = ctx.Queue()
    children = [
        ctx.Process(
            target=race_child,
            args=(
                url,
                str(lifecycle_catalogue_dir),
                str(effects),
                race,
                n,
                threads,
                start,
                results,
            ),
        )
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
        pytest.fail(f"only {len(reports)} of {processes} gateway processes reported: {reports}")
    finally:
        for child in children:
            child.join(timeout=max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                child.kill()
                child.join()
    assert [error for _worker, _results, error in reports if error] == []
    assert all(child.exitcode == 0 for child in children)
    return [result for _worker, worker_results, _error in reports for result in worker_results]


def _pids(effects: Path) -> list[int]:
    return [entry["pid"] for entry in FileProvider(effects).entries()]


def _errors(results: list[Result]) -> list[str]:
    return [text for kind, text in results if kind == "error"]


def _assert_budget(store: Store, spent: int, reserved: int = 0) -> None:
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    assert (budget.spent, budget.reserved) == (spent, reserved)


def _assert_budget_race(results: list[Result], store: Store, provider: FileProvider) -> None:
    assert _errors(results) == []
    counted = Counter(kind if kind == "outcome" else text for kind, text in results)
    assert counted == {"outcome": BUDGET, "budget_exhausted": len(results) - BUDGET}
    ran = provider.entries("meter.tick")
    assert len(ran) == BUDGET  # exactly ten tool bodies ran, in all processes together
    outcomes = [Outcome.model_validate_json(text) for kind, text in results if kind == "outcome"]
    assert all(o.ok for o in outcomes)
    assert sorted(o.provider_receipt or "" for o in outcomes) == sorted(e["receipt"] for e in ran)
    _assert_budget(store, BUDGET)
    intents = [row for row in store.ledger(tenant=TENANT) if row.kind == "intent"]
    assert len(intents) == BUDGET
    report = store.verify_ledger()
    assert report.ok, report.problem


def _assert_duplicate_race(results: list[Result], store: Store, provider: FileProvider) -> None:
    assert _errors(results) == []
    assert {kind for kind, _text in results} == {"outcome"}
    outcomes = {text for _kind, text in results}
    assert len(outcomes) == 1  # every caller got the one outcome
    outcome = Outcome.model_validate_json(outcomes.pop())
    assert outcome.ok
    [ran] = provider.entries("meter.tick")  # exactly one provider call
    assert outcome.provider_receipt == ran["receipt"]
    with store.transaction(read_only=True) as tx:
        operation = tx.get_operation(TENANT, "op-duplicate")
    assert operation is not None
    assert operation.status is OperationStatus.DONE
    assert operation.attempts == 1
    _assert_budget(store, 1)
    rows = store.ledger(operation_id="op-duplicate")
    assert [r.kind for r in rows].count("intent") == 1
    assert [r.kind for r in rows].count("outcome") == 1
    assert store.verify_ledger().ok


# -- budgets ----------------------------------------------------------------------------------


def test_100_concurrent_calls_against_a_budget_of_10_run_exactly_10(
    gateway: Gateway, store: Store, provider: FileProvider
) -> None:
    results = call_race(gateway, "budget", 0, 100)
    _assert_budget_race(results, store, provider)


def test_100_calls_from_two_gateway_processes_against_a_budget_of_10_run_exactly_10(
    store: Store, store_url: str, lifecycle_catalogue_dir: Path, provider: FileProvider
) -> None:
    results = race_processes(store_url, lifecycle_catalogue_dir, provider.path, "budget", 2, 50)
    assert len(results) == 100
    _assert_budget_race(results, store, provider)


# -- duplicates -------------------------------------------------------------------------------


def test_50_concurrent_duplicates_make_one_provider_call(
    gateway: Gateway, store: Store, provider: FileProvider
) -> None:
    results = call_race(gateway, "duplicate", 0, 50)
    _assert_duplicate_race(results, store, provider)


def test_50_duplicates_from_two_gateway_processes_make_one_provider_call(
    store: Store, store_url: str, lifecycle_catalogue_dir: Path, provider: FileProvider
) -> None:
    results = race_processes(store_url, lifecycle_catalogue_dir, provider.path, "duplicate", 2, 25)
    assert len(results) == 50
    _assert_duplicate_race(results, store, provider)


# -- reconciling ------------------------------------------------------------------------------


def test_concurrent_reconcilers_settle_each_stale_operation_once(
    gateway: Gateway, store: Store, lifecycle_catalogue: Catalogue, lifecycle_sidecar: PolicySidecar
) -> None:
    # Five operations whose runners died: running, their budget reserved, lease over.
    with store.transaction() as tx:
        for n in range(5):
            assert tx.reserve_budget(TENANT, "task-meter-1", 1)
            tx.insert_operation(
                TENANT,
                f"op-stale-{n}",
                tool="meter.tick",
                params_digest="sha256:" + f"{n:02d}" * 32,
                cost=1,
                task_id="task-meter-1",
                lease_until=tx.now - timedelta(seconds=1),
            )
    # Several gateways (as several processes would, at start-up) reconcile at once.
    gateways = [
        make_gateway(lifecycle_catalogue, lifecycle_sidecar.client, store) for _ in range(6)
    ]
    start = threading.Barrier(len(gateways))

    def reconcile(gateway: Gateway) -> list[str] | str:
        start.wait(timeout=HANG_SECONDS)
        try:
            return [record.operation_id for record in gateway.reconcile()]
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=len(gateways)) as pool:
        results = list(pool.map(reconcile, gateways))
    assert [r for r in results if isinstance(r, str)] == []
    settled = sorted(op for found in results if isinstance(found, list) for op in found)
    assert settled == [f"op-stale-{n}" for n in range(5)]  # each by exactly one of them
    reconciled = [row for row in store.ledger() if "reconciled" in row.reason_codes]
    assert sorted(row.operation_id or "" for row in reconciled) == settled
    # Unknown now, with no lookup to settle them: each still holds its reservation,
    # once (not released, not charged twice).
    _assert_budget(store, 0, reserved=5)
    assert store.verify_ledger().ok
