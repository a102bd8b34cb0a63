"""Approved to dispatched: how soon the execution worker sends what a reviewer approves.

Run by ``make bench`` after the scripts above; with ``--append FILE`` the results
are added to that Markdown file (docs/benchmarks.md) as one section. Issue 19's goal:
p50 under 1 s on SQLite, under 200 ms on PostgreSQL.

For each backend, a reviewer's process (this one: its own embedded OPA, the demo's
sales catalogue and tools) proposes a quote and approves it after a random pause
(``PAUSE_LONGEST`` at most), ``ROUNDS`` times one after the other, and a worker
dispatches each:

- **another process**: a ``capgate worker`` started as an operator would (its own
  OPA, the same store, default settings), which is how a deployment that runs the
  worker apart works, and also how ``capgate serve``'s worker meets an approval
  given with ``capgate proposals approve``: on SQLite it finds the job at its next
  poll (``poll_seconds``, 0.5 s), on PostgreSQL a ``NOTIFY`` wakes it;
- **the approving process**: a :class:`~capgate.gateway.service.worker.Worker` in this
  process (a review inside ``capgate serve``, say), woken by the commit itself.

The latency of one proposal is read from the ledger, by the store's clock (one
machine, one clock): from the review's row (the approval, committed in that
transaction) to the outcome's row (the dispatch recorded), so it includes the
worker waking, claiming, asking OPA again and running the tool. PostgreSQL is the
tests' throw-away server (``tests/integration/postgres_server.py``) unless
``--postgres URL`` names one (its database is used as it is: give an empty one).

Benchmarks are scripts, not tests: CI times nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compose_scaling import pct
from benchmarks.whole_catalogue import load, publish
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus, Reviewer
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.credentials import EnvironmentCredentials, StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.service.worker import Worker
from capgate.gateway.state import open_store
from capgate.gateway.state.records import DispatchStatus, ProposalRecord
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry

ROUNDS: Final = 40
#: The longest pause before an approval (drawn at random, the same in every run): one
#: sent at a random moment of the worker's poll, not just after its last dispatch.
PAUSE_LONGEST: Final = 0.5
#: Bounds a hang only.
HANG: Final = 300.0
REPO: Final = Path(__file__).resolve().parents[1]
CAPGATE: Final = REPO / ".venv" / "bin" / "capgate"
GOALS_MS: Final = {"sqlite": 1000.0, "postgresql": 200.0}
TENANT: Final = "acme"
#: The CRM connection's stand-in secret (the demo's tools only check there is one).
SECRET: Final = "bench-crm-secret"  # noqa: S105
AGENT: Final = AgentRequest.model_validate(
    {
        "principal": {"agent": "sales-bot", "role": "sales", "tenant": TENANT},
        "task": {
            "type": "customer_quote",
            "id": "task-bench",
            "linked_resources": [{"type": "opportunity", "id": "opp-17"}],
        },
        "environment": "production",
    }
)
MANAGER: Final = Reviewer(
    id="maria", role="sales_manager", tenant=TENANT, authenticated_by="test:fixture"
)


def _seed(store: Store) -> None:
    with store.transaction() as tx:
        tx.put_tenant(TENANT, budget_class="unlimited", budget_limit=None)
        tx.put_connection(TENANT, "crm", status=ConnectionStatus.ACTIVE, account="acme@crm")


def _round(gateway: Gateway, store: Store, n: int, pause: random.Random) -> float:
    """Propose, approve, wait until dispatched; the approval-to-outcome ms."""
    params = {"opportunity_id": "opp-17", "amount_cents": 100_000 + n, "currency": "EUR"}
    proposal = gateway.call(AGENT, "quote.propose", params)
    assert isinstance(proposal, ProposalRecord), proposal
    # Reviewers do not approve in step with a worker's polls.
    time.sleep(pause.uniform(0, PAUSE_LONGEST))
    gateway.review(proposal.id, MANAGER, "approved")
    deadline = time.monotonic() + HANG
    while True:
        with store.transaction(read_only=True) as tx:
            job = tx.get_dispatch(proposal.id)
        if job is not None and job.status is not DispatchStatus.QUEUED:
            break
        if time.monotonic() > deadline:
            sys.exit(f"bench: proposal {proposal.id} was not dispatched")
        time.sleep(0.01)  # sequencing only: the figure is read from the ledger
    rows = store.ledger(proposal_id=proposal.id)
    approved = next(r.at for r in rows if r.kind == "review" and r.outcome == "approved")
    recorded = next(r.at for r in rows if r.kind == "outcome")
    if job.last_result != "success":
        sys.exit(f"bench: proposal {proposal.id} ended {job.last_result}")
    return (recorded - approved).total_seconds() * 1000


@contextlib.contextmanager
def _worker_process(url: str, catalogue_dir: Path, folder: Path) -> Iterator[None]:
    config = folder / "worker.yaml"
    document = {
        "tools": "capgate.demo.tools.sales_desk:SalesDesk",
        "credentials": "environment",
        "upstreams": "",
    }
    config.write_text(yaml.safe_dump(document))
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("CAPGATE_OPA_URL", "CAPGATE_STORE")}
    env[EnvironmentCredentials().variable(TENANT, "crm")] = SECRET
    log = folder / "worker.log"
    args = ["worker", "--catalogue", str(catalogue_dir), "--store", url, "--config", str(config)]
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [str(CAPGATE), *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + HANG
        while "capgate worker: worker-" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"bench: capgate worker did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=HANG)


def _measure(
    url: str, catalogue: Catalogue, catalogue_dir: Path, sidecar: PolicySidecar
) -> dict[str, list[float]]:
    store = open_store(url)
    _seed(store)
    credentials = StaticCredentials({(TENANT, "crm"): SECRET})
    gateway = Gateway(
        catalogue, sidecar.client, ToolRegistry(SalesDesk().tools()), store,
        credentials=credentials,
    )  # fmt: skip
    samples: dict[str, list[float]] = {}

    pause = random.Random(19)

    def rounds() -> list[float]:
        return [_round(gateway, store, n, pause) for n in range(ROUNDS)]

    try:
        with (
            tempfile.TemporaryDirectory(prefix="capgate-bench-worker-") as folder,
            _worker_process(url, catalogue_dir, Path(folder)),
        ):
            _round(gateway, store, -1, pause)  # the worker's first dispatch warms it up
            samples["another process"] = rounds()
        with Worker(gateway):
            _round(gateway, store, -2, pause)
            samples["the approving process"] = rounds()
    finally:
        store.close()
    return samples


@contextlib.contextmanager
def _postgres(given: str | None) -> Iterator[str]:
    if given is not None:
        yield given
        return
    from tests.integration.postgres_server import start_postgres, stop_postgres

    server = start_postgres()
    try:
        yield server.url(server.create_database())
    finally:
        stop_postgres(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--append", type=Path, help="add the results to this Markdown file")
    parser.add_argument("--postgres", metavar="URL", help="an empty PostgreSQL database to use")
    args = parser.parse_args()
    before = load()
    print(f"load average {before}", flush=True)
    catalogue_dir = demo_catalogue_dir("sales")
    catalogue = load_catalogue(catalogue_dir)
    results: dict[str, dict[str, list[float]]] = {}
    with PolicySidecar(catalogue, timeout=10.0) as sidecar:
        with tempfile.TemporaryDirectory(prefix="capgate-bench-sqlite-") as folder:
            results["sqlite"] = _measure(
                f"sqlite://{folder}/state.db", catalogue, catalogue_dir, sidecar
            )
        with _postgres(args.postgres) as url:
            results["postgresql"] = _measure(url, catalogue, catalogue_dir, sidecar)
    after = load()
    rows = []
    for backend, by_where in results.items():
        for where, samples in by_where.items():
            p50 = pct(samples, 50)
            rows.append(
                f"| {backend} | {where} | {p50:.0f} | {pct(samples, 90):.0f} | "
                f"{max(samples):.0f} | {GOALS_MS[backend]:.0f} | {p50 / GOALS_MS[backend]:.2f}x |"
            )
    lines = [
        "",
        "## Approved to dispatched: the execution worker",
        "",
        "Written by `benchmarks/worker_latency.py`, which `make bench` runs after the "
        f"scripts above; load average {before} before, {after} after.",
        "",
        f"{ROUNDS} quotes per backend and worker, each proposed and approved by one "
        "process and dispatched by a worker with default settings (`WorkerSettings`: "
        "SQLite polled every 0.5 s), one after the other, each approved after a pause of "
        f"up to {PAUSE_LONGEST:g} s (at random: a reviewer does not approve in step with a "
        "worker's polls). The latency of each is from its approval's ledger row to its "
        "outcome's, by the store's clock. A worker in another process is a `capgate "
        "worker`; one in the approving process is woken by the commit itself.",
        "",
        "| backend | worker in | p50 ms | p90 ms | slowest ms | goal p50 ms | p50 / goal |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ]
    publish(lines, args.append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
