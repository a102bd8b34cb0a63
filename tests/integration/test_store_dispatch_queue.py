"""The dispatch queue and the store's notices, on both backends.

What the execution workers rely on (``gateway/state/sql/dispatches.py``): a job is
queued once per proposal; a claim takes due, unclaimed jobs and counts a try; a
claim that lapses (by the store's clock) can be taken by another worker, and the
worker who lost it can neither renew nor settle it; a job queued again waits for
its time; the next due time is the earliest of the queue's. And what they wait with
(``Store.listen``): a commit that queues wakes a listener, a rollback does not, a
read-only transaction cannot notify, and on PostgreSQL another store object (as
another process would) is woken through ``LISTEN``/``NOTIFY``. The races between
claims (threads and processes) are in ``test_store_concurrency.py``.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from capgate.gateway.errors import InvalidInput, StoreError, UnknownProposal
from capgate.gateway.state import open_store
from capgate.gateway.state.migrations import MIGRATIONS
from capgate.gateway.state.open import backend_for
from capgate.gateway.state.records import DispatchStatus, ProposalStatus
from capgate.gateway.state.sql import SqlStore
from capgate.gateway.state.store import SCHEMA_VERSION, Store
from capgate.gateway.state.times import to_text
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_support import FakeClock, proposal, raw_sql

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

CLAIM = timedelta(seconds=30)
#: Bounds a hang only: a notice is expected long before.
HANG = 60.0


def _queued(store: Store, count: int = 1) -> list[str]:
    ids = [f"pr-{n}" for n in range(count)]
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
        for n, proposal_id in enumerate(ids):
            tx.insert_proposal(
                proposal(tx.now, id=proposal_id, operation_id=f"op-{n}",
                         status=ProposalStatus.APPROVED)
            )  # fmt: skip
            tx.queue_dispatch(proposal_id)
    return ids


def test_a_job_is_queued_once_per_proposal_and_due_at_once(store: Store, clock: FakeClock):
    [pid] = _queued(store)
    with store.transaction() as tx:
        again = tx.queue_dispatch(pid)
        assert again.tries == 0
        assert again.status is DispatchStatus.QUEUED
        assert again.not_before == clock.now
        assert tx.next_dispatch_due() == clock.now
        assert [job.proposal_id for job in tx.dispatches()] == [pid]
        with pytest.raises(UnknownProposal):
            tx.queue_dispatch("pr-none")


def test_a_claim_takes_due_jobs_once_and_counts_a_try(store: Store, clock: FakeClock):
    ids = _queued(store, 3)
    with store.transaction() as tx:
        first = tx.claim_dispatches("w1", limit=2, claim=CLAIM)
        second = tx.claim_dispatches("w2", limit=5, claim=CLAIM)
        none = tx.claim_dispatches("w3", limit=5, claim=CLAIM)
    assert [job.proposal_id for job in first] == ids[:2]
    assert [job.proposal_id for job in second] == ids[2:]
    assert none == []
    assert {job.tries for job in first + second} == {1}
    assert {job.claim_until for job in first} == {clock.now + CLAIM}
    with store.transaction(read_only=True) as tx:
        # Every job is held: the next one is due when the first claim ends.
        assert tx.next_dispatch_due() == clock.now + CLAIM


def test_a_lapsed_claim_goes_to_another_worker_and_the_first_loses_it(
    store: Store, clock: FakeClock
):
    [pid] = _queued(store)
    with store.transaction() as tx:
        assert tx.claim_dispatches("dead", limit=1, claim=CLAIM)
        assert tx.renew_dispatches("dead", [pid], claim=CLAIM) == [pid]
    clock.advance(seconds=29)
    with store.transaction() as tx:
        assert tx.claim_dispatches("alive", limit=1, claim=CLAIM) == []
    clock.advance(seconds=2)  # the renewed claim is over now
    with store.transaction() as tx:
        [taken] = tx.claim_dispatches("alive", limit=1, claim=CLAIM)
        assert (taken.claimed_by, taken.tries) == ("alive", 2)
        # The worker that stalled can neither renew nor settle what it lost.
        assert tx.renew_dispatches("dead", [pid], claim=CLAIM) == []
        assert tx.settle_dispatch(pid, "dead", status=DispatchStatus.DONE, result="x") is None
        done = tx.settle_dispatch(pid, "alive", status=DispatchStatus.DONE, result="success")
    assert done is not None
    assert (done.status, done.claimed_by, done.last_result) == (
        DispatchStatus.DONE,
        None,
        "success",
    )
    with store.transaction() as tx:
        assert tx.claim_dispatches("alive", limit=1, claim=CLAIM) == []
        assert tx.next_dispatch_due() is None


def test_a_job_queued_again_waits_for_its_time(store: Store, clock: FakeClock):
    [pid] = _queued(store)
    with store.transaction() as tx:
        tx.claim_dispatches("w1", limit=1, claim=CLAIM)
        later = clock.now + timedelta(seconds=8)
        again = tx.settle_dispatch(
            pid, "w1", status=DispatchStatus.QUEUED, result="retryable", not_before=later
        )
    assert again is not None
    assert (again.not_before, again.claimed_by, again.tries) == (later, None, 1)
    with store.transaction() as tx:
        assert tx.next_dispatch_due() == later
        assert tx.claim_dispatches("w2", limit=1, claim=CLAIM) == []
    clock.advance(seconds=8)
    with store.transaction() as tx:
        [job] = tx.claim_dispatches("w2", limit=1, claim=CLAIM)
        assert job.tries == 2
        given_up = tx.settle_dispatch(
            pid, "w2", status=DispatchStatus.GIVEN_UP, result="attempts_exhausted"
        )
        assert given_up is not None
        assert [j.proposal_id for j in tx.dispatches(status=DispatchStatus.GIVEN_UP)] == [pid]
        assert tx.dispatches(status=DispatchStatus.QUEUED) == []
        assert tx.dispatches(tenant="other") == []


def test_bad_claims_are_refused(store: Store):
    [pid] = _queued(store)
    for bad in [
        {"worker": "", "limit": 1, "claim": CLAIM},
        {"worker": "w" * 300, "limit": 1, "claim": CLAIM},
        {"worker": "w", "limit": 0, "claim": CLAIM},
        {"worker": "w", "limit": True, "claim": CLAIM},
        {"worker": "w", "limit": 1, "claim": timedelta(0)},
    ]:
        with pytest.raises(InvalidInput), store.transaction() as tx:
            tx.claim_dispatches(bad["worker"], limit=bad["limit"], claim=bad["claim"])  # type: ignore[arg-type]
    with store.transaction(read_only=True) as tx:
        assert tx.get_dispatch(pid) is not None
        assert tx.get_dispatch(pid).tries == 0  # type: ignore[union-attr]


def test_a_commit_wakes_a_listener_and_a_rollback_does_not(store: Store):
    [pid] = _queued(store)
    with store.listen("dispatch") as listener:
        listener.wait(0)  # a PostgreSQL listener's first wake-up (it connected)

        def given_back_then_rolled_back() -> None:
            with store.transaction() as tx:
                tx.claim_dispatches("w1", limit=1, claim=CLAIM)
                tx.settle_dispatch(pid, "w1", status=DispatchStatus.QUEUED, result="given back")
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            given_back_then_rolled_back()
        assert listener.wait(0.2) is False
        with store.transaction() as tx:
            tx.claim_dispatches("w1", limit=1, claim=CLAIM)
            # Given back due now: other workers should look at once.
            tx.settle_dispatch(pid, "w1", status=DispatchStatus.QUEUED, result="given back")
        assert listener.wait(HANG) is True
        woken = threading.Event()

        def waiter() -> None:
            if listener.wait(HANG):
                woken.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        listener.wake()
        thread.join(HANG)
        assert woken.is_set()
    assert listener.listening is False


def test_notices_need_a_writing_transaction_and_a_known_channel(store: Store):
    with pytest.raises(StoreError, match="read-only"), store.transaction(read_only=True) as tx:
        tx.notify("dispatch")
    with pytest.raises(InvalidInput), store.transaction() as tx:
        tx.notify("everything")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.listen("everything")  # type: ignore[arg-type]


def test_a_listener_closes_with_its_store(store_url: str):
    opened = open_store(store_url)
    listener = opened.listen("dispatch")
    opened.close()
    assert listener.listening is False
    with pytest.raises(StoreError, match="closed"):
        opened.listen("dispatch")


def test_postgresql_wakes_a_listener_of_another_store_object(postgres_url: str):
    """Another store object has its own connections, as another process would."""
    writer, reader = open_store(postgres_url), open_store(postgres_url)
    try:
        with reader.listen("dispatch") as listener:
            assert listener.listening
            listener.wait(0)  # the wake-up of connecting
            _queued(writer)
            assert listener.wait(HANG) is True
    finally:
        writer.close()
        reader.close()


def test_a_version_4_store_queues_the_proposals_it_holds_approved(store_url: str):
    fourth = SqlStore(backend_for(store_url), migrations=list(MIGRATIONS[:4]))
    with fourth.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
    fourth.close()
    at = "2026-01-01T00:00:00.000000Z"
    rows = [("pr-approved", "op-1", "approved"), ("pr-pending", "op-2", "pending"),
            ("pr-dispatched", "op-3", "dispatched")]  # fmt: skip
    statements = []
    for proposal_id, operation_id, status in rows:
        statements.append(
            (
                "INSERT INTO proposals (id, tenant, task_id, proposer, environment, task, tool, "
                "contract_version, execution_action, params, params_digest, operation_id, "
                "decision_id, status, reason_codes, created_at, updated_at) VALUES (?, 'acme', "
                "'task-1', '{}', 'production', '{}', 'email.send', 1, 'email.send', '{}', ?, ?, "
                "NULL, ?, '[]', ?, ?)",
                [proposal_id, fixtures.DIGEST, operation_id, status, at, at],
            )
        )
    raw_sql(store_url, statements)
    upgraded = open_store(store_url)
    try:
        assert upgraded.schema_version() == SCHEMA_VERSION >= 5
        with upgraded.transaction(read_only=True) as tx:
            [job] = tx.dispatches()
        assert (job.proposal_id, job.status, job.tries) == ("pr-approved", "queued", 0)
        assert to_text(job.not_before) == at
    finally:
        upgraded.close()
