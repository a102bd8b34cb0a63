"""Registry lookup order, the parameter digest, and the agent-side helper.

The agent-side helper (:class:`AgentSession`) works through a Gateway over a real
SQLite store (``store`` fixture); a scripted decider stands in for OPA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from capgate.adapters.fronts.session import AgentSession
from capgate.adapters.tools.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.digest import canonical_json, params_digest
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import InvalidInput, ToolFailed, ToolNotInCatalogue
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision
from capgate.gateway.model.facts import ComposeInput, ConnectionStatus, ExecuteInput
from capgate.gateway.model.outcomes import OutcomeStatus, ToolRefused
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import CallContext
from capgate.gateway.tools.registry import ToolRegistry
from tests.unit import gateway_support
from tests.unit.scripted_decider import (
    ScriptedDecider,
    compose_decision,
    execute_decision,
)


class Remote:
    """An out-of-process adapter stand-in that knows one tool."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []

    def names(self) -> list[str]:
        return [self.name]

    def has(self, name: str) -> bool:
        return name == self.name

    def describe(self, name: str) -> str | None:
        return "remote description" if name == self.name else None

    def run(self, name: str, params: Mapping[str, Any], context: CallContext) -> Mapping[str, Any]:
        self.calls.append(name)
        return {"from": "remote"}


def test_adapters_are_tried_in_the_order_given():
    remote = Remote("oracle")
    local = InProcessTools()
    local.register("oracle", "local description", lambda seed: {"omen": seed})
    assert ToolRegistry(remote, local).describe("oracle") == "remote description"
    registry = ToolRegistry(local, remote)
    assert registry.describe("oracle") == "local description"
    assert registry.adapter_for("oracle") is local
    assert registry.names() == {"oracle"}


def test_registry_refuses_what_is_not_an_adapter():
    with pytest.raises(TypeError, match="Adapter protocol"):
        ToolRegistry(object())  # type: ignore[arg-type]


def test_binding_to_a_catalogue_names_every_unknown_tool_with_a_suggestion():
    tools = InProcessTools()
    tools.register("contact.raed", "typo", lambda contact_id: {})
    tools.register("contact.read", "fine", lambda contact_id: {})
    registry = ToolRegistry(tools)
    with pytest.raises(ToolNotInCatalogue) as caught:
        registry.bind(["contact.read", "quote.propose"])
    assert caught.value.code == "tool_not_in_catalogue"
    assert caught.value.names == ["contact.raed"]
    assert "did you mean 'contact.read'" in str(caught.value)


def test_a_bound_registry_refuses_an_adapter_with_unknown_names():
    registry = ToolRegistry(Remote("contact.read"))
    registry.bind(["contact.read"])
    with pytest.raises(ToolNotInCatalogue, match="'elsewhere'"):
        registry.attach(Remote("elsewhere"))
    assert registry.names() == {"contact.read"}


def test_in_process_tools_given_the_catalogue_refuse_a_typo_at_once():
    tools = InProcessTools(catalogue_tools=["oracle"])
    tools.register("oracle", "d", lambda seed: {})
    with pytest.raises(ToolNotInCatalogue, match="did you mean 'oracle'"):
        tools.register("oracel", "d", lambda seed: {})
    assert list(tools) == ["oracle"]


def test_dispatcher_refuses_a_registry_with_names_the_catalogue_lacks():
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    with pytest.raises(ToolNotInCatalogue, match=r"'payments\.execute'"):
        Dispatcher(catalogue, Decider([]), ToolRegistry(Remote("payments.execute")))


def test_attached_adapter_serves_what_is_not_local():
    registry = ToolRegistry()
    assert "x" not in registry
    registry.attach(Remote("x"))
    assert "x" in registry
    assert registry.describe("nope") is None
    assert registry.adapter_for("nope") is None


def test_register_rejects_duplicates_non_callables_and_bad_names():
    tools = InProcessTools()
    tools.register("a", "d", lambda: {})
    with pytest.raises(ValueError, match="already registered"):
        tools.register("a", "d", lambda: {})
    with pytest.raises(TypeError, match="callable"):
        tools.register("b", "d", "not a function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty string"):
        tools.register("", "d", lambda: {})
    assert len(tools) == 1


def test_digest_ignores_key_order_and_sees_every_value():
    a = params_digest({"to": "ada@example.test", "body": "hi", "n": 1})
    b = params_digest({"n": 1, "body": "hi", "to": "ada@example.test"})
    c = params_digest({"n": 1, "body": "hi", "to": "eve@example.test"})
    assert a == b
    assert a != c
    assert a.startswith("sha256:")
    assert len(a) == len("sha256:") + 64


