"""Agents that link resources to tasks over MCP, as the link policy lets them (#21).

Real processes throughout: ``capgate serve --stdio`` started by the official Python
MCP client, its embedded OPA answering ``capgate/link``, a SQLite store. The
catalogue is the demo's, with invoice payments working on the recorded links and a
``work_order`` role that may link invoices. A work-order agent links an invoice to
the finance agent's task, and only then may the finance agent work on it; linking
again changes nothing; unlinking takes it away again. Around that, what an agent
may not do: link a type its role does not list, change the task it works in
itself, reach another tenant's task (its tenant is its binding's), name an identity
or a tenant in the arguments, or call the link tools at all when its role links
nothing (they are not listed, and answer as an unknown tool). Every change and
every refusal is a ``task_link`` ledger row naming the binding's agent, how it was
authenticated and the decision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capgate.cli.main import main
from capgate.gateway.state import open_store
from tests.integration.mcp_server_support import (
    FINANCE_BOT,
    bounded,
    ledger,
    linking_catalogue,
    seed_store,
    stdio_session,
    stdio_state,
    work_order,
)
from tests.integration.mcp_server_support import (
    outcome_facts as facts,
)

pytestmark = pytest.mark.integration

LINK = "capgate.tasks.link"
UNLINK = "capgate.tasks.unlink"
INV_9 = {"task_id": "task-pay-9", "resource_type": "invoice", "resource_id": "inv-9"}


@pytest.fixture
def state(tmp_path: Path) -> dict[str, Any]:
    folder = linking_catalogue(tmp_path / "catalogue")
    store = seed_store(tmp_path / "state.db")
    assert main(["tenants", "add", "globex", "--budget-class", "standard", "--store", store]) == 0
    bindings = {
        "work-order": work_order("wo-bot", "task-wo-1"),
        # A work-order agent whose own task is the finance task it would widen.
        "work-order-in-pay-9": work_order("wo-inside", "task-pay-9"),
        "globex-work-order": work_order("wo-globex", "task-wo-2", tenant="globex"),
        "finance": FINANCE_BOT,
    }
    return {**stdio_state(tmp_path, store, bindings), "catalogue": folder}


def session(state: dict[str, Any], who: str) -> Any:
    return stdio_session(
        state["store"],
        state["configs"][who],
        state["record"],
        state["errlog"],
        extra=("--no-worker", "--catalogue", str(state["catalogue"])),
    )


async def check_inv_9(state: dict[str, Any]) -> dict[str, Any]:
    async with session(state, "finance") as finance:
        listed = {t.name for t in (await finance.list_tools()).tools}
        assert not listed & {LINK, UNLINK}, "finance links nothing: no link tools"
        return facts(await finance.call_tool("invoice.check_approval", {"invoice_id": "inv-9"}))


def link_rows(store: str) -> list[tuple[Any, ...]]:
    return [
        (r.tenant, r.principal, r.outcome, tuple(r.reason_codes), r.detail["task_id"])
        for r in ledger(store)
        if r.kind == "task_link"
    ]


def test_a_work_order_agent_links_an_invoice_and_the_finance_task_may_work_on_it(state):
    async def test() -> None:
        # Nothing linked: the binding's own list of resources only narrows the
        # recorded links, so inv-9 is out of the finance task's reach.
        before = await check_inv_9(state)
        assert before["reason_codes"] == ["subject_out_of_scope"], before

        async with session(state, "work-order") as agent:
            tools = {t.name: t for t in (await agent.list_tools()).tools}
            assert {LINK, UNLINK} <= set(tools)
            assert tools[LINK].input_schema["required"] == ["task_id", "resource_type",
                                                            "resource_id"]  # fmt: skip
            linked = await agent.call_tool(LINK, INV_9)
            assert linked.is_error is False, linked.content
            said = facts(linked)
            assert said["status"] == "linked"
            assert said["resource"] == {"type": "invoice", "id": "inv-9"}
            assert said["linked_by"] == "wo-bot/work_order"
            again = facts(await agent.call_tool(LINK, INV_9))
            assert again["status"] == "already_linked"

        after = await check_inv_9(state)
        assert after["status"] == "success", after

        async with session(state, "work-order") as agent:
            unlinked = facts(await agent.call_tool(UNLINK, INV_9))
            assert unlinked["status"] == "unlinked"
            assert facts(await agent.call_tool(UNLINK, INV_9))["status"] == "not_linked"

        gone = await check_inv_9(state)
        assert gone["reason_codes"] == ["subject_out_of_scope"], gone

    bounded(test)
    assert link_rows(state["store"]) == [
        ("acme", "wo-bot/work_order", "linked", (), "task-pay-9"),
        ("acme", "wo-bot/work_order", "already_linked", (), "task-pay-9"),
        ("acme", "wo-bot/work_order", "unlinked", (), "task-pay-9"),
        ("acme", "wo-bot/work_order", "not_linked", (), "task-pay-9"),
    ]
    rows = [r for r in ledger(state["store"]) if r.kind == "task_link"]
    assert {r.detail["authenticated_by"] for r in rows} == {"stdio"}
    assert all(r.decision_id for r in rows), "each change names the link decision"


def test_an_agent_cannot_make_a_link_it_may_not_make(state):
    async def test() -> None:
        async with session(state, "work-order") as agent:
            contact = await agent.call_tool(
                LINK, {**INV_9, "resource_type": "contact", "resource_id": "c-42"}
            )
            assert contact.is_error is True
            assert facts(contact)["reason_codes"] == ["link_not_permitted"]
            # Its own task is out of bounds, for linking and unlinking alike.
            own = await agent.call_tool(LINK, {**INV_9, "task_id": "task-wo-1"})
            assert facts(own)["reason_codes"] == ["link_own_task"]
            # The identity and the tenant are the binding's: an argument naming either
            # is refused before anything is asked.
            for forged in ({"tenant": "globex"}, {"agent": "finance-bot"}, {"by": "carl"}):
                refused = facts(await agent.call_tool(LINK, {**INV_9, **forged}))
                assert refused["error"] == "input_invalid", refused
            malformed = facts(await agent.call_tool(LINK, {**INV_9, "resource_id": "inv 9"}))
            assert malformed["error"] == "input_invalid"
            missing = facts(await agent.call_tool(LINK, {"task_id": "task-pay-9"}))
            assert missing["error"] == "input_invalid"

        async with session(state, "work-order-in-pay-9") as inside:
            widened = await inside.call_tool(LINK, INV_9)
            assert facts(widened)["reason_codes"] == ["link_own_task"]

        async with session(state, "finance") as finance:
            hidden = await finance.call_tool(LINK, {**INV_9, "task_id": "task-wo-1"})
            assert facts(hidden)["error"] == "unknown_tool"

        # Another tenant's agent links in its own tenant only: acme's task-pay-9 is
        # untouched, and its own link there is not acme's.
        async with session(state, "globex-work-order") as globex:
            assert facts(await globex.call_tool(LINK, INV_9))["status"] == "linked"
        assert (await check_inv_9(state))["reason_codes"] == ["subject_out_of_scope"]

    bounded(test)
    assert link_rows(state["store"]) == [
        ("acme", "wo-bot/work_order", "refused", ("link_not_permitted",), "task-pay-9"),
        ("acme", "wo-bot/work_order", "refused", ("link_own_task",), "task-wo-1"),
        ("acme", "wo-inside/work_order", "refused", ("link_own_task",), "task-pay-9"),
        ("globex", "wo-globex/work_order", "linked", (), "task-pay-9"),
    ]
    with open_store(state["store"]) as store, store.transaction(read_only=True) as tx:
        assert tx.task_links("acme", "task-pay-9") == []
        assert [link.resource.id for link in tx.task_links("globex", "task-pay-9")] == ["inv-9"]
