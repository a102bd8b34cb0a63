"""The execution worker against a real OPA and a real store (SQLite and PostgreSQL).

Issue #19, item 2: approved proposals are dispatched by a worker, with the facts of
their moment, once. In this process (a :class:`~capgate.gateway.service.worker.Worker`
over the life-cycle gateway, whose mailbox is a
:class:`~tests.integration.lifecycle_support.FileProvider` that counts real sends):

- an approval wakes the worker, which dispatches the email once; the ledger shows
  proposal, review, dispatch, intent and outcome, and the queue's job is done;
- a retryable outcome is tried again after its backoff (never before what the
  provider asked for), then succeeds; one that stays retryable is given up after
  ``max_attempts``, with a ledger row saying so;
- a denied dispatch (the mailbox revoked after the approval) blocks the proposal and
  sends nothing; so does a retry denied after a retryable first attempt;
- a claim left by a worker that died mid-dispatch lapses, another worker takes the
  job over, and the operation is looked up, not sent again;
- an error on one proposal (a resolver that fails once) does not stop the others, is
  tried again, and leaves no secret or content in the logs;
- stopping waits for the dispatch under way to finish, and gives back the job of one
  that outlasts the wait (whoever takes it finds the outcome: nothing sent twice).

Two workers in two processes, and one killed mid-dispatch, are in
``test_worker_processes.py``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from capgate.gateway.errors import CredentialUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus
from capgate.gateway.model.outcomes import OutcomeStatus, ToolRetryable
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.worker import Worker, WorkerSettings
from capgate.gateway.state.records import DispatchStatus, OperationStatus, ProposalStatus
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import Secret
from tests.integration import lifecycle_support as lifecycle_fixtures
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_support import (
    EMAIL,
    SECRETS,
    TENANT,
    FileProvider,
    kinds,
    make_gateway,
    operation_of,
    proposal_of,
)
from tests.integration.worker_support import (
    HANG,
    Events,
    approve,
    emails,
    jobs,
    wait_for,
)

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url
clock = lifecycle_fixtures.clock
store = lifecycle_fixtures.store
provider = lifecycle_fixtures.provider

REPO = Path(__file__).resolve().parents[2]
#: Short backoffs: the tests wait on events, never on these.
QUICK = WorkerSettings(
    poll_seconds=0.1, claim_seconds=5, first_backoff_seconds=0.1, longest_backoff_seconds=1
)
SENT = "quote.dispatch_reviewed"


@pytest.fixture
def mail(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
) -> Gateway:
    """The life-cycle gateway: its mailbox writes each email sent to ``provider``."""
    return make_gateway(
        lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools(),
        lease=timedelta(seconds=2), duplicate_wait=30.0,
    )  # fmt: skip


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def worker(mail: Gateway, events: Events) -> Iterator[Worker]:
    with Worker(mail, QUICK, name="worker-test", on_event=events) as running:
        yield running


def test_an_approved_email_is_dispatched_by_the_worker_once(
    mail: Gateway, store: Store, provider: FileProvider, worker: Worker, events: Events
) -> None:
    [proposal] = emails(mail, 1)
    assert jobs(store) == {}  # pending: nothing for a worker yet
    approve(mail, [proposal])
    final = events.wait_final(proposal.id)
    assert (final.kind, final.status, final.attempt) == ("dispatched", OutcomeStatus.SUCCESS, 1)
    [sent] = provider.entries(SENT)
    assert final.provider_receipt == sent["receipt"]
    assert sent["key"] == proposal.operation_id
    assert proposal_of(store, proposal.id).status is ProposalStatus.DISPATCHED
    job = jobs(store)[proposal.id]
    assert (job.status, job.tries, job.last_result, job.claimed_by) == (
        DispatchStatus.DONE, 1, "success", None,
    )  # fmt: skip
    assert kinds(store, proposal_id=proposal.id) == [
        ("proposal", "pending"),
        ("review", "approved"),
        ("dispatch", "dispatched"),
        ("intent", "running"),
        ("outcome", "success"),
    ]
    assert store.verify_ledger().ok
    # Nothing more to do, however often it looks.
    assert worker.run_once() == 0
    assert len(provider.entries(SENT)) == 1


def test_a_retryable_outcome_is_tried_again_after_its_backoff(
    mail: Gateway, store: Store, provider: FileProvider, worker: Worker, events: Events
) -> None:
    [proposal] = emails(mail, 1)
    failures = [ToolRetryable("the mail provider is busy", retry_after_seconds=0.3)]

    def busy_once(tool: str) -> None:
        if failures:
            raise failures.pop()

    provider.before_effect = busy_once
    approve(mail, [proposal])
    final = events.wait_final(proposal.id)
    assert [(e.kind, e.status, e.attempt) for e in events.of(proposal.id)] == [
        ("retrying", OutcomeStatus.RETRYABLE, 1),
        ("dispatched", OutcomeStatus.SUCCESS, 2),
    ]
    assert len(provider.entries(SENT)) == 1
    operation = operation_of(store, proposal.operation_id)
    assert operation is not None
    assert operation.attempts == 2
    # Never before what the provider asked for (0.3 s, above the first backoff).
    retry = events.of(proposal.id)[0]
    [first_outcome] = [
        row for row in store.ledger(proposal_id=proposal.id)
        if row.kind == "outcome" and row.outcome == "retryable"
    ]  # fmt: skip
    assert retry.next_attempt_at is not None
    assert retry.next_attempt_at >= first_outcome.at + timedelta(seconds=0.3)
    second_intent = [r for r in store.ledger(proposal_id=proposal.id) if r.kind == "intent"][1]
    assert second_intent.at >= retry.next_attempt_at
    assert final.provider_receipt is not None


def test_an_outcome_that_stays_retryable_is_given_up_after_max_attempts(
    mail: Gateway, store: Store, provider: FileProvider, events: Events
) -> None:
    [proposal] = emails(mail, 1)

    def always_busy(tool: str) -> None:
        raise ToolRetryable("the mail provider is busy")

    provider.before_effect = always_busy
    settings = QUICK.model_copy(update={"max_attempts": 3})
    with Worker(mail, settings, on_event=events):
        approve(mail, [proposal])
        final = events.wait_final(proposal.id)
    assert (final.kind, final.reason_codes, final.attempt) == (
        "given_up",
        ["attempts_exhausted"],
        3,
    )
    assert events.kinds(proposal.id) == ["retrying", "retrying", "given_up"]
    assert provider.entries(SENT) == []
    operation = operation_of(store, proposal.operation_id)
    assert operation is not None
    assert operation.attempts == 3
    job = jobs(store)[proposal.id]
    assert (job.status, job.last_result) == (DispatchStatus.GIVEN_UP, "attempts_exhausted")
    [row] = [r for r in store.ledger(proposal_id=proposal.id) if r.kind == "worker"]
    assert (row.outcome, row.reason_codes) == ("given_up", ["attempts_exhausted"])
    # Nothing happened, and the budget says so.
    with store.transaction(read_only=True) as tx:
        assert tx.budget(TENANT).reserved == 0


def test_a_dispatch_denied_after_the_approval_blocks_the_proposal(
    mail: Gateway, store: Store, provider: FileProvider, events: Events
) -> None:
    [proposal] = emails(mail, 1)
    approve(mail, [proposal])
    with store.transaction() as tx:  # revoked in the store alone: the worker finds out
        tx.set_connection_status(TENANT, "sales_mailbox", ConnectionStatus.REVOKED)
    with Worker(mail, QUICK, on_event=events):
        final = events.wait_final(proposal.id)
    assert (final.kind, final.reason_codes) == ("blocked", ["connection_revoked"])
    assert provider.entries(SENT) == []
    blocked = proposal_of(store, proposal.id)
    assert (blocked.status, blocked.reason_codes) == (
        ProposalStatus.BLOCKED,
        ["connection_revoked"],
    )
    assert jobs(store)[proposal.id].status is DispatchStatus.DONE
    assert operation_of(store, proposal.operation_id) is None  # nothing even began


def test_a_retry_denied_after_a_retryable_attempt_blocks_the_proposal(
    mail: Gateway, store: Store, provider: FileProvider, worker: Worker, events: Events
) -> None:
    [proposal] = emails(mail, 1)

    def busy_and_revoked(tool: str) -> None:
        # While this attempt fails, an operator revokes the mailbox: the retry is
        # asked of OPA again, with the facts of its moment.
        with store.transaction() as tx:
            tx.set_connection_status(TENANT, "sales_mailbox", ConnectionStatus.REVOKED)
        raise ToolRetryable("the mail provider is busy")

    provider.before_effect = busy_and_revoked
    approve(mail, [proposal])
    final = events.wait_final(proposal.id)
    assert events.kinds(proposal.id) == ["retrying", "blocked"]
    assert final.reason_codes == ["connection_revoked"]
    assert provider.entries(SENT) == []
    assert proposal_of(store, proposal.id).status is ProposalStatus.BLOCKED


def test_a_claim_left_by_a_dead_worker_is_taken_over_and_looked_up_not_sent_again(
    mail: Gateway,
    store: Store,
    store_url: str,
    provider: FileProvider,
    events: Events,
    lifecycle_catalogue_dir: Path,
    tmp_path: Path,
) -> None:
    [proposal] = emails(mail, 1)
    approve(mail, [proposal])
    # A worker claims the job, starts the dispatch, and dies inside the tool after the
    # mailbox took the email: its claim and its operation are left for others.
    with store.transaction() as tx:
        [claimed] = tx.claim_dispatches("worker-dead", limit=1, claim=timedelta(seconds=2))
    assert claimed.proposal_id == proposal.id
    spec = {
        "url": store_url,
        "catalogue": str(lifecycle_catalogue_dir),
        "effects": str(provider.path),
        "step": "after_effect",
        "lease_seconds": 2,
        "opa_pid_file": str(tmp_path / "opa.pid"),
        "proposal": proposal.id,
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.lifecycle_children", "crash", json.dumps(spec)],
        cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG,
        check=False,
    )  # fmt: skip
    assert done.returncode < 0, done.stderr[-3000:]
    [sent] = provider.entries(SENT)
    running = operation_of(store, proposal.operation_id)
    assert running is not None
    assert running.status is OperationStatus.RUNNING

    with Worker(mail, QUICK, name="worker-alive", on_event=events):
        final = events.wait_final(proposal.id)
    assert (final.kind, final.status) == ("dispatched", OutcomeStatus.SUCCESS)
    assert final.provider_receipt == sent["receipt"]  # found by the lookup
    assert len(provider.entries(SENT)) == 1  # never sent twice
    settled = operation_of(store, proposal.operation_id)
    assert settled is not None
    assert settled.attempts == 2
    job = jobs(store)[proposal.id]
    assert (job.status, job.tries) == (DispatchStatus.DONE, 2)
    rows = store.ledger(proposal_id=proposal.id)
    assert [(r.kind, r.detail.get("attempt")) for r in rows if r.kind == "intent"] == [
        ("intent", 1),
        ("intent", 2),
    ]
    assert store.verify_ledger().ok


class _FailsOnce:
    """A resolver whose first answer fails with a message that holds a secret."""

    def __init__(self) -> None:
        self.inner = StaticCredentials(SECRETS)
        self.failed = False

    def resolve(self, tenant: str, alias: str) -> Secret:
        if not self.failed:
            self.failed = True
            raise RuntimeError(f"vault timed out reading {SECRETS[(TENANT, 'sales_mailbox')]}")
        return self.inner.resolve(tenant, alias)


def test_an_error_on_one_proposal_does_not_stop_the_others(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
    events: Events,
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = make_gateway(
        lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools(),
        credentials=_FailsOnce(),
    )  # fmt: skip
    proposals = emails(flaky, 3)
    caplog.set_level(logging.DEBUG, logger="capgate")
    with Worker(flaky, QUICK.model_copy(update={"concurrency": 1}), on_event=events):
        approve(flaky, proposals)
        finals = [events.wait_final(p.id) for p in proposals]
    assert [f.kind for f in finals] == ["dispatched"] * 3
    assert len(provider.entries(SENT)) == 3
    retried = [p.id for p in proposals if "retrying" in events.kinds(p.id)]
    assert retried == []  # an error is not an outcome: no event until it is dispatched
    tries = sorted(job.tries for job in jobs(store).values())
    assert tries == [1, 1, 2]
    text = caplog.text
    assert "RuntimeError" in text
    for secret in SECRETS.values():
        assert secret not in text
    assert EMAIL["body"] not in text
    assert "Your quote for opp-17" not in text


def test_an_unresolvable_secret_is_tried_again_not_sent(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
) -> None:
    nothing = make_gateway(
        lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools(),
        credentials=StaticCredentials({}),
    )  # fmt: skip
    [proposal] = emails(nothing, 1)
    approve(nothing, [proposal])
    worker = Worker(nothing, QUICK)
    assert worker.run_once() == 1
    job = jobs(store)[proposal.id]
    assert job.status is DispatchStatus.QUEUED
    assert job.last_result == f"error:{CredentialUnavailable.code}"
    assert job.not_before > job.updated_at  # after a backoff
    assert provider.entries(SENT) == []


def _held_in_the_tool(
    mail: Gateway, provider: FileProvider, events: Events, stop_seconds: float
) -> tuple[Worker, str, threading.Event]:
    """A started worker whose dispatch of one approved email is held inside the tool
    until the event returned is set; and the proposal's id."""
    [proposal] = emails(mail, 1)
    entered, release = threading.Event(), threading.Event()

    def held(tool: str) -> None:
        entered.set()
        release.wait(HANG)

    provider.before_effect = held
    worker = Worker(mail, QUICK.model_copy(update={"stop_seconds": stop_seconds}), on_event=events)
    worker.start()
    approve(mail, [proposal])
    assert entered.wait(HANG)
    return worker, proposal.id, release


