"""What the execution worker's tests share, and what their worker processes load.

- :func:`emails` proposes reviewed customer emails (``quote.prepare_send``) with
  distinct content, the task's evidence recorded first, as the earlier steps of the
  sales life cycle would have; :func:`approve` approves them as a sales manager.
- :class:`Events` collects a worker's :class:`~capgate.gateway.service.worker.WorkerEvent`
  and lets a test wait for them (on a condition, never on a clock).
- The entry points a ``capgate worker`` process names in its configuration file
  (:func:`write_worker_config`): :class:`ProviderTools`, the
  :class:`~tests.integration.lifecycle_support.FileProvider` whose file is
  ``$CAPGATE_TEST_EFFECTS``, and :func:`credentials`, the tenant's secrets. With
  ``$CAPGATE_TEST_HOLD`` set to a folder, the first effect of all the processes
  holds its tool after the effect is written, until a ``release`` file appears
  there: the one process that wrote the ``held`` file (its pid inside) is the one
  to kill mid-dispatch.

Kept apart from the test modules so a worker process imports only this, capgate and
:mod:`tests.integration.lifecycle_support`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

from capgate.adapters.tools.in_process import InProcessTools
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.worker import WorkerEvent
from capgate.gateway.state.records import DispatchJob, DispatchStatus, ProposalRecord
from capgate.gateway.state.store import Store
from tests.hang import HANG_SECONDS
from tests.integration.lifecycle_support import (
    EMAIL,
    MANAGER,
    QUOTE_TASK,
    SALES,
    SECRETS,
    FileProvider,
    agent_request,
    record_quote_evidence,
)

EFFECTS_ENV: Final = "CAPGATE_TEST_EFFECTS"
HOLD_ENV: Final = "CAPGATE_TEST_HOLD"
#: Bounds a hang only: every wait is for a condition (the suite's one hang bound).
HANG: Final = HANG_SECONDS
SALES_REQUEST: Final = agent_request(SALES, QUOTE_TASK)


def emails(gateway: Gateway, count: int, *, tag: str = "mail") -> list[ProposalRecord]:
    """``count`` pending email proposals, each with its own subject (so its own digest)."""
    with gateway.store.transaction() as tx:
        record_quote_evidence(tx, QUOTE_TASK["id"], source="test:setup")
    proposals = []
    for n in range(count):
        made = gateway.call(
            SALES_REQUEST,
            "quote.prepare_send",
            {**EMAIL, "subject": f"Your quote for opp-17 ({tag} {n})"},
        )
        assert isinstance(made, ProposalRecord), made
        proposals.append(made)
    return proposals


def approve(gateway: Gateway, proposals: list[ProposalRecord]) -> None:
    for proposal in proposals:
        gateway.review(proposal.id, MANAGER, "approved")


def jobs(store: Store) -> dict[str, DispatchJob]:
    with store.transaction(read_only=True) as tx:
        return {job.proposal_id: job for job in tx.dispatches()}


def all_settled(store: Store, count: int) -> bool:
    found = jobs(store)
    return len(found) == count and all(
        job.status is not DispatchStatus.QUEUED for job in found.values()
    )


def wait_for(check: Callable[[], bool], what: str, timeout: float = HANG) -> None:
    """Wait until ``check()`` holds (a hang bound only, never a measure of speed)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Events:
    """A worker's events, in order; :meth:`wait` for a condition on them."""

    def __init__(self) -> None:
        self.seen: list[WorkerEvent] = []
        self._changed = threading.Condition()

    def __call__(self, event: WorkerEvent) -> None:
        with self._changed:
            self.seen.append(event)
            self._changed.notify_all()

    def of(self, proposal_id: str) -> list[WorkerEvent]:
        with self._changed:
            return [event for event in self.seen if event.proposal_id == proposal_id]

    def kinds(self, proposal_id: str) -> list[str]:
        return [event.kind for event in self.of(proposal_id)]

    def wait(self, check: Callable[[list[WorkerEvent]], bool], what: str) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: check(self.seen), timeout=HANG):
                raise AssertionError(f"timed out waiting for {what}: {self.seen}")

    def wait_final(self, proposal_id: str) -> WorkerEvent:
        """The proposal's first event after which the worker has nothing left to do."""
        final = {"dispatched", "blocked", "given_up"}
        self.wait(
            lambda seen: any(e.proposal_id == proposal_id and e.kind in final for e in seen),
            f"the end of {proposal_id}",
        )
        return next(e for e in self.of(proposal_id) if e.kind in final)


# -- what worker processes load ---------------------------------------------------------


def _hold(folder: Path) -> Callable[[str], None]:
    def hold(tool: str) -> None:
        try:
            fd = os.open(folder / "held", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return  # another effect holds already: this one goes on
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        while not (folder / "release").exists():
            time.sleep(0.05)

    return hold


class ProviderTools:
    """``tools: tests.integration.worker_support:ProviderTools``."""

    def tools(self) -> InProcessTools:
        provider = FileProvider(os.environ[EFFECTS_ENV])
        hold = os.environ.get(HOLD_ENV)
        if hold:
            provider.after_effect = _hold(Path(hold))
        return provider.tools()


def credentials() -> StaticCredentials:
    """``credentials: tests.integration.worker_support:credentials``."""
    return StaticCredentials(SECRETS)


def write_worker_config(path: Path, **worker: Any) -> Path:
    """A configuration file for ``capgate worker`` (0600): the provider, the secrets,
    a short operation lease, and ``worker`` settings."""
    document = {
        "tools": f"{__name__}:ProviderTools",
        "credentials": f"{__name__}:credentials",
        "upstreams": "",
        "lease_seconds": 2,
        "worker": worker,
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
    return path