def test_digest_is_over_utf8_canonical_json():
    assert canonical_json({"b": "é", "a": [1, 2]}) == '{"a":[1,2],"b":"é"}'.encode()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), object(), b"bytes"])
def test_digest_rejects_values_that_are_not_plain_json(bad):
    with pytest.raises(InvalidInput):
        params_digest({"x": bad})


class Decider:
    def __init__(self, visible: list[str]) -> None:
        self.visible = visible

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        return compose_decision(self.visible, decision_id="c-1")

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        return execute_decision(decision_id="e-1")


def session(store: Store, decider: Any, *adapters: Any) -> AgentSession:
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    gateway = gateway_support.gateway(catalogue, decider, store, *adapters)
    return AgentSession(gateway, gateway_support.request())


def test_prompt_block_with_nothing_visible_says_so(store):
    assert session(store, Decider([])).available_tools_block() == "AVAILABLE TOOLS: none"


def test_prompt_block_uses_the_catalogue_description_not_the_adapter_one(store):
    block = session(
        store, Decider(["contact.read"]), Remote("contact.read")
    ).available_tools_block()
    assert block.startswith("AVAILABLE TOOLS:\n- contact.read (v1): ")
    assert "remote description" not in block


def test_call_tool_raises_tool_failed_with_the_outcome(store):
    def refuse(contact_id: str) -> dict[str, Any]:
        raise ToolRefused("contact was deleted")

    tools = InProcessTools()
    tools.register("contact.read", "d", refuse)
    agent = session(store, Decider(["contact.read"]), tools)
    with pytest.raises(ToolFailed) as caught:
        agent.call_tool("contact.read", contact_id="c")
    assert caught.value.code == "tool_failed"
    assert caught.value.outcome.status is OutcomeStatus.REFUSED
    assert agent.last_outcome is caught.value.outcome


def test_the_session_composes_and_calls_with_the_stores_facts(store):
    # The session's caller says who, which task and which environment; connections,
    # budget class, evidence and budget come from the store, at every call.
    decider = ScriptedDecider(compose_answer=compose_decision(["contact.read"]))
    tools = InProcessTools()
    tools.register("contact.read", "d", lambda contact_id: {
        "contact_id": contact_id, "name": "n", "email": "n@example.test"})  # fmt: skip
    agent = session(store, decider, tools)
    assert agent.visible_tools == ["contact.read"]
    composed = decider.composed[0]
    assert composed.budget_class == "standard"  # the tenant's, from the store
    assert composed.connections["crm"] is ConnectionStatus.ACTIVE
    assert agent.call_tool("contact.read", contact_id="c")["contact_id"] == "c"
    asked = decider.asked[0]
    assert asked.stage.value == "call"
    assert asked.budget is not None
    assert (asked.budget.remaining, asked.budget.cost) == (None, 0)  # no limit; a free read
    assert asked.approval is None
    assert asked.proposal is None

    with store.transaction() as tx:
        tx.set_connection_status(gateway_support.TENANT, "crm", ConnectionStatus.REVOKED)
    agent.refresh()
    assert decider.composed[-1].connections["crm"] is ConnectionStatus.REVOKED
    agent.call_tool("contact.read", contact_id="c")
    assert decider.asked[-1].connections["crm"] is ConnectionStatus.REVOKED


def test_a_reviewed_tool_is_proposed_not_run(store):
    decider = ScriptedDecider(compose_answer=compose_decision(["quote.propose"]))
    ran: list[str] = []
    tools = InProcessTools()
    tools.register("quote.record_reviewed", "d", lambda **p: ran.append("run") or {})
    agent = session(store, decider, tools)
    answer = agent.call_tool(
        "quote.propose", opportunity_id="opp-1", amount_cents=100, currency="EUR"
    )
    assert answer["status"] == "pending_review"
    assert answer["tool"] == "quote.propose"
    assert agent.last_proposal is not None
    assert answer["proposal_id"] == agent.last_proposal.id
    assert agent.last_proposal.params == {
        "opportunity_id": "opp-1", "amount_cents": 100, "currency": "EUR"}  # fmt: skip
    assert decider.asked[0].stage.value == "propose"
    assert ran == []


def test_the_session_refuses_what_is_not_a_gateway_or_a_request(store):
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    gateway = gateway_support.gateway(catalogue, Decider([]), store)
    with pytest.raises(InvalidInput, match="Gateway"):
        AgentSession(Dispatcher(catalogue, Decider([]), ToolRegistry()), gateway_support.request())  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="AgentRequest"):
        AgentSession(gateway, FACTS)  # type: ignore[arg-type]


FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "a", "role": "sales", "tenant": "t"},
        "task": {"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c"}]},
        "environment": "production",
        "budget_class": "standard",
    }
)
