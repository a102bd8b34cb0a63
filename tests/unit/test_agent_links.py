"""An agent's link or unlink: asked of the link policy first, written only on an allow.

Over a real SQLite store, with a small scripted link policy standing in for OPA
(the policy itself is tested with ``opa test`` in ``policies/capgate/link`` and
against a real OPA over MCP in ``tests/integration/test_mcp_task_links.py``): what
the policy is asked (the binding's principal and task, never an argument's), what
is written on an allow, a deny, a contradictory answer and no answer, and which
callers are shown the MCP link tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from capgate.adapters.fronts.answers import link_answer
from capgate.adapters.fronts.desk import ReviewDesk
from capgate.adapters.fronts.mcp.desk_tools import LINK, UNLINK, desk_answer, desk_tools
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.errors import CapabilityViolation, InvalidInput, PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue, RoleSpec
from capgate.gateway.model.decisions import LinkDecision, Reason
from capgate.gateway.model.facts import LinkInput, ResourceRef
from capgate.gateway.service.links import link_outcome
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.store import Store
from tests.unit import gateway_support
from tests.unit.scripted_decider import SOME_DIGEST, ScriptedDecider

INVOICE = {"type": "invoice", "id": "inv-9"}


class LinkDecider(ScriptedDecider):
    """The scripted decider, answering the link question as told, and keeping what
    it was asked."""

    def __init__(self, allow: bool = True, reasons: list[Reason] | None = None) -> None:
        super().__init__()
        self.answer = LinkDecision.model_validate(
            {"allow": allow, "reasons": reasons or [], "catalogue_digest": SOME_DIGEST,
             "decision_id": "dec-link-1"}
        )  # fmt: skip
        self.asked: list[LinkInput] = []

    def link(self, facts: LinkInput) -> LinkDecision:
        self.asked.append(facts)
        return self.answer


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    sales = load_catalogue(demo_catalogue_dir("sales"))
    roles = {
        **sales.roles,
        "work_order": RoleSpec(description="Hands out work.", links=["invoice"]),
    }
    return sales.model_copy(update={"roles": roles})


@pytest.fixture
def store(tmp_path: Path) -> Any:
    opened = gateway_support.open_seeded_store(tmp_path)
    yield opened
    opened.close()


def _request(role: str = "work_order", task: str = "task-wo-1") -> AgentRequest:
    return AgentRequest.model_validate(
        {
            "principal": {"agent": "wo-bot", "role": role, "tenant": gateway_support.TENANT},
            "task": {"type": "customer_quote", "id": task},
            "environment": "production",
            "authenticated_by": "token:work-order",
        }
    )


def _rows(store: Store) -> list[tuple[Any, ...]]:
    return [
        (r.principal, r.outcome, tuple(r.reason_codes), r.decision_id, r.detail["task_id"])
        for r in store.ledger()
        if r.kind == "task_link"
    ]


def _links(store: Store, task: str = "task-pay-9") -> list[ResourceRef]:
    with store.transaction(read_only=True) as tx:
        return [link.resource for link in tx.task_links(gateway_support.TENANT, task)]


def test_an_allowed_link_is_written_with_the_decision_and_the_binding_asked(catalogue, store):
    policy = LinkDecider()
    gateway = gateway_support.gateway(catalogue, policy, store)
    link, made = gateway.agent_link(_request(), "link", "task-pay-9", INVOICE)
    assert made is True
    assert link is not None
    assert link.linked_by == "wo-bot/work_order"
    assert _links(store) == [ResourceRef(**INVOICE)]
    (asked,) = policy.asked
    assert asked.to_opa() == {
        "principal": {"agent": "wo-bot", "role": "work_order", "tenant": "t", "acts_for": None},
        "authenticated_by": "token:work-order",
        "task": {"id": "task-wo-1", "type": "customer_quote"},
        "link": {"action": "link", "task_id": "task-pay-9", "resource": INVOICE},
    }
    removed, changed = gateway.agent_link(_request(), "unlink", "task-pay-9", INVOICE)
    assert changed is True
    assert removed == link
    assert _rows(store) == [
        ("wo-bot/work_order", "linked", (), "dec-link-1", "task-pay-9"),
        ("wo-bot/work_order", "unlinked", (), "dec-link-1", "task-pay-9"),
    ]
    assert {r.detail["authenticated_by"] for r in store.ledger() if r.kind == "task_link"} == {
        "token:work-order"
    }


def test_a_refusal_is_recorded_and_links_nothing(catalogue, store):
    reason = Reason(code="link_own_task", message="agent wo-bot works in task task-pay-9")
    gateway = gateway_support.gateway(catalogue, LinkDecider(False, [reason]), store)
    with pytest.raises(CapabilityViolation) as refused:
        gateway.agent_link(_request(task="task-pay-9"), "link", "task-pay-9", INVOICE)
    assert refused.value.reason_codes == ["link_own_task"]
    assert _links(store) == []
    assert _rows(store) == [
        ("wo-bot/work_order", "refused", ("link_own_task",), "dec-link-1", "task-pay-9")
    ]


def test_an_allow_with_reasons_is_no_allow(catalogue, store):
    reason = Reason(code="link_not_permitted", message="no")
    gateway = gateway_support.gateway(catalogue, LinkDecider(True, [reason]), store)
    with pytest.raises(PolicyUnavailable, match="inconsistent link allow"):
        gateway.agent_link(_request(), "link", "task-pay-9", INVOICE)
    assert _links(store) == []
    assert [row[1] for row in _rows(store)] == ["refused"]


def test_a_policy_that_cannot_answer_the_question_links_nothing(catalogue, store):
    gateway = gateway_support.gateway(catalogue, ScriptedDecider(), store)
    with pytest.raises(PolicyUnavailable, match="link question"):
        gateway.agent_link(_request(), "link", "task-pay-9", INVOICE)
    assert _links(store) == []
    assert _rows(store) == []


@pytest.mark.parametrize(
    ("task", "resource", "field"),
    [
        ("task pay", INVOICE, "task"),
        ("task-pay-9", {"type": "invoice", "id": "inv 9"}, "resource: id"),
        ("task-pay-9", {"type": "invoice"}, "resource: id"),
        ("task-pay-9", {**INVOICE, "tenant": "globex"}, "resource"),
    ],
)
def test_bad_input_is_refused_before_the_policy_is_asked(catalogue, store, task, resource, field):
    policy = LinkDecider()
    gateway = gateway_support.gateway(catalogue, policy, store)
    with pytest.raises(InvalidInput) as bad:
        gateway.agent_link(_request(), "link", task, resource)
    assert str(bad.value).startswith(field)
    assert policy.asked == []
    assert _rows(store) == []


def test_the_link_input_takes_no_other_action_and_no_other_field():
    base = _request()
    facts = {
        "principal": base.principal,
        "authenticated_by": "stdio",
        "task": {"id": "task-wo-1", "type": "customer_quote"},
        "link": {"action": "link", "task_id": "task-pay-9", "resource": INVOICE},
    }
    LinkInput.model_validate(facts)
    with pytest.raises(ValidationError, match="action"):
        LinkInput.model_validate({**facts, "link": {**facts["link"], "action": "relink"}})
    with pytest.raises(ValidationError, match="tenant"):
        LinkInput.model_validate({**facts, "link": {**facts["link"], "tenant": "globex"}})


def test_the_link_tools_are_shown_to_a_role_that_links_something_only(catalogue):
    linking = {t.name for t in desk_tools(catalogue, _request().principal)}
    assert {LINK, UNLINK} <= linking
    for role in ("sales", "sales_manager", "finance", "not-a-role"):
        shown = {t.name for t in desk_tools(catalogue, _request(role=role).principal)}
        assert not shown & {LINK, UNLINK}, role


def test_the_link_tools_answer_through_the_desk(catalogue, store):
    desk = ReviewDesk(gateway_support.gateway(catalogue, LinkDecider(), store))
    arguments = {"task_id": "task-pay-9", "resource_type": "invoice", "resource_id": "inv-9"}
    first = desk_answer(desk, _request(), LINK, arguments)
    assert (first.error, first.facts["status"]) == (False, "linked")
    assert first.facts["linked_by"] == "wo-bot/work_order"
    assert desk_answer(desk, _request(), LINK, arguments).facts["status"] == "already_linked"
    forged = desk_answer(desk, _request(), LINK, {**arguments, "tenant": "globex"})
    assert (forged.error, forged.facts["error"]) == (True, "input_invalid")
    assert desk_answer(desk, _request(), UNLINK, arguments).facts["status"] == "unlinked"
    gone = desk_answer(desk, _request(), UNLINK, arguments)
    assert gone.facts["status"] == "not_linked"
    assert "linked_by" not in gone.facts


def test_a_link_answer_says_what_changed():
    ref = ResourceRef(**INVOICE)
    assert link_answer(link_outcome("link", False), "task-pay-9", ref, None).text == (
        "invoice:inv-9 was linked to task task-pay-9 already; nothing changed."
    )
    assert link_answer(link_outcome("unlink", False), "task-pay-9", ref, None).facts == {
        "status": "not_linked",
        "task_id": "task-pay-9",
        "resource": INVOICE,
    }


def test_a_roles_links_are_compiled_for_the_policy(catalogue):
    compiled = compile_catalogue(catalogue)
    assert compiled["roles"]["work_order"]["links"] == {"invoice": True}
    assert "links" not in compiled["roles"]["sales"]  # as before roles could link
    with pytest.raises(ValidationError, match="links"):
        RoleSpec.model_validate({"description": "x", "links": ["not a type"]})
