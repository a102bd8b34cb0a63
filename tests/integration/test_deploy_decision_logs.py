"""Decision logs of a deployed sidecar: on, masked by the bundle's ``system.log.mask``,
and tied to capgate's trace and ledger by the decision id.

A gateway composes, runs an allowed call and is denied another, through a locked-down
OPA writing its decision log to the console. Every fact that names someone (tenant,
agent, task, the contact the call is about) carries a marker; the test reads OPA's real
log output and checks that no marker is in it, that each event keeps the decision id,
path, revision and reason codes, and that every id is one the gateway's observer saw
and its ledger recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capgate import DecisionEvent, PolicySidecar
from capgate.gateway.errors import CapabilityViolation
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.deploy import BUNDLE_NAME
from capgate.gateway.state import open_store
from tests.hang import ANSWER_TIMEOUT, INNER_HANG_SECONDS
from tests.integration.deploy_support import (
    agent_request,
    bundle_server,
    new_deployment,
    publish,
    sales_gateway,
    sidecar_opa,
    wait_until,
)

pytestmark = pytest.mark.integration

MARK = "SECRET7f3a"
TENANT = f"tenant-{MARK}"
AGENT = f"agent-{MARK}"
TASK = f"task-{MARK}"
CONTACT = f"c-{MARK}"


def test_the_log_is_masked_and_its_ids_are_the_gateways(tmp_path: Path, sales_catalogue: Catalogue):
    events: list[DecisionEvent] = []
    with bundle_server(tmp_path / "www") as server:
        deployment, token = new_deployment(tmp_path / "deploy", server)
        bundle = publish(server, deployment, sales_catalogue, [token])
        with sidecar_opa(deployment.opa_config, tmp_path / "opa.log") as opa:
            with PolicySidecar(
                sales_catalogue,
                opa_url=opa.address,
                token=token,
                timeout=ANSWER_TIMEOUT,
                startup_timeout=INNER_HANG_SECONDS,
            ) as sidecar:
                store = open_store(str(tmp_path / "state.db"))
                try:
                    gateway, entered = sales_gateway(
                        sales_catalogue,
                        sidecar.client,
                        store,
                        tenant=TENANT,
                        observer=events.append,
                    )
                    request = agent_request(TENANT, AGENT, CONTACT, TASK)
                    # The control: what OPA is asked names them all.
                    sent = gateway.compose_facts(request).model_dump_json()
                    assert all(fact in sent for fact in (TENANT, AGENT, TASK, CONTACT))
                    gateway.compose(request)
                    gateway.call(request, "contact.read", {"contact_id": CONTACT})
                    # Not linked to the task: denied, with a reason naming the contact.
                    with pytest.raises(CapabilityViolation):
                        gateway.call(request, "contact.read", {"contact_id": f"{CONTACT}-2"})
                    ledger = [row for row in store.ledger() if row.decision_id]
                finally:
                    store.close()
            assert entered == [CONTACT]
            ids = {event.decision_id for event in events}
            assert None not in ids
            assert len(ids) == 3
            assert {row.decision_id for row in ledger} == ids
            assert {row.policy_revision for row in ledger} == {bundle.revision}
            assert {event.revision for event in events} == {bundle.revision}

            wait_until(lambda: len(_logged(opa.log, ids)) == 3, "OPA logs the three decisions")
            text = opa.log.read_text()

    assert MARK not in text, "a masked fact reached OPA's decision log"
    logged = _logged(tmp_path / "opa.log", ids)
    for event in logged.values():
        assert event["bundles"] == {BUNDLE_NAME: {"revision": bundle.revision}}
        assert "/input/principal/tenant" in event["erased"]
        assert event["input"]["principal"] == {"role": "sales"}
        assert "tenant" not in json.dumps(event["input"])
    execute = [e for e in logged.values() if e["path"] == "capgate/execute/decision"]
    assert len(execute) == 2
    allowed = next(e for e in execute if e["result"]["allow"])
    denied = next(e for e in execute if not e["result"]["allow"])
    assert allowed["input"]["call"]["tool"] == "contact.read"
    assert set(allowed["input"]["call"]) == {"tool", "version", "operation_id"}
    assert {"/input/call/params_digest", "/input/call/subject"} <= set(allowed["erased"])
    assert [reason["code"] for reason in denied["result"]["reasons"]] == ["subject_out_of_scope"]
    assert all(set(reason) == {"code"} for reason in denied["result"]["reasons"])
    compose = next(e for e in logged.values() if e["path"] == "capgate/compose/decision")
    assert "contact.read" in compose["result"]["visible"]


def _logged(log: Path, ids: set[str | None]) -> dict[str, dict[str, object]]:
    """OPA's decision log events for ``ids``, by decision id."""
    events = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("msg") == "Decision Log" and event.get("decision_id") in ids:
            events[event["decision_id"]] = event
    return events
