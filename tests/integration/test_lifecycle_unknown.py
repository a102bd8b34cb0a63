"""Uncertain outcomes are settled by looking, never by permission to act again.

Issue 17, defects 3 and 4. An ``unknown`` payment or email (the provider took the
request and the answer was lost, a write tool timed out) may have happened. Before,
only a retry that passed a fresh execute allow ever looked it up, so once the
approval expired or the connection was revoked it stayed unknown for good, and a
keyed write that timed out was called ``retryable`` with its budget handed back.
These tests hold the gateway to the general property, on SQLite and a real
PostgreSQL, with a real OPA:

- an unknown outcome keeps its budget reservation until it is settled, whatever
  the tool's idempotency;
- :meth:`Gateway.look_up` and :meth:`Gateway.reconcile` settle it by the adapter's
  lookup alone, after the approval expired, the connection was revoked, or both,
  sending nothing; the ledger records each lookup and who asked;
- what the lookup finds decides: a receipt is the success (budget spent, evidence
  recorded), no trace is ``retryable`` (budget released, the operation may run
  again under a new allow), a failing lookup leaves it unknown and waits longer;
- a proposal with the same content and recipient as an unsettled operation says so.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from capgate.adapters.fronts.session import AgentSession
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.errors import CapabilityViolation, InvalidInput
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import UnknownOperation
from capgate.gateway.state.records import OperationStatus
from capgate.gateway.state.store import Store
from capgate.gateway.state.times import to_text
from tests.integration import lifecycle_support as lifecycle_fixtures
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_support import (
    CONTROLLER,
    FINANCE,
    METER_TASK,
    PAY_TASK,
    PAYMENT,
    SALES,
    TENANT,
    FileProvider,
    ShiftClock,
    agent_request,
    evidence_of,
    operation_of,
    proposal_of,
    raw_execute,
)

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url
clock = lifecycle_fixtures.clock
store = lifecycle_fixtures.store
desk = lifecycle_fixtures.desk
gateway = lifecycle_fixtures.gateway
provider = lifecycle_fixtures.provider
metered = lifecycle_fixtures.metered

FINANCE_REQUEST = agent_request(FINANCE, PAY_TASK)
METER_REQUEST = agent_request(SALES, METER_TASK)
SHIPMENT = {"parcel_id": "p-1", "address": "1 Main St"}


def _budget(store: Store) -> tuple[int, int]:
    with store.transaction(read_only=True) as tx:
        budget = tx.budget(TENANT)
    return budget.spent, budget.reserved


def _rows(store: Store, operation_id: str) -> list[tuple[str, str | None]]:
    return [(row.kind, row.outcome) for row in store.ledger(operation_id=operation_id)]


def _unknown_payment(gateway: Gateway, desk: SalesDesk, *, ttl: timedelta | None = None) -> str:
    """A reviewed payment the bank took whose answer was lost; its proposal id."""
    finance = AgentSession(gateway, FINANCE_REQUEST)
    finance.call_tool("invoice.check_approval", invoice_id="inv-9")
    proposal_id = str(finance.call_tool("payment.execute", **PAYMENT)["proposal_id"])
    gateway.review(proposal_id, CONTROLLER, "approved", ttl=ttl)
    desk.lose_answer_once.add("payment.execute")
    assert gateway.dispatch(proposal_id).status is OutcomeStatus.UNKNOWN
    return proposal_id


def test_an_unknown_payment_keeps_its_budget_held_until_it_is_settled(
    gateway: Gateway, store: Store, desk: SalesDesk, sales_catalogue: Catalogue
) -> None:
    cost = sales_catalogue.tools["payment.execute"].cost_units
    proposal_id = _unknown_payment(gateway, desk)
    assert _budget(store) == (0, cost)  # neither handed back nor counted twice
    operation_id = proposal_of(store, proposal_id).operation_id
    settled = gateway.look_up(TENANT, operation_id, by="ops")
    assert settled is not None
    assert settled.status is OutcomeStatus.SUCCESS
    assert settled.provider_receipt == desk.payments[operation_id]["payment_id"]
    assert _budget(store) == (cost, 0)


@pytest.mark.parametrize("incident", ["approval expired", "connection revoked", "both"])
def test_reconcile_settles_an_unknown_payment_whatever_changed_since(
    gateway: Gateway,
    store: Store,
    desk: SalesDesk,
    store_url: str,
    sales_catalogue: Catalogue,
    incident: str,
) -> None:
    proposal_id = _unknown_payment(gateway, desk)
    operation_id = proposal_of(store, proposal_id).operation_id
    paid = desk.entered.count("payment.execute")
    assert list(desk.payments) == [operation_id]  # the bank has it
    # The likely reactions to an incident: the approval runs out (as OPA's clock sees
    # it: the review's expiry is moved into the past), the bank connection is revoked.
    if incident in ("approval expired", "both"):
        past = to_text(datetime.now(UTC) - timedelta(hours=1))
        changed = raw_execute(
            store_url,
            "UPDATE reviews SET expires_at = ? WHERE proposal_id = ?",
            (past, proposal_id),
        )
        assert changed == 1
    if incident in ("connection revoked", "both"):
        gateway.revoke_connection(TENANT, "bank", by="ops")
    # Acting again is denied now, and sends nothing ...
    with pytest.raises(CapabilityViolation):
        gateway.dispatch(proposal_id)
    assert desk.entered.count("payment.execute") == paid
    # ... but looking is not acting: the reconciler settles it from the bank's record.
    changed = gateway.reconcile()
    assert [record.operation_id for record in changed] == [operation_id]
    stored = operation_of(store, operation_id)
    assert stored is not None
    assert stored.status is OperationStatus.DONE
    assert stored.outcome is not None
    assert stored.outcome["status"] == "success"
    assert stored.outcome["provider_receipt"] == desk.payments[operation_id]["payment_id"]
    assert desk.entered.count("payment.execute") == paid  # nothing was sent
    assert len(desk.payments) == 1
    lookup = store.ledger(operation_id=operation_id)[-1]
    assert (lookup.kind, lookup.outcome, lookup.principal) == ("lookup", "success", "reconcile")
    assert lookup.detail["receipt"] == stored.outcome["provider_receipt"]
    cost = sales_catalogue.tools["payment.execute"].cost_units
    assert _budget(store) == (cost, 0)
    assert gateway.reconcile() == []  # settled once
    assert store.verify_ledger().ok


def test_no_trace_at_the_provider_settles_it_as_retryable_and_releases_the_budget(
    metered: Gateway, store: Store, provider: FileProvider
) -> None:
    # The tool timed out before the provider got anything: unknown, since the gateway
    # cannot tell; the lookup finds no trace, so it did not happen.
    def time_out(tool: str) -> None:
        raise TimeoutError("the provider did not answer in time")

    provider.before_effect = time_out
    first = metered.call(METER_REQUEST, "parcel.ship", SHIPMENT, operation_id="op-ship-1")
    assert isinstance(first, Outcome)
    assert first.status is OutcomeStatus.UNKNOWN  # a write: never "retryable" on a guess
    assert _budget(store) == (0, 1)
    provider.before_effect = None

    settled = metered.look_up(TENANT, "op-ship-1", by="ops")
    assert settled is not None
    assert settled.status is OutcomeStatus.RETRYABLE
    assert "no trace" in (settled.error or "")
    assert provider.entries("parcel.ship") == []  # looking sent nothing
    assert _budget(store) == (0, 0)
    assert _rows(store, "op-ship-1")[-1] == ("lookup", "retryable")
    # Nothing happened, so the same operation may run now, once.
    again = metered.call(METER_REQUEST, "parcel.ship", SHIPMENT, operation_id="op-ship-1")
    assert isinstance(again, Outcome)
    assert again.ok
    assert len(provider.entries("parcel.ship")) == 1
    assert _budget(store) == (1, 0)


def test_a_failing_lookup_leaves_it_unknown_and_waits_longer_each_time(
    metered: Gateway, store: Store, provider: FileProvider, clock: ShiftClock
) -> None:
    provider.lose_answer_once.add("parcel.ship")
    first = metered.call(METER_REQUEST, "parcel.ship", SHIPMENT, operation_id="op-ship-2")
    assert isinstance(first, Outcome)
    assert first.status is OutcomeStatus.UNKNOWN
    entries = len(provider.entries("parcel.ship"))

    broken = FileProvider(provider.path)  # the same records, a lookup that fails
    original = provider.find

    def failing(tool: str, key: str) -> str | None:
        raise ConnectionError("the provider's lookup API is down")

    provider.find = failing  # type: ignore[method-assign]
    looked = metered.look_up(TENANT, "op-ship-2", by="ops")
    assert looked is not None
    assert looked.status is OutcomeStatus.UNKNOWN
    assert looked.retry_after_seconds == 30.0
    assert "lookup failed" in (looked.error or "")
    assert _rows(store, "op-ship-2")[-1] == ("lookup", "unknown")
    assert _budget(store) == (0, 1)  # still held
    # The reconciler waits that long before it asks again ...
    assert metered.reconcile() == []
    clock.offset = timedelta(seconds=31)
    assert [record.operation_id for record in metered.reconcile()] == ["op-ship-2"]
    stored = operation_of(store, "op-ship-2")
    assert stored is not None
    assert stored.outcome is not None
    assert stored.outcome["retry_after_seconds"] == 60.0  # ... and longer after each failure
    # Once the provider answers, the receipt settles it; nothing was ever sent again.
    provider.find = original  # type: ignore[method-assign]
    clock.offset = timedelta(seconds=100)
    metered.reconcile()
    stored = operation_of(store, "op-ship-2")
    assert stored is not None
    assert stored.outcome is not None
    assert stored.outcome["status"] == "success"
    assert len(provider.entries("parcel.ship")) == entries == len(broken.entries("parcel.ship"))
    assert _budget(store) == (1, 0)


def test_an_operation_without_a_lookup_stays_unknown_and_held(
    metered: Gateway, store: Store, provider: FileProvider
) -> None:
    provider.lose_answer_once.add("meter.tick")
    first = metered.call(METER_REQUEST, "meter.tick", {"label": "x"}, operation_id="op-tick")
    assert isinstance(first, Outcome)
    assert first.status is OutcomeStatus.UNKNOWN
    rows = _rows(store, "op-tick")
    assert metered.look_up(TENANT, "op-tick", by="ops") == first  # nothing can tell
    assert metered.reconcile() == []
    assert _rows(store, "op-tick") == rows  # no row for a lookup that did not happen
    assert _budget(store) == (0, 1)
    assert len(provider.entries("meter.tick")) == 1


def test_look_up_is_for_the_operations_own_tenant_and_needs_who_asks(
    metered: Gateway, store: Store, provider: FileProvider
) -> None:
    provider.lose_answer_once.add("parcel.ship")
    metered.call(METER_REQUEST, "parcel.ship", SHIPMENT, operation_id="op-ship-3")
    with store.transaction() as tx:
        tx.put_tenant("globex", budget_class="unlimited", budget_limit=None)
    with pytest.raises(UnknownOperation):
        metered.look_up("globex", "op-ship-3", by="ops")
    with pytest.raises(InvalidInput):
        metered.look_up(TENANT, "op-ship-3", by="")
    stored = operation_of(store, "op-ship-3")
    assert stored is not None
    assert stored.outcome is not None
    assert stored.outcome["status"] == "unknown"  # untouched by either


def test_a_proposal_with_the_content_of_an_unsettled_payment_says_so(
    gateway: Gateway, store: Store, desk: SalesDesk
) -> None:
    proposal_id = _unknown_payment(gateway, desk)
    unsettled = proposal_of(store, proposal_id).operation_id
    # The agent, told "unknown", proposes the same payment again: a new operation that
    # may pay twice. The proposal records it, the agent and the reviewer see it.
    finance = AgentSession(gateway, FINANCE_REQUEST)
    again = finance.call_tool("payment.execute", **PAYMENT)
    assert again["unsettled_twins"] == [unsettled]
    proposal = proposal_of(store, str(again["proposal_id"]))
    assert proposal.unsettled_twins == [unsettled]
    row = store.ledger(proposal_id=proposal.id)[0]
    assert (row.kind, row.detail["unsettled_twins"]) == ("proposal", [unsettled])
    # Other content, or the first one settled, is no twin.
    other = finance.call_tool("payment.execute", **{**PAYMENT, "amount_cents": 1})
    assert "unsettled_twins" not in other
    gateway.reconcile()
    third = finance.call_tool("payment.execute", **PAYMENT)
    assert "unsettled_twins" not in third
    assert evidence_of(store, PAY_TASK["id"]) >= {"invoice_approved"}


def test_a_timed_out_keyed_write_is_unknown_and_its_retry_keeps_the_key(
    metered: Gateway, store: Store, provider: FileProvider, lifecycle_catalogue: Catalogue
) -> None:
    # An idempotent_with_key write whose provider call timed out after the provider
    # acted: the tool says nothing more, so it is unknown, with the recovery, and the
    # budget held, not "retryable" with the budget handed back. Retried under the same
    # operation id, it is sent under the same key, and the provider acts once.
    provider.time_out_once.add("ledger.post")
    first = metered.call(METER_REQUEST, "ledger.post", {"entry": "e-1"}, operation_id="op-post")
    assert isinstance(first, Outcome)
    assert first.status is OutcomeStatus.UNKNOWN
    assert first.recovery == lifecycle_catalogue.tools["ledger.post"].recovery
    assert "TimeoutError" in (first.error or "")
    assert _budget(store) == (0, 1)
    second = metered.call(METER_REQUEST, "ledger.post", {"entry": "e-1"}, operation_id="op-post")
    assert isinstance(second, Outcome)
    assert second.ok
    assert provider.keys == ["op-post", "op-post"]  # the same key both times
    [effect] = provider.entries("ledger.post")
    assert second.provider_receipt == effect["receipt"]
    assert _budget(store) == (1, 0)  # one operation, one charge
