"""Each step of the gateway is timed once for its ``on_step`` observer (the metrics'
``capgate_step_seconds``), with what it came to: ok, denied by a policy, or an error."""

from __future__ import annotations

import pytest

from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import CapabilityViolation, PolicyUnavailable
from capgate.gateway.model.decisions import Reason
from capgate.gateway.service.gateway import StepTiming
from capgate.gateway.state.store import Store
from tests.unit import gateway_support
from tests.unit.scripted_decider import ScriptedDecider, execute_decision


def test_each_step_is_timed_once_with_what_it_came_to(store: Store):
    heard: list[StepTiming] = []
    decider = ScriptedDecider()
    gateway = gateway_support.gateway(
        load_catalogue(demo_catalogue_dir("sales")),
        decider,
        store,
        SalesDesk().tools(),
        on_step=heard.append,
    )
    request = gateway_support.request()
    gateway.compose(request)
    gateway.call(request, "contact.read", {"contact_id": "c"})
    decider.execute_answer = execute_decision(
        allow=False, reasons=[Reason(code="role_not_granted", message="no")], decision_id="d-2"
    )
    with pytest.raises(CapabilityViolation):
        gateway.call(request, "contact.read", {"contact_id": "c"})
    decider.error = RuntimeError("the decider broke")
    with pytest.raises(PolicyUnavailable):
        gateway.call(request, "contact.read", {"contact_id": "c"})
    assert [(t.step, t.result) for t in heard] == [
        ("compose", "ok"),
        ("execute", "ok"),
        ("execute", "denied"),
        ("execute", "error"),
    ]
    assert all(t.seconds >= 0 for t in heard)
