"""Execution workers as operators run them: ``capgate worker`` and ``capgate serve``.

Issue #19's "done means" for the worker, with real processes: each worker is a
``capgate worker`` of its own (its own embedded OPA, the shared store, the
provider's file), its tools and secrets named by the configuration file as a
deployment names them (:mod:`tests.integration.worker_support`).

- Two workers on PostgreSQL, 50 approved emails: each sent exactly once (the
  provider's file holds one line per operation), every proposal dispatched.
- The same with one worker killed (SIGKILL) inside the tool, after the mailbox took
  its email: the other finishes every proposal, the killed one's included (taken
  over once its claim and its operation's lease lapsed, and looked up, not sent
  again), and none is sent twice.
- SIGTERM while a dispatch is under way (both backends): the worker finishes it,
  then exits 0.
- ``capgate serve`` dispatches an approved proposal itself; with ``--no-worker`` it
  leaves the job queued.

No test waits for a time: each waits for a condition (a file, a log line, the
store), with a bound on a hang only.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state.records import DispatchStatus, ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from tests.integration import lifecycle_support as lifecycle_fixtures
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_support import (
    SALES,
    SECRETS,
    FileProvider,
    make_gateway,
    operation_of,
    proposal_of,
)
from tests.integration.worker_support import (
    EFFECTS_ENV,
    HANG,
    HOLD_ENV,
    all_settled,
    approve,
    emails,
    jobs,
    wait_for,
    write_worker_config,
)

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url
clock = lifecycle_fixtures.clock  # the system clock, as the worker processes'
store = lifecycle_fixtures.store

REPO = Path(__file__).resolve().parents[2]
CAPGATE = REPO / ".venv" / "bin" / "capgate"
SENT = "quote.dispatch_reviewed"
WORKER_SETTINGS: dict[str, Any] = {
    "poll_seconds": 0.2,
    "claim_seconds": 2,
    "concurrency": 4,
    "first_backoff_seconds": 0.2,
    "longest_backoff_seconds": 2,
}


@pytest.fixture
def effects(tmp_path: Path) -> FileProvider:
    return FileProvider(tmp_path / "provider.jsonl")


class Process:
    """A ``capgate`` command running in the background, its stderr in a file."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str], *, stdin: Any = None):
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [str(CAPGATE), *args],
                cwd=REPO,
                env=env,
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_line(self, text: str) -> None:
        wait_for(
            lambda: text in self.stderr or self.proc.poll() is not None, f"{text!r} in {self.log}"
        )
        assert text in self.stderr, self.stderr[-3000:]

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=HANG)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill_now(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _env(effects: FileProvider, hold: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CAPGATE_OPA_URL", "CAPGATE_STORE")}
    env["PYTHONPATH"] = str(REPO)
    env[EFFECTS_ENV] = str(effects.path)
    if hold is not None:
        env[HOLD_ENV] = str(hold)
    return env


StartWorker = Callable[..., Process]


@pytest.fixture
def start_worker(
    tmp_path: Path, store_url: str, lifecycle_catalogue_dir: Path, effects: FileProvider
) -> Iterator[StartWorker]:
    """Start a ``capgate worker`` on the test's store (``hold``: a hold folder, and
    worker settings); any left running at the end are killed."""
    started: list[Process] = []

    def start(*, hold: Path | None = None, **settings: Any) -> Process:
        n = len(started)
        config = write_worker_config(
            tmp_path / f"worker-{n}.yaml", **{**WORKER_SETTINGS, **settings}
        )
        args = ["worker", "--catalogue", str(lifecycle_catalogue_dir), "--store", store_url,
                "--config", str(config)]  # fmt: skip
        process = Process(args, tmp_path / f"worker-{n}.log", _env(effects, hold))
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill_now()


@pytest.fixture
def mail(lifecycle_catalogue: Catalogue, lifecycle_sidecar: PolicySidecar, store: Store) -> Gateway:
    """The test's own gateway, for proposing and reviewing (it dispatches nothing)."""
    return make_gateway(lifecycle_catalogue, lifecycle_sidecar.client, store)


def _no_secrets(*processes: Process) -> None:
    for process in processes:
        for secret in SECRETS.values():
            assert secret not in process.stderr


# -- two workers, PostgreSQL ------------------------------------------------------------


@dataclass
class Fleet:
    """Two ``capgate worker`` processes on PostgreSQL and 50 pending emails for them."""

    store: Store
    mail: Gateway
    proposals: list[ProposalRecord]
    start_worker: StartWorker

    def start(self, *, hold: Path | None = None) -> list[Process]:
        """Both workers, ready (listening), then every email approved."""
        pair = [self.start_worker(hold=hold), self.start_worker(hold=hold)]
        for process in pair:
            process.wait_for_line("capgate worker: worker-")
        approve(self.mail, self.proposals)
        return pair

    def sent_once_each(self, effects: FileProvider) -> list[dict[str, Any]]:
        sent = effects.entries(SENT)
        counts = Counter(entry["key"] for entry in sent)
        assert sorted(counts) == sorted(p.operation_id for p in self.proposals)
        assert set(counts.values()) == {1}, [key for key, n in counts.items() if n > 1]
        found = jobs(self.store)
        assert {(job.status, job.last_result) for job in found.values()} == {
            (DispatchStatus.DONE, "success")
        }
        for proposal in self.proposals:
            assert proposal_of(self.store, proposal.id).status is ProposalStatus.DISPATCHED
        assert self.store.verify_ledger().ok
        return sent


@pytest.fixture
def fleet(mail: Gateway, store: Store, start_worker: StartWorker) -> Fleet:
    return Fleet(store, mail, emails(mail, 50), start_worker)


POSTGRESQL_ONLY = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


@POSTGRESQL_ONLY
def test_two_workers_dispatch_50_approved_emails_each_exactly_once(
    fleet: Fleet, effects: FileProvider
) -> None:
    pair = fleet.start()
    wait_for(lambda: all_settled(fleet.store, 50), "every job settled")
    assert [process.stop() for process in pair] == [0, 0]
    fleet.sent_once_each(effects)
    intents = Counter(row.operation_id for row in fleet.store.ledger() if row.kind == "intent")
    assert len(intents) == 50
    assert set(intents.values()) == {1}
    for process in pair:
        assert "stopped (SIGTERM)" in process.stderr
    _no_secrets(*pair)


@POSTGRESQL_ONLY
def test_a_worker_killed_mid_dispatch_leaves_the_other_to_finish_sending_nothing_twice(
    fleet: Fleet, effects: FileProvider, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    pair = fleet.start(hold=hold)
    # The first email any of them sends is held inside the tool, after the mailbox
    # took it: the worker holding it is killed there.
    wait_for(lambda: (hold / "held").exists() and (hold / "held").read_text() != "", "a hold")
    held_pid = int((hold / "held").read_text())
    [victim] = [p for p in pair if p.proc.pid == held_pid]
    [survivor] = [p for p in pair if p is not victim]
    victim.kill_now()
    assert victim.proc.returncode == -signal.SIGKILL

    wait_for(lambda: all_settled(fleet.store, 50), "every job settled by the survivor")
    assert survivor.stop() == 0
    sent = fleet.sent_once_each(effects)
    # What the victim sent: each found by the survivor's lookup (the held one, whose
    # outcome the victim never recorded, among them), its receipt the mailbox's.
    by_victim = [entry for entry in sent if entry["pid"] == held_pid]
    assert by_victim
    operations = [operation_of(fleet.store, entry["key"]) for entry in by_victim]
    for entry, operation in zip(by_victim, operations, strict=True):
        assert operation is not None
        assert operation.outcome is not None
        assert operation.outcome["status"] == "success"
        assert operation.outcome["provider_receipt"] == entry["receipt"]
    assert any(operation is not None and operation.attempts >= 2 for operation in operations)
    _no_secrets(*pair)


# -- stopping, both backends ------------------------------------------------------------


def test_sigterm_lets_the_dispatch_under_way_finish(
    mail: Gateway,
    store: Store,
    start_worker: StartWorker,
    effects: FileProvider,
    tmp_path: Path,
) -> None:
    [proposal] = emails(mail, 1)
    hold = tmp_path / "hold"
    hold.mkdir()
    worker = start_worker(hold=hold, stop_seconds=HANG)
    worker.wait_for_line("capgate worker: worker-")
    approve(mail, [proposal])
    wait_for(lambda: (hold / "held").exists(), "the tool to hold")
    worker.proc.send_signal(signal.SIGTERM)
    (hold / "release").touch()
    # One signal only: a second one would stop the worker at once.
    assert worker.proc.wait(timeout=HANG) == 0
    assert "stopped (SIGTERM)" in worker.stderr
    assert len(effects.entries(SENT)) == 1
    job = jobs(store)[proposal.id]
    assert (job.status, job.last_result) == (DispatchStatus.DONE, "success")
    assert proposal_of(store, proposal.id).status is ProposalStatus.DISPATCHED


# -- capgate serve ----------------------------------------------------------------------


def _serve_config(path: Path) -> Path:
    config = write_worker_config(path, **WORKER_SETTINGS)
    document = yaml.safe_load(config.read_text())
    document["stdio"] = {
        "principal": SALES.model_dump(),
        "task": {"type": "customer_quote", "id": "task-quote-17"},
        "environment": "production",
    }
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    return config


@pytest.mark.parametrize("worker", [True, False], ids=["with-worker", "no-worker"])
def test_capgate_serve_dispatches_approved_proposals_unless_told_not_to(
    worker: bool,
    mail: Gateway,
    store: Store,
    store_url: str,
    lifecycle_catalogue_dir: Path,
    effects: FileProvider,
    tmp_path: Path,
) -> None:
    [proposal] = emails(mail, 1)
    config = _serve_config(tmp_path / "serve.yaml")
    args = ["serve", "--catalogue", str(lifecycle_catalogue_dir), "--store", store_url,
            "--config", str(config), "--stdio", *([] if worker else ["--no-worker"])]  # fmt: skip
    serve = Process(args, tmp_path / "serve.log", _env(effects), stdin=subprocess.PIPE)
    try:
        serve.wait_for_line("capgate serve: MCP over stdio")
        approve(mail, [proposal])
        if worker:
            wait_for(lambda: all_settled(store, 1), "the job settled")
        assert serve.proc.stdin is not None
        serve.proc.stdin.close()  # the MCP client went away: serve ends
        assert serve.proc.wait(timeout=HANG) == 0, serve.stderr[-3000:]
    finally:
        serve.kill_now()
    job = jobs(store)[proposal.id]
    if worker:
        assert (job.status, job.last_result) == (DispatchStatus.DONE, "success")
        assert len(effects.entries(SENT)) == 1
    else:
        assert (job.status, job.tries) == (DispatchStatus.QUEUED, 0)
        assert effects.entries(SENT) == []
        assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
