"""Registry lookup order, the parameter digest, and the agent-side helper."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from adapters.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from gateway.catalogue import load_catalogue
from gateway.digest import canonical_json, params_digest
from gateway.dispatch.agent import AgentSession
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.registry import ToolRegistry
from gateway.dispatch.transport import CallContext
from gateway.errors import InvalidInput, ToolFailed, ToolNotInCatalogue
from gateway.model.decisions import ComposeDecision, ExecuteDecision
from gateway.model.facts import ComposeInput, ExecuteInput
from gateway.model.outcomes import OutcomeStatus, ToolRefused
from tests.unit.scripted_decider import compose_decision, execute_decision


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


FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "a", "role": "sales", "tenant": "t"},
        "task": {"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c"}]},
        "environment": "production",
        "budget_class": "standard",
    }
)


def session(visible: list[str], registry: ToolRegistry) -> AgentSession:
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    return AgentSession(Dispatcher(catalogue, Decider(visible), registry), FACTS)


def test_prompt_block_with_nothing_visible_says_so():
    assert session([], ToolRegistry()).available_tools_block() == "AVAILABLE TOOLS: none"


def test_prompt_block_uses_the_catalogue_description_not_the_adapter_one():
    registry = ToolRegistry(Remote("contact.read"))
    block = session(["contact.read"], registry).available_tools_block()
    assert block.startswith("AVAILABLE TOOLS:\n- contact.read (v1): ")
    assert "remote description" not in block


def test_call_tool_raises_tool_failed_with_the_outcome():
    def refuse(contact_id: str) -> dict[str, Any]:
        raise ToolRefused("contact was deleted")

    tools = InProcessTools()
    tools.register("contact.read", "d", refuse)
    agent = session(["contact.read"], ToolRegistry(tools))
    with pytest.raises(ToolFailed) as caught:
        agent.call_tool("contact.read", contact_id="c")
    assert caught.value.code == "tool_failed"
    assert caught.value.outcome.status is OutcomeStatus.REFUSED
    assert agent.last_outcome is caught.value.outcome