def test_stopping_waits_for_the_dispatch_under_way(
    mail: Gateway, store: Store, provider: FileProvider, events: Events
) -> None:
    worker, proposal_id, release = _held_in_the_tool(mail, provider, events, HANG)
    stopping = threading.Thread(target=worker.stop)
    stopping.start()
    release.set()  # the tool finishes while the worker is stopping
    stopping.join(HANG)
    assert not stopping.is_alive()
    assert events.kinds(proposal_id) == ["dispatched"]
    assert len(provider.entries(SENT)) == 1
    assert jobs(store)[proposal_id].status is DispatchStatus.DONE


def test_stopping_gives_back_a_dispatch_that_outlasts_the_wait(
    mail: Gateway, store: Store, provider: FileProvider, events: Events
) -> None:
    worker, proposal_id, release = _held_in_the_tool(mail, provider, events, 0)
    worker.stop()  # waits for nothing: the job is given back, the tool still running
    given_back = jobs(store)[proposal_id]
    assert (given_back.status, given_back.claimed_by) == (DispatchStatus.QUEUED, None)
    assert given_back.last_result == "given_back"
    proposal = proposal_of(store, proposal_id)
    release.set()
    wait_for(
        lambda: (
            (op := operation_of(store, proposal.operation_id)) is not None
            and op.status is OperationStatus.DONE
        ),
        "the run that was under way to end",
    )
    assert events.of(proposal.id) == []  # its worker had given the job back
    # Whoever takes the job next finds the outcome: nothing is sent again.
    assert Worker(mail, QUICK, on_event=events).run_once() == 1
    assert events.kinds(proposal.id) == ["dispatched"]
    assert len(provider.entries(SENT)) == 1
    assert jobs(store)[proposal.id].status is DispatchStatus.DONE
