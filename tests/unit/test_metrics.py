"""The gateway's Prometheus metrics: bounded labels, counts, the store's gauges."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capgate.adapters.fronts.metrics import GatewayMetrics
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.enforce.dispatcher import DecisionEvent
from capgate.gateway.opa.declarations import declared_codes
from capgate.gateway.state import open_store


@pytest.fixture
def metrics(tmp_path: Path):
    store = open_store(str(tmp_path / "state.db"))
    try:
        yield GatewayMetrics(
            load_catalogue(demo_catalogue_dir("sales")), store, reason_codes=declared_codes()
        )
    finally:
        store.close()


def samples(metrics: GatewayMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_decisions_are_counted_by_question_answer_and_reason(metrics):
    metrics.observe(DecisionEvent(kind="compose", agent="a", allow=True, visible=("x",)))
    for _ in range(3):
        metrics.observe(
            DecisionEvent(
                kind="execute",
                agent="a",
                allow=False,
                tool="contact.read",
                reason_codes=("subject_out_of_scope", "role_not_granted"),
            )
        )
    counted = samples(metrics, "capgate_decisions_total")
    assert counted[(("allow", "true"), ("question", "compose"), ("reason", "none"))] == 1
    deny = (("allow", "false"), ("question", "execute"))
    assert counted[(*deny, ("reason", "subject_out_of_scope"))] == 3
    assert counted[(*deny, ("reason", "role_not_granted"))] == 3


def test_label_values_come_from_the_catalogue_and_the_policies_only(metrics):
    metrics.observe(
        DecisionEvent(
            kind="execute",
            agent="a",
            allow=True,
            tool="an agent's made-up tool c-42",
            reason_codes=("not-a-declared-code",),
            status="success",
        )
    )
    metrics.observe(
        DecisionEvent(kind="execute", agent="a", allow=True, tool="contact.read", status="x")
    )
    text = metrics.exposition().decode()
    assert "c-42" not in text
    assert "not-a-declared-code" not in text
    outcomes = samples(metrics, "capgate_tool_outcomes_total")
    assert outcomes[(("status", "success"), ("tool", "other"))] == 1
    assert outcomes[(("status", "other"), ("tool", "contact.read"))] == 1
    reasons = samples(metrics, "capgate_decisions_total")
    assert reasons[(("allow", "true"), ("question", "execute"), ("reason", "other"))] == 1


def test_proposals_are_counted_by_state_from_the_store(metrics):
    states = samples(metrics, "capgate_proposals")
    assert states[(("state", "pending"),)] == 0
    assert {label for ((_, label),) in states} >= {"pending", "approved", "dispatched"}
    assert samples(metrics, "capgate_proposal_oldest_pending_seconds") == {(): 0.0}


def test_the_token_is_compared_by_its_digest():
    import hashlib

    digest = hashlib.sha256(b"scrape-me").hexdigest()
    assert GatewayMetrics.token_matches("Bearer scrape-me", digest)
    assert not GatewayMetrics.token_matches("Bearer scrape-you", digest)
    assert not GatewayMetrics.token_matches("scrape-me", digest)
    assert not GatewayMetrics.token_matches(None, digest)


def test_opa_round_trips_and_whole_steps_are_timed_by_bounded_labels(metrics):
    from capgate.gateway.policy.client import Exchange
    from capgate.gateway.service.gateway import StepTiming

    metrics.exchange(Exchange("execute", 0.003, True))
    metrics.exchange(Exchange("execute", 0.7, False))
    metrics.exchange(Exchange("capgate/an/odd/path c-42", 0.001, True))
    metrics.step(StepTiming("execute", 0.02, "denied"))
    metrics.step(StepTiming("a step of c-42", 0.02, "maybe"))
    assert "c-42" not in metrics.exposition().decode()
    counts = samples(metrics, "capgate_policy_exchange_seconds_count")
    assert counts[(("answered", "true"), ("question", "execute"))] == 1
    assert counts[(("answered", "false"), ("question", "execute"))] == 1
    assert counts[(("answered", "true"), ("question", "other"))] == 1
    sums = samples(metrics, "capgate_policy_exchange_seconds_sum")
    assert sums[(("answered", "false"), ("question", "execute"))] == pytest.approx(0.7)
    # The 0.003 s exchange is in the 5 ms bucket and not in the 2.5 ms one.
    buckets = samples(metrics, "capgate_policy_exchange_seconds_bucket")
    execute = (("answered", "true"), ("le", "{}"), ("question", "execute"))
    assert buckets[tuple((k, "0.0025" if k == "le" else v) for k, v in execute)] == 0
    assert buckets[tuple((k, "0.005" if k == "le" else v) for k, v in execute)] == 1
    steps = samples(metrics, "capgate_step_seconds_count")
    assert steps[(("result", "denied"), ("step", "execute"))] == 1
    assert steps[(("result", "other"), ("step", "other"))] == 1


def test_tenants_are_labels_only_when_the_operator_asks(tmp_path: Path):
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    event = DecisionEvent(
        kind="execute", agent="a", allow=True, tool="contact.read", status="success",
        tenant="acme",
    )  # fmt: skip
    store = open_store(str(tmp_path / "state.db"))
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
    try:
        plain = GatewayMetrics(catalogue, store, reason_codes=declared_codes())
        labelled = GatewayMetrics(
            catalogue, store, reason_codes=declared_codes(), tenant_labels=True
        )
        for metrics in (plain, labelled):
            metrics.observe(event)
        assert "acme" not in plain.exposition().decode()
        assert samples(plain, "capgate_tool_outcomes_total") == {
            (("status", "success"), ("tool", "contact.read")): 1
        }
        assert samples(labelled, "capgate_tool_outcomes_total") == {
            (("status", "success"), ("tenant", "acme"), ("tool", "contact.read")): 1
        }
        decisions = samples(labelled, "capgate_decisions_total")
        assert decisions == {
            (("allow", "true"), ("question", "execute"), ("reason", "none"), ("tenant", "acme")): 1
        }
        # A tenant the store does not hold is no label value: a made-up name is "other".
        made_up = DecisionEvent(kind="compose", agent="a", allow=False, tenant="c-42 made up")
        labelled.observe(made_up)
        assert "c-42" not in labelled.exposition().decode()
        assert "c-42" not in repr(made_up)  # nor printed where events are
    finally:
        store.close()


def test_opa_readiness_and_the_revision_it_serves_are_read_at_each_scrape(metrics):
    from capgate.gateway.model.health import CheckResult

    assert samples(metrics, "capgate_opa_ready") == {}  # nothing to ask yet
    answers = [
        CheckResult(ok=True, detail="ready", facts={"bundle_revision": "rev-1"}),
        CheckResult(ok=False, detail="refused"),
    ]
    asked: list[int] = []

    def check() -> CheckResult:  # ready at the first scrape, refused from then on
        asked.append(1)
        return answers[min(len(asked), 2) - 1]

    metrics.watch_opa(check)
    text = metrics.exposition().decode()
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert found[("capgate_opa_ready", ())] == 1
    assert found[("capgate_policy_bundle_info", (("revision", "rev-1"),))] == 1
    assert samples(metrics, "capgate_opa_ready") == {(): 0}
    assert samples(metrics, "capgate_policy_bundle_info") == {}
    assert len(asked) == 3  # asked at each scrape, never cached
