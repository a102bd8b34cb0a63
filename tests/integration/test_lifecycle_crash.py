"""A gateway process killed at each step of the life cycle, then recovered by another.

Issue #7: "after a crash anywhere between decision, run and record, restart
reconciles: no lost row, no second side effect (a test kills the process at each
step)". A child process (``tests/integration/lifecycle_children.py``: its own
embedded OPA, its own Gateway with a 0.5 s lease, the shared store) dispatches a
reviewed email or calls a write tool, and SIGKILLs itself at one step
(:data:`~tests.integration.lifecycle_children.CRASH_STEPS`). The provider records
every effect in a file, which survives the process. Then this process, over the
same store:

- checks what the crash left (the intent, if it was committed; the effect, if the
  provider got that far; the embedded OPA gone with its parent);
- runs :meth:`Gateway.reconcile` once the lease is over: a ``running`` operation
  becomes ``unknown`` (its outcome row is added, its reservation still held), and
  one with a lookup is looked up there and then, sending nothing: the receipt found
  settles it as a success, no trace as retryable (its budget released); the chain
  verifies;
- retries the same operation: a settled success is returned as it is, a retryable
  one is sent once, so the provider's file never holds a second effect, and a
  receipt found by the lookup is the one recorded. A ``not_idempotent`` tool without
  a lookup is not sent again at all: it stays unknown, its budget held.

Three paths, on both backends: a reviewed ``quote.prepare_send`` dispatched as
``quote.dispatch_reviewed`` (with a lookup), ``parcel.ship`` called directly (with
a lookup) and ``meter.tick`` called directly (without one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from capgate.adapters.fronts.session import AgentSession
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import open_store
from capgate.gateway.state.records import OperationStatus, ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from tests.hang import HANG_SECONDS
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_children import CRASH_STEPS, METER_REQUEST
from tests.integration.lifecycle_support import (
    EMAIL,
    MANAGER,
    QUOTE,
    QUOTE_TASK,
    SALES,
    TENANT,
    FileProvider,
    agent_request,
    make_gateway,
    operation_of,
    proposal_of,
    seed,
    wait_until,
)

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url

REPO = Path(__file__).resolve().parents[2]
LEASE_SECONDS = 0.5
#: Steps after which the provider has the effect.
EFFECT_DONE = {"after_effect", "before_record", "after_record"}
#: Steps after which the intent (a running operation) is committed.
INTENT_DONE = {"after_intent", "before_effect", "after_effect", "before_record", "after_record"}

SALES_REQUEST = agent_request(SALES, QUOTE_TASK)


@dataclass(frozen=True)
class Route:
    name: str
    tool: str  # the tool the agent uses
    action: str  # what runs at the provider
    lookup: bool


PATHS = {
    "dispatch": Route("dispatch", "quote.prepare_send", "quote.dispatch_reviewed", lookup=True),
    "call": Route("call", "parcel.ship", "parcel.ship", lookup=True),
    "call-without-lookup": Route("call-without-lookup", "meter.tick", "meter.tick", lookup=False),
}
CALL_PARAMS = {
    "parcel.ship": {"parcel_id": "p-7", "address": "1 Main St"},
    "meter.tick": {"label": "once"},
}


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    try:
        seed(opened)
        yield opened
    finally:
        opened.close()


def _pid_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie has stopped; its reaper is not us


def _run_child(spec: dict[str, Any]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.lifecycle_children", "crash", json.dumps(spec)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,  # the child must kill itself: a hang bound
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, (
        f"the child was to kill itself at {spec['step']} but exited {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def _reviewed_email(gateway: Gateway) -> ProposalRecord:
    session = AgentSession(gateway, SALES_REQUEST)
    session.call_tool("contact.verify_email", contact_id="c-42", email="ada@example.test")
    session.call_tool("consent.check", contact_id="c-42")
    quote = session.call_tool("quote.propose", **QUOTE)["proposal_id"]
    gateway.review(quote, MANAGER, "approved")
    assert gateway.dispatch(quote).ok
    proposal = gateway.call(SALES_REQUEST, "quote.prepare_send", dict(EMAIL))
    assert isinstance(proposal, ProposalRecord)
    gateway.review(proposal.id, MANAGER, "approved")
    return proposal


def _spent(store: Store) -> tuple[int, int]:
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    return budget.spent, budget.reserved


@pytest.mark.parametrize("step", CRASH_STEPS)
@pytest.mark.parametrize("path", list(PATHS))
def test_a_crash_at_any_step_loses_no_row_and_sends_nothing_twice(
    path: str,
    step: str,
    store: Store,
    store_url: str,
    lifecycle_catalogue: Catalogue,
    lifecycle_catalogue_dir: Path,
    lifecycle_sidecar: PolicySidecar,
    tmp_path: Path,
) -> None:
    route = PATHS[path]
    provider = FileProvider(tmp_path / "provider.jsonl")
    gateway = make_gateway(
        lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools(), SalesDesk().tools()
    )
    spec: dict[str, Any] = {
        "url": store_url,
        "catalogue": str(lifecycle_catalogue_dir),
        "effects": str(provider.path),
        "step": step,
        "lease_seconds": LEASE_SECONDS,
        "opa_pid_file": str(tmp_path / "opa.pid"),
    }
    proposal: ProposalRecord | None = None
    if route.name == "dispatch":
        proposal = _reviewed_email(gateway)
        operation_id = proposal.operation_id
        spec["proposal"] = proposal.id
    else:
        operation_id = f"op-crash-{path}"
        spec.update(tool=route.tool, params=CALL_PARAMS[route.tool], operation_id=operation_id)
    cost = lifecycle_catalogue.tools[route.tool].cost_units
    spent_before, _ = _spent(store)

    def retry() -> Outcome:
        if proposal is not None:
            return gateway.dispatch(proposal.id)
        answer = gateway.call(
            METER_REQUEST, route.tool, CALL_PARAMS[route.tool], operation_id=operation_id
        )
        assert isinstance(answer, Outcome)
        return answer

    _run_child(spec)

    # -- what the crash left ---------------------------------------------------------------
    opa_pid = int(Path(spec["opa_pid_file"]).read_text())
    wait_until(lambda: _pid_gone(opa_pid), what="the child's OPA to stop")
    effects = provider.entries(route.action)
    assert len(effects) == (1 if step in EFFECT_DONE else 0)
    operation = operation_of(store, operation_id)
    kinds = [row.kind for row in store.ledger(operation_id=operation_id)]
    if step in INTENT_DONE:
        assert operation is not None
        assert kinds.count("intent") == 1
        if step == "after_record":
            assert operation.status is OperationStatus.DONE
            assert kinds.count("outcome") == 1
        else:
            assert operation.status is OperationStatus.RUNNING
            assert "outcome" not in kinds
            lease_until = operation.lease_until
            assert lease_until is not None
            wait_until(lambda: _store_now(store) > lease_until, what="the lease to end")
    else:  # nothing of the claim was kept; the approval is still unused
        assert operation is None
        assert "intent" not in kinds
        if proposal is not None:
            assert proposal_of(store, proposal.id).status is ProposalStatus.APPROVED
        assert _spent(store) == (spent_before, 0)
    assert store.verify_ledger().ok

    # -- a new gateway process reconciles -----------------------------------------------------
    reconciled = gateway.reconcile()
    was_running = step in INTENT_DONE and step != "after_record"
    assert [r.operation_id for r in reconciled] == ([operation_id] if was_running else [])
    rows = store.ledger(operation_id=operation_id)
    unsettled = was_running and not route.lookup  # unknown, and nothing can tell
    if was_running:
        marked = [row for row in rows if row.kind == "outcome"][-1]
        assert (marked.outcome, marked.reason_codes) == ("unknown", ["reconciled"])
        settled = operation_of(store, operation_id)
        assert settled is not None
        assert settled.status is OperationStatus.DONE
        assert settled.outcome is not None
        if route.lookup:  # looked up at once: what the provider has settles it
            found = step in EFFECT_DONE
            assert (rows[-1].kind, rows[-1].principal) == ("lookup", "reconcile")
            assert rows[-1].outcome == ("success" if found else "retryable")
            assert settled.outcome["status"] == rows[-1].outcome
            assert len(provider.entries(route.action)) == (1 if found else 0)  # nothing sent
        else:
            assert settled.outcome["status"] == "unknown"
            assert settled.outcome["recovery"] == lifecycle_catalogue.tools[route.tool].recovery
    # An unknown outcome keeps its reservation until it is settled; nothing else holds one.
    assert _spent(store)[1] == (cost if unsettled else 0)
    assert store.verify_ledger().ok
    assert gateway.reconcile() == []

    # -- the retry ----------------------------------------------------------------------------
    outcome = retry()
    effects = provider.entries(route.action)
    assert len(effects) <= 1  # never a second side effect
    if not route.lookup and was_running:
        # It may or may not have happened, and nothing can tell: it stays unknown.
        assert outcome.status is OutcomeStatus.UNKNOWN
        assert outcome.recovery == lifecycle_catalogue.tools[route.tool].recovery
        assert len(effects) == (1 if step in EFFECT_DONE else 0)
    else:
        assert outcome.status is OutcomeStatus.SUCCESS
        [effect] = effects
        assert outcome.provider_receipt == effect["receipt"]  # the receipt found is recorded
        crashed_child_sent_it = step in EFFECT_DONE
        assert (effect["pid"] != os.getpid()) is crashed_child_sent_it
        stored = operation_of(store, operation_id)
        assert stored is not None
        assert stored.outcome is not None
        assert stored.outcome["provider_receipt"] == effect["receipt"]
        rows = store.ledger(operation_id=operation_id)
        last = [row for row in rows if row.kind in ("outcome", "lookup")][-1]
        assert (last.outcome, last.detail["receipt"]) == ("success", effect["receipt"])
    assert retry() == outcome  # and again: the same outcome, nothing sent
    assert len(provider.entries(route.action)) == len(effects)

    # -- no lost row ------------------------------------------------------------------------
    kinds = [row.kind for row in store.ledger(operation_id=operation_id)]
    assert kinds.count("intent") >= 1
    assert kinds.count("intent") == kinds.count("outcome")  # every attempt has its outcome
    assert store.verify_ledger().ok
    spent, reserved = _spent(store)
    # Charged once, whatever happened: spent, or still held by the unknown outcome.
    assert (spent, reserved) == ((spent_before, cost) if unsettled else (spent_before + cost, 0))
    if proposal is not None:
        assert proposal_of(store, proposal.id).status is ProposalStatus.DISPATCHED


def _store_now(store: Store) -> datetime:
    with store.transaction(read_only=True) as tx:
        return tx.now
