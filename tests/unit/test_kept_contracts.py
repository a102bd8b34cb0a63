"""Contract versions kept for the work in flight, in Python (``Catalogue.retained``).

Which contract a version reads (``Catalogue.contract_at``), what the dispatcher
prepares a dispatch under (that version's schemas and values, compiled once per
version), and the check that an allow under a kept version is for a dispatch
only. The policies' side is ``policies/capgate/execute/execute_versions_test.rego``;
the whole path against a real OPA and both stores is
``tests/integration/test_kept_versions.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.enforce.verify import verify_execute
from capgate.gateway.errors import InvalidInput, PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ExecuteInput, Stage
from capgate.gateway.tools.registry import ToolRegistry
from tests.unit.scripted_decider import ScriptedDecider, execute_decision, key_obligation

PAYMENT: dict[str, Any] = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    """The demo, its payment at version 2 taking one more parameter, version 1 kept."""
    sales = load_catalogue(demo_catalogue_dir("sales"))
    v1 = sales.tools["payment.execute"]
    schema = dict(v1.input_schema)
    schema["required"] = [*schema["required"], "reference"]
    schema["properties"] = {**schema["properties"], "reference": {"type": "string"}}
    v2 = v1.model_copy(update={"version": 2, "input_schema": schema})
    return Catalogue.model_validate(
        {
            **sales.model_dump(),
            "tools": {**sales.model_dump()["tools"], "payment.execute": v2.model_dump()},
            "retained": {"payment.execute": {1: v1.model_dump()}},
        }
    )


def test_a_version_reads_its_own_contract_else_todays(catalogue: Catalogue):
    today = catalogue.tools["payment.execute"]
    kept = catalogue.retained["payment.execute"][1]
    assert catalogue.contract_at("payment.execute", 1) is kept
    assert catalogue.contract_at("payment.execute", 2) is today
    assert catalogue.contract_at("payment.execute", None) is today
    assert catalogue.contract_at("payment.execute", 7) is today  # the policy denies it
    assert catalogue.contract_at("contact.read", 1) is catalogue.tools["contact.read"]
    assert catalogue.contract_at("no.such.tool", 1) is None


def test_a_dispatch_is_prepared_under_its_versions_schema(catalogue: Catalogue):
    dispatcher = Dispatcher(catalogue, ScriptedDecider(), ToolRegistry())
    kept = dispatcher.prepare("payment.execute", PAYMENT, version=1)
    assert kept.contract is catalogue.retained["payment.execute"][1]
    # Today's schema wants the new parameter; version 1's never knew it.
    with pytest.raises(InvalidInput, match="reference"):
        dispatcher.prepare("payment.execute", PAYMENT)
    today = dispatcher.prepare("payment.execute", {**PAYMENT, "reference": "r-1"})
    assert today.contract is catalogue.tools["payment.execute"]
    with pytest.raises(InvalidInput):
        dispatcher.prepare("payment.execute", {**PAYMENT, "reference": "r-1"}, version=1)


def _request(version: int, stage: Stage) -> ExecuteInput:
    return ExecuteInput.model_validate(
        {
            "principal": {"agent": "a", "role": "finance", "tenant": "t"},
            "task": {"type": "invoice_payment"},
            "connections": {"bank": "active"},
            "environment": "production",
            "budget_class": "unlimited",
            "stage": stage,
            "call": {
                "tool": "payment.execute",
                "version": version,
                "operation_id": "pay-1",
                "subject": {"type": "invoice", "id": "inv-9"},
                "params_digest": "sha256:" + "0" * 64,
            },
        }
    )


def test_an_allow_under_a_kept_version_is_for_a_dispatch_only(catalogue: Catalogue):
    allow = execute_decision(obligations=[key_obligation("pay-1")])
    grant = verify_execute(catalogue, _request(1, Stage.DISPATCH), allow)
    assert grant.contract is catalogue.retained["payment.execute"][1]
    for stage in (Stage.CALL, Stage.PROPOSE):
        with pytest.raises(PolicyUnavailable, match="kept for dispatches only"):
            verify_execute(catalogue, _request(1, stage), execute_decision())
    with pytest.raises(PolicyUnavailable, match="names version 5"):
        verify_execute(catalogue, _request(5, Stage.DISPATCH), allow)
