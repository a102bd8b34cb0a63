"""The execution worker: approved proposals dispatched with the facts of their moment.

An approval queues its proposal (in the review's own transaction: see
:mod:`capgate.gateway.state.sql.dispatches`). A :class:`Worker` takes its work from
that queue and hands each job to the one dispatch there is,
:meth:`~capgate.gateway.service.gateway.Gateway.dispatch`, which asks OPA again with
the current facts, consumes the approval and runs the operation at most once::

    review: approved ──▶ job queued (+ NOTIFY dispatch)
    worker ──claim (lease)──▶ Gateway.dispatch ──▶ success / refused ──▶ done
                                     │            retryable / unknown ─▶ queued again, backoff
                                     └─ deny ──▶ proposal blocked ─────▶ done
    worker dies ──▶ its claim lapses ──▶ another worker claims it ──▶ Gateway.dispatch
                                       (the operation is looked up before anything is sent)

Two locks guard against a second send, one inside the other. The **claim** of a job
(a lease in the store, renewed every third of it while the worker works on it) keeps
two workers from working on one proposal at once, so they do not race for it and
pile up refusals in the ledger. The **operation** (its intent, its own lease and its
lookup before any retry: :mod:`capgate.gateway.service.operations`) is what makes a
second send impossible, whatever happened to the claim: a worker that stalled past
its claim, or died mid-run, leaves an operation that the next dispatch waits for,
takes over once its lease is over, and looks up before it sends anything again.

**Retries.** A contract says whether repeating a call is safe (``idempotency``) and
how to recover (``recovery``), not how often to try; that is the worker's
:class:`WorkerSettings`. A ``retryable`` outcome (nothing happened) and an
``unknown`` one whose operation may be tried again (its adapter can look it up, or
the contract says repeating is safe) are queued again, due after a backoff that
doubles from ``first_backoff_seconds`` up to ``longest_backoff_seconds`` and is never
shorter than the outcome's ``retry_after_seconds``, until the operation has been
attempted ``max_attempts`` times; then the job is given up. An ``unknown`` outcome
that may not be tried again is given up at once: it stays unknown, its budget held,
until a lookup or a person settles it. Every retry is a new dispatch, so OPA is asked
again each time: an approval that expired meanwhile, or a connection revoked, blocks
the proposal instead.

**Failing closed.** A denied dispatch sends nothing and blocks the proposal
(``Gateway.dispatch`` does). An error before anything was sent (OPA unavailable, the
store busy, a secret that cannot be resolved) sends nothing and queues the job again
with backoff; an error that trying again cannot fix (the stored proposal no longer
fits the catalogue) gives it up. No error of one job stops the others, or the
worker. Log lines and the ledger carry ids, tool names, outcome statuses and error
codes, never parameters, results or secrets.

**Seams.** ``on_event`` is called with a :class:`WorkerEvent` (ids, tool, status,
receipt, reason codes; never content) once the store has recorded what the worker
did: where notices (webhooks, an inbox's live updates) attach.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CatalogueError,
    InvalidInput,
    ToolNotInCatalogue,
    UnknownProposal,
)
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.operations import may_try_again
from capgate.gateway.service.proposals import read_proposal
from capgate.gateway.service.recovery import read_operation
from capgate.gateway.state.records import (
    DispatchJob,
    DispatchStatus,
    LedgerEntry,
    OperationRecord,
    OperationStatus,
    ProposalRecord,
    ProposalStatus,
)
from capgate.gateway.state.store import Listener

if TYPE_CHECKING:
    from capgate.gateway.service.gateway import Gateway

__all__ = [
    "LISTEN_POLL_SECONDS",
    "BackoffSettings",
    "Worker",
    "WorkerEvent",
    "WorkerSettings",
    "backoff",
]

log = logging.getLogger("capgate.service")

#: How often a worker looks for due work while notices reach it (PostgreSQL): only a
#: backstop for a notice lost in between, since retries and lapsed claims are due at
#: times the worker reads from the queue.
LISTEN_POLL_SECONDS: Final = 10.0
#: The shortest wait between two looks (a due job another worker is claiming now).
_SHORTEST_WAIT: Final = 0.05
#: Errors that trying again cannot fix: the job is given up at once.
_PERMANENT: Final = (InvalidInput, ToolNotInCatalogue, UnknownProposal, CatalogueError)
#: Proposal statuses that leave a worker nothing to do.
_SETTLED: Final = {ProposalStatus.REJECTED: "proposal_rejected", ProposalStatus.BLOCKED: "blocked"}


class WorkerSettings(BaseModel):
    """How a worker works (``capgate serve`` and ``capgate worker`` read them from
    the configuration's ``worker`` section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: How often to look for due work when no notice can reach the worker: a SQLite
    #: store (notices do not cross processes), or PostgreSQL while its listening
    #: connection is down. An approval in the same process wakes it at once.
    poll_seconds: float = Field(default=0.5, gt=0, le=3600)
    #: How long a claim lasts unless renewed (a live worker renews it every third of
    #: it): how soon another worker takes over the work of one that died.
    claim_seconds: float = Field(default=30.0, gt=0, le=86400)
    #: Proposals one worker dispatches at the same time.
    concurrency: int = Field(default=4, ge=1, le=256)
    #: Attempts of one operation, after which a retryable outcome is given up.
    max_attempts: int = Field(default=5, ge=1, le=100)
    #: The wait before the first retry, doubled for each one after it...
    first_backoff_seconds: float = Field(default=1.0, gt=0, le=86400)
    #: ... up to this.
    longest_backoff_seconds: float = Field(default=300.0, gt=0, le=86400)
    #: How long stopping waits for the dispatches under way to end.
    stop_seconds: float = Field(default=30.0, ge=0, le=3600)

    @model_validator(mode="after")
    def _backoff_grows(self) -> WorkerSettings:
        if self.longest_backoff_seconds < self.first_backoff_seconds:
            raise ValueError("longest_backoff_seconds is below first_backoff_seconds")
        return self

    @property
    def claim(self) -> timedelta:
        return timedelta(seconds=self.claim_seconds)


class WorkerEvent(BaseModel):
    """What a worker did with one proposal, once the store has it: ids, never content.

    ``dispatched``: the operation ended ``success`` or ``refused`` (``status``, with
    the provider's receipt); ``blocked``: the dispatch was denied (``reason_codes``),
    nothing was sent; ``retrying``: queued again for ``next_attempt_at``;
    ``given_up``: no more tries (``reason_codes`` say why).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["dispatched", "blocked", "retrying", "given_up"]
    proposal_id: str
    tenant: str
    tool: str
    operation_id: str
    status: OutcomeStatus | None = None
    provider_receipt: str | None = None
    reason_codes: list[str] = Field(default_factory=list)
    #: The operation's attempts so far (the job's tries where no operation exists).
    attempt: int = 0
    next_attempt_at: datetime | None = None


class BackoffSettings(Protocol):
    """What :func:`backoff` reads: the worker's settings, and a webhook's
    (:class:`~capgate.gateway.service.notices.settings.TenantWebhook`)."""

    @property
    def first_backoff_seconds(self) -> float: ...

    @property
    def longest_backoff_seconds(self) -> float: ...


def backoff(settings: BackoffSettings, attempt: int, retry_after: float | None = None) -> float:
    """Seconds before retry number ``attempt`` (1 is the first): doubling from the
    first backoff up to the longest, never less than what the outcome asked for."""
    doubled = settings.first_backoff_seconds * float(2 ** min(max(attempt, 1) - 1, 60))
    wait = min(doubled, settings.longest_backoff_seconds)
    if retry_after is not None and retry_after > wait:
        wait = float(retry_after)
    return wait


def _worker_name() -> str:
    return f"worker-{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Worker:
    """Dispatches the queued approved proposals of ``gateway``'s store.

    Use it as a context manager (or :meth:`start` and :meth:`stop`): one thread
    claims due jobs, up to ``concurrency`` at a time, each dispatched on a thread of
    its own, and sleeps until a notice, a job's end, a retry's time or a poll wakes
    it. :meth:`stop` stops claiming, waits up to ``stop_seconds`` for the dispatches
    under way, and stops listening; the job of a dispatch still running then is
    given back (queued again at once), and the worker that takes it waits for the
    operation's lease and looks it up, as it does a dead worker's.
    :meth:`run_once` does one round in the caller's thread.
    """

    def __init__(
        self,
        gateway: Gateway,
        settings: WorkerSettings | None = None,
        *,
        name: str | None = None,
        on_event: Callable[[WorkerEvent], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.settings = settings or WorkerSettings()
        #: This worker's name in claims, logs and the ledger.
        self.name = name or _worker_name()
        self.on_event = on_event
        self._running: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: Listener | None = None

    # -- life ------------------------------------------------------------------------------

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("this worker was started already")
        self._listener = self.gateway.store.listen("dispatch")
        self._thread = threading.Thread(target=self._loop, name="capgate-worker", daemon=True)
        self._thread.start()
        log.info("worker %s started", self.name)

    @property
    def running(self) -> bool:
        """Whether this worker's thread is alive and it has not been told to stop."""
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stopping.is_set()

    def stop(self) -> None:
        """Stop claiming; wait up to ``stop_seconds`` for the dispatches under way, then
        give back the claims of any still running."""
        self._stopping.set()
        if self._listener is not None:
            self._listener.wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        deadline = time.monotonic() + self.settings.stop_seconds
        for thread in self._under_way():
            thread.join(max(deadline - time.monotonic(), 0.0))
        left = self._give_back()
        if self._listener is not None:
            self._listener.close()
        if left:
            log.warning(
                "worker %s stopped with %d dispatch(es) still running: their jobs are given "
                "back, and the worker that takes one waits for its operation's lease, then "
                "looks it up before anything is sent again",
                self.name,
                left,
            )
        else:
            log.info("worker %s stopped", self.name)

    def _give_back(self) -> int:
        """Queue the jobs of dispatches still running again, due now (their operations
        keep their own leases, so nobody sends them twice); how many there were."""
        with self._lock:
            running = [pid for pid, thread in self._running.items() if thread.is_alive()]
        if not running:
            return 0
        try:
            with self.gateway.store.transaction() as tx:
                for proposal_id in running:
                    tx.settle_dispatch(
                        proposal_id, self.name, status=DispatchStatus.QUEUED, result="given_back"
                    )
        except Exception as exc:  # the claims lapse by themselves
            log.warning("worker %s: could not give its jobs back (%s)", self.name,
                        getattr(exc, "code", type(exc).__name__))  # fmt: skip
        return len(running)

    def run_once(self) -> int:
        """Claim the due jobs (up to ``concurrency``) and dispatch each, one after the
        other, in this thread; how many were claimed."""
        jobs = self._claim(self.settings.concurrency)
        for job in jobs:
            self._work(job)
        return len(jobs)

    # -- the loop ----------------------------------------------------------------------------

    def _under_way(self) -> list[threading.Thread]:
        with self._lock:
            return [thread for thread in self._running.values() if thread.is_alive()]

    def _loop(self) -> None:
        listener = self._listener
        assert listener is not None
        renew_every = self.settings.claim_seconds / 3
        renew_at = time.monotonic() + renew_every
        while not self._stopping.is_set():
            wait = self.settings.poll_seconds
            try:
                self._start_due()
                if time.monotonic() >= renew_at:
                    self._renew()
                    renew_at = time.monotonic() + renew_every
                wait = self._wait_seconds(listener)
            except CapgateError as exc:
                log.warning("worker %s: looking for work failed (%s)", self.name, exc.code)
            except Exception as exc:  # never let the loop die
                log.warning(
                    "worker %s: looking for work failed (%s)", self.name, type(exc).__name__
                )
            listener.wait(min(wait, max(renew_at - time.monotonic(), 0.0)))

    def _claim(self, limit: int) -> list[DispatchJob]:
        with self.gateway.store.transaction() as tx:
            return tx.claim_dispatches(self.name, limit=limit, claim=self.settings.claim)

    def _start_due(self) -> None:
        with self._lock:
            free = self.settings.concurrency - len(self._running)
        if free <= 0 or self._stopping.is_set():
            return
        for job in self._claim(free):
            thread = threading.Thread(
                target=self._work, args=(job,), name="capgate-dispatch", daemon=True
            )
            with self._lock:
                self._running[job.proposal_id] = thread
            thread.start()

    def _wait_seconds(self, listener: Listener) -> float:
        """Until the next due job, at most a poll (a long one while notices come)."""
        longest = LISTEN_POLL_SECONDS if listener.listening else self.settings.poll_seconds
        with self._lock:
            full = len(self._running) >= self.settings.concurrency
        if full:  # a job that ends wakes the loop
            return longest
        with self.gateway.store.transaction(read_only=True) as tx:
            due, now = tx.next_dispatch_due(), tx.now
        if due is None:
            return longest
        return min(longest, max((due - now).total_seconds(), _SHORTEST_WAIT))

    def _renew(self) -> None:
        with self._lock:
            held = list(self._running)
        if not held:
            return
        with self.gateway.store.transaction() as tx:
            renewed = tx.renew_dispatches(self.name, held, claim=self.settings.claim)
        for lost in sorted(set(held) - set(renewed)):
            log.warning("worker %s: the claim of proposal=%s was taken over", self.name, lost)

    # -- one job -------------------------------------------------------------------------------

    def _work(self, job: DispatchJob) -> None:
        try:
            self._dispatch(job)
        except BaseException as exc:  # one job's failure never stops the others
            log.warning(
                "worker %s: proposal=%s failed in the worker (%s); queued again",
                self.name,
                job.proposal_id,
                getattr(exc, "code", type(exc).__name__),
            )
            try:
                self._settle(
                    job, DispatchStatus.QUEUED, "worker_error", backoff(self.settings, job.tries)
                )
            except Exception as again:
                log.warning(
                    "worker %s: proposal=%s left to its claim's end (%s)",
                    self.name,
                    job.proposal_id,
                    type(again).__name__,
                )
            if not isinstance(exc, Exception):
                raise
        finally:
            with self._lock:
                self._running.pop(job.proposal_id, None)
            if self._listener is not None:
                self._listener.wake()  # a free slot: look for more

    def _dispatch(self, job: DispatchJob) -> None:
        proposal = read_proposal(self.gateway.store, job.proposal_id)
        if proposal.status in _SETTLED:
            self._settle(job, DispatchStatus.DONE, _SETTLED[proposal.status])
            return
        if proposal.status is ProposalStatus.PENDING:  # queued only on approval
            self._give_up(job, proposal, ["proposal_not_approved"])
            return
        try:
            outcome = self.gateway.dispatch(proposal.id)
        except CapabilityViolation as denial:
            self._denied(job, proposal, denial)
        except _PERMANENT as exc:
            self._give_up(job, proposal, [exc.code])
        except CapgateError as exc:
            self._later(job, proposal, exc.code)
        except Exception as exc:  # an adapter or a bug: fail closed, try again later
            self._later(job, proposal, type(exc).__name__)
        else:
            self._outcome(job, proposal, outcome)

    def _outcome(self, job: DispatchJob, proposal: ProposalRecord, outcome: Outcome) -> None:
        operation = read_operation(self.gateway.store, proposal.tenant, proposal.operation_id)
        attempt = operation.attempts if operation is not None else job.tries
        status = outcome.status
        if status in (OutcomeStatus.SUCCESS, OutcomeStatus.REFUSED):
            if self._settle(job, DispatchStatus.DONE, status.value):
                log.info(
                    "worker %s: dispatched proposal=%s operation=%s: %s",
                    self.name,
                    proposal.id,
                    proposal.operation_id,
                    status.value,
                )
                self._emit("dispatched", proposal, status=status, attempt=attempt,
                           provider_receipt=outcome.provider_receipt)  # fmt: skip
            return
        if _running_elsewhere(operation):
            # Another runner holds the operation (a stalled or dead worker whose
            # lease is not over yet): ask again once it may be over; no attempt used.
            self._retry(job, proposal, status, attempt,
                        backoff(self.settings, job.tries, outcome.retry_after_seconds))  # fmt: skip
            return
        if status is OutcomeStatus.UNKNOWN and not self._may_retry(proposal):
            self._give_up(job, proposal, ["outcome_unknown"], status, attempt=attempt)
            return
        if attempt >= self.settings.max_attempts:
            self._give_up(job, proposal, ["attempts_exhausted"], status, attempt=attempt)
            return
        self._retry(job, proposal, status, attempt,
                    backoff(self.settings, attempt, outcome.retry_after_seconds))  # fmt: skip

    def _denied(
        self, job: DispatchJob, proposal: ProposalRecord, denial: CapabilityViolation
    ) -> None:
        codes = sorted(denial.reason_codes)
        current = read_proposal(self.gateway.store, proposal.id)
        if current.status is ProposalStatus.BLOCKED:
            if self._settle(job, DispatchStatus.DONE, _codes("blocked", codes)):
                log.info("worker %s: proposal=%s blocked: %s", self.name, proposal.id,
                         ",".join(codes))  # fmt: skip
                self._emit("blocked", proposal, reason_codes=codes, attempt=job.tries)
            return
        operation = read_operation(self.gateway.store, proposal.tenant, proposal.operation_id)
        if current.status is ProposalStatus.DISPATCHED and not _unsettled(operation):
            # A concurrent dispatch took it (its approval is used): its outcome, or
            # its run, is the one; the next look returns it.
            self._retry(job, proposal, None, job.tries, backoff(self.settings, job.tries))
            return
        # The retry of an unknown outcome was denied: it stays unknown until a lookup
        # (which needs no allow) or a person settles it.
        self._give_up(job, proposal, ["dispatch_denied", *codes])

    def _may_retry(self, proposal: ProposalRecord) -> bool:
        contract = self.gateway.catalogue.contract_at(proposal.tool, proposal.contract_version)
        if contract is None:
            return False
        action = proposal.execution_action
        adapter = self.gateway.registry.adapter_for(action)
        return may_try_again(OutcomeStatus.UNKNOWN, contract, adapter, action)

    # -- settling ------------------------------------------------------------------------------

    def _later(self, job: DispatchJob, proposal: ProposalRecord, code: str) -> None:
        """An error before anything was sent: queued again, the try not an attempt."""
        wait = backoff(self.settings, job.tries)
        if self._settle(job, DispatchStatus.QUEUED, f"error:{code}", wait):
            log.warning(
                "worker %s: proposal=%s not dispatched (%s); trying again in %.1f s",
                self.name,
                proposal.id,
                code,
                wait,
            )

    def _retry(
        self,
        job: DispatchJob,
        proposal: ProposalRecord,
        status: OutcomeStatus | None,
        attempt: int,
        wait: float,
    ) -> None:
        result = status.value if status is not None else "waiting"
        settled = self._settle(job, DispatchStatus.QUEUED, result, wait)
        if settled is not None:
            log.info(
                "worker %s: proposal=%s %s after attempt %d; trying again in %.1f s",
                self.name,
                proposal.id,
                result,
                attempt,
                wait,
            )
            self._emit("retrying", proposal, status=status, attempt=attempt,
                       next_attempt_at=settled.not_before)  # fmt: skip

    def _give_up(
        self,
        job: DispatchJob,
        proposal: ProposalRecord,
        codes: list[str],
        status: OutcomeStatus | None = None,
        *,
        attempt: int | None = None,
    ) -> None:
        """No more tries: the job given up and a ledger row saying why, together."""
        result = ",".join(codes)
        with self.gateway.store.transaction() as tx:
            settled = tx.settle_dispatch(
                job.proposal_id, self.name, status=DispatchStatus.GIVEN_UP, result=result
            )
            if settled is None:
                return
            tx.append(
                LedgerEntry(
                    kind="worker",
                    tenant=proposal.tenant,
                    principal=self.name,
                    tool=proposal.tool,
                    contract_version=proposal.contract_version,
                    operation_id=proposal.operation_id,
                    proposal_id=proposal.id,
                    outcome=DispatchStatus.GIVEN_UP.value,
                    reason_codes=codes,
                    detail={"tries": job.tries, **({"status": status.value} if status else {})},
                )
            )
        log.warning("worker %s: gave up proposal=%s (%s)", self.name, proposal.id, result)
        self._emit("given_up", proposal, status=status, reason_codes=codes,
                   attempt=attempt if attempt is not None else job.tries)  # fmt: skip

    def _settle(
        self, job: DispatchJob, status: DispatchStatus, result: str, wait: float | None = None
    ) -> DispatchJob | None:
        """End this worker's claim; None when it was taken over (or given back) meanwhile."""
        with self.gateway.store.transaction() as tx:
            due = None if wait is None else tx.now + timedelta(seconds=wait)
            settled = tx.settle_dispatch(
                job.proposal_id, self.name, status=status, result=result, not_before=due
            )
        if settled is None:
            log.info("worker %s: proposal=%s was taken over meanwhile", self.name, job.proposal_id)
        return settled

    def _emit(self, kind: str, proposal: ProposalRecord, **fields: object) -> None:
        if self.on_event is None:
            return
        try:
            event = WorkerEvent.model_validate(
                {
                    "kind": kind,
                    "proposal_id": proposal.id,
                    "tenant": proposal.tenant,
                    "tool": proposal.tool,
                    "operation_id": proposal.operation_id,
                    **fields,
                }
            )
            self.on_event(event)
        except Exception as exc:  # a listener's failure is its own
            log.warning("worker %s: the event hook failed (%s)", self.name, type(exc).__name__)


def _codes(prefix: str, codes: list[str]) -> str:
    return f"{prefix}:{','.join(codes)}" if codes else prefix


def _running_elsewhere(operation: OperationRecord | None) -> bool:
    return operation is not None and operation.status is OperationStatus.RUNNING


def _unsettled(operation: OperationRecord | None) -> bool:
    """Whether the operation ended unknown (a lookup, not a dispatch, settles it)."""
    if operation is None or operation.outcome is None:
        return False
    return operation.outcome.get("status") == OutcomeStatus.UNKNOWN.value
