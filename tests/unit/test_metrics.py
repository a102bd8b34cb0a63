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
