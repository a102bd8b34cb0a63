"""The metrics' gauges read from the store, on both backends: proposals waiting,
the dispatch queue and how late it runs, budgets reserved and spent. Times are the
store's clock (a fake one here), so every expected value is exact."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capgate.adapters.fronts.metrics import GatewayMetrics
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.declarations import declared_codes
from capgate.gateway.state.records import DispatchStatus, ProposalStatus
from capgate.gateway.state.store import Store
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_support import FakeClock, proposal

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock


def gauges(metrics: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name.startswith(("capgate_proposal", "capgate_dispatch", "capgate_budget"))
    }


def metrics_of(store: Store, *, tenant_labels: bool = False) -> GatewayMetrics:
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    return GatewayMetrics(
        catalogue, store, reason_codes=declared_codes(), tenant_labels=tenant_labels
    )


def test_an_empty_store_reports_zeros(store: Store):
    found = gauges(metrics_of(store))
    assert found[("capgate_proposal_oldest_pending_seconds", ())] == 0
    assert found[("capgate_dispatch_lag_seconds", ())] == 0
    assert found[("capgate_dispatch_jobs", (("status", "queued"),))] == 0
    assert found[("capgate_budget_reserved_units", ())] == 0
    assert found[("capgate_budget_spent_units", ())] == 0


def test_waits_the_queue_and_budgets_as_the_store_has_them(store: Store, clock: FakeClock):
    with store.transaction() as tx:
        for tenant in ("acme", "globex"):
            tx.put_tenant(tenant, budget_class="standard", budget_limit=100)
        tx.insert_proposal(proposal(tx.now, id="pr-wait", operation_id="op-wait"))
        assert tx.reserve_budget("acme", None, 7)
        assert tx.reserve_budget("globex", None, 5)
    clock.advance(seconds=40)
    with store.transaction() as tx:
        tx.settle_budget("globex", None, 5, spent=True)
        for n in (1, 2):
            tx.insert_proposal(
                proposal(tx.now, id=f"pr-{n}", operation_id=f"op-{n}",
                         status=ProposalStatus.APPROVED)
            )  # fmt: skip
            tx.queue_dispatch(f"pr-{n}")
    clock.advance(seconds=25)
    metrics = metrics_of(store)
    found = gauges(metrics)
    assert found[("capgate_proposals", (("state", "pending"),))] == 1
    assert found[("capgate_proposals", (("state", "approved"),))] == 2
    assert found[("capgate_proposal_oldest_pending_seconds", ())] == pytest.approx(65)
    assert found[("capgate_dispatch_jobs", (("status", "queued"),))] == 2
    assert found[("capgate_dispatch_lag_seconds", ())] == pytest.approx(25)
    assert found[("capgate_budget_reserved_units", ())] == 7
    assert found[("capgate_budget_spent_units", ())] == 5

    # A worker holding both jobs is working, not lagging; once its claim has run out
    # (it died) the jobs wait again, from the claim's end.
    with store.transaction() as tx:
        assert len(tx.claim_dispatches("w-1", limit=5, claim=timedelta(seconds=30))) == 2
    assert gauges(metrics)[("capgate_dispatch_lag_seconds", ())] == 0
    clock.advance(seconds=45)
    assert gauges(metrics)[("capgate_dispatch_lag_seconds", ())] == pytest.approx(15)
    with store.transaction() as tx:
        for job in tx.claim_dispatches("w-2", limit=5, claim=timedelta(seconds=30)):
            tx.settle_dispatch(job.proposal_id, "w-2", status=DispatchStatus.DONE, result="ok")
    found = gauges(metrics)
    assert found[("capgate_dispatch_lag_seconds", ())] == 0
    assert found[("capgate_dispatch_jobs", (("status", "done"),))] == 2

    labelled = gauges(metrics_of(store, tenant_labels=True))
    assert labelled[("capgate_budget_reserved_units", (("tenant", "acme"),))] == 7
    assert labelled[("capgate_budget_reserved_units", (("tenant", "globex"),))] == 0
    assert labelled[("capgate_budget_spent_units", (("tenant", "globex"),))] == 5
