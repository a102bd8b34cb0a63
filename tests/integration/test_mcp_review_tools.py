"""Reviews where people are: ``capgate serve``'s own MCP tools, over real processes.

An agent proposes through ``capgate serve --stdio`` with the official MCP client; a
binding whose role approves quotes lists the pending proposals, shows one, and
approves it by the digest it was shown; the server's execution worker dispatches it;
the proposing agent asks after its proposal and sees it dispatched with the
provider's receipt. Around that: a second verdict is ``already_decided``, a verdict
on other content is ``stale``, the proposer under another binding is refused as
``self_review`` (an agent acting for the same person too), another tenant's reviewer
sees nothing and is refused by id, and an agent whose role reviews nothing is not
shown the review tools and cannot call them. Every verdict names the binding's
identity, never an argument's.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from capgate.cli.main import main
from capgate.gateway.state import open_store
from capgate.gateway.state.records import ProposalStatus
from tests.hang import INNER_HANG_SECONDS
from tests.integration.mcp_server_support import (
    CAPGATE,
    FINANCE_BOT,
    LINKED,
    ROOT,
    SALES_BOT,
    bounded,
    ledger,
    records,
    seed_store,
    serve_args,
    server_env,
    stdio_session,
    stdio_state,
)
from tests.integration.mcp_server_support import (
    outcome_facts as facts,
)

pytestmark = pytest.mark.integration

QUOTE = {"opportunity_id": "opp-17", "amount_cents": 1200, "currency": "EUR"}


def reviewer_binding(
    agent: str, tenant: str = "acme", role: str = "sales_manager", **principal: Any
) -> dict[str, Any]:
    return {
        "principal": {"agent": agent, "role": role, "tenant": tenant, **principal},
        "task": {
            "type": "customer_quote",
            "id": f"task-review-{agent}",
            "linked_resources": LINKED,
        },
        "environment": "production",
    }


@pytest.fixture
def state(tmp_path: Path) -> dict[str, Any]:
    store = seed_store(tmp_path / "state.db")
    assert main(["tenants", "add", "globex", "--budget-class", "standard", "--store", store]) == 0
    bindings = {
        "sales": {**SALES_BOT, "principal": {**SALES_BOT["principal"], "acts_for": "sam"}},
        "maria": reviewer_binding("maria-bot"),
        "mike": reviewer_binding("mike-bot"),
        # The proposing agent's own name, in a reviewer's role: still the proposer.
        "sales-as-manager": reviewer_binding("sales-bot"),
        # Another agent, acting for the person the proposer acts for.
        "sam-helper": reviewer_binding("sam-helper", acts_for="SAM"),
        "gina": reviewer_binding("gina-bot", tenant="globex"),
        "finance": FINANCE_BOT,
        # Two controllers' assistants, for two different people: a payment above
        # 2,000.00 needs both.
        "carl": reviewer_binding("carl-bot", role="controller", acts_for="carl"),
        "dana": reviewer_binding("dana-bot", role="controller", acts_for="dana"),
    }
    return stdio_state(tmp_path, store, bindings)


def session(state: dict[str, Any], who: str, *extra: str) -> Any:
    return stdio_session(
        state["store"], state["configs"][who], state["record"], state["errlog"], extra=extra
    )


def test_a_binding_that_reviews_approves_over_mcp_and_the_agent_sees_it_dispatched(state):
    async def test() -> None:
        async with session(state, "sales", "--no-worker") as sales:
            listed = [t.name for t in (await sales.list_tools()).tools]
            assert "capgate.proposals.status" in listed
            assert not [n for n in listed if n.startswith("capgate.reviews.")]
            # A tool the caller is not shown is an unknown tool, whatever its name.
            hidden = await sales.call_tool(
                "capgate.reviews.approve", {"proposal_id": "prop-x", "digest": "sha256:" + "0" * 64}
            )
            assert facts(hidden)["error"] == "unknown_tool"
            proposed = facts(await sales.call_tool("quote.propose", QUOTE))
            proposal_id = proposed["proposal_id"]
            mine = facts(await sales.call_tool("capgate.proposals.status", {}))
            assert [p["proposal_id"] for p in mine["proposals"]] == [proposal_id]
            assert mine["proposals"][0]["status"] == "pending"

        async with session(state, "maria", "--no-worker") as maria:
            listed = [t.name for t in (await maria.list_tools()).tools]
            assert {"capgate.reviews.pending", "capgate.reviews.show"} <= set(listed)
            pending = facts(await maria.call_tool("capgate.reviews.pending", {}))
            assert [p["proposal_id"] for p in pending["proposals"]] == [proposal_id]
            shown = await maria.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
            assert shown.is_error is False
            view = shown.structured_content or {}
            assert view["params"] == QUOTE
            assert view["digest_matches"] is True
            assert view["proposer"] == {
                "agent": "sales-bot",
                "role": "sales",
                "tenant": "acme",
                "acts_for": "sam",
            }
            digest = view["params_digest"]
            stale = await maria.call_tool(
                "capgate.reviews.approve",
                {"proposal_id": proposal_id, "digest": "sha256:" + "1" * 64},
            )
            assert (stale.is_error, facts(stale)["error"]) == (True, "stale")
            approved = await maria.call_tool(
                "capgate.reviews.approve", {"proposal_id": proposal_id, "digest": digest}
            )
            assert approved.is_error is False, approved.content
            assert facts(approved)["status"] == "approved"

        async with session(state, "mike", "--no-worker") as mike:
            again = await mike.call_tool(
                "capgate.reviews.approve", {"proposal_id": proposal_id, "digest": digest}
            )
            assert (again.is_error, facts(again)["error"]) == (True, "already_decided")

        # A server with its worker dispatches the approval; the agent sees the receipt.
        async with session(state, "sales") as sales:
            while True:
                status = await sales.call_tool(
                    "capgate.proposals.status", {"proposal_id": proposal_id}
                )
                seen = status.structured_content or {}
                if seen.get("status") == "dispatched" and "outcome" in seen:
                    break
                await anyio.sleep(0.2)
            assert seen["outcome"]["status"] == "success"
            assert seen["outcome"]["receipt"]
            assert [r["reviewer"] for r in seen["reviews"]] == ["maria-bot"]

    bounded(test)
    runs = [r["name"] for r in records(state["record"])]
    assert runs.count("quote.record_reviewed") == 1  # the provider ran once
    rows = [r for r in ledger(state["store"]) if r.kind == "review"]
    assert [(r.outcome, r.detail["reviewer"]) for r in rows] == [
        ("approved", "maria-bot"),
        ("refused", "mike-bot"),
    ]
    assert rows[0].detail["reviewer_kind"] == "agent"
    assert rows[0].detail["authenticated_by"] == "stdio"


def test_an_approval_short_of_the_quorum_says_so_over_mcp(state):
    payment = {
        "invoice_id": "inv-9",
        "amount_cents": 300_000,
        "currency": "EUR",
        "beneficiary": "DE44500105175407324931",
    }

    async def test() -> None:
        async with session(state, "finance", "--no-worker") as finance:
            checked = await finance.call_tool("invoice.check_approval", {"invoice_id": "inv-9"})
            assert checked.is_error is False, checked.content
            proposal_id = facts(await finance.call_tool("payment.execute", payment))["proposal_id"]
        async with session(state, "carl", "--no-worker") as carl:
            shown = await carl.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
            view = shown.structured_content or {}
            assert "quorum" not in view  # nobody approved yet: no number is claimed
            first = await carl.call_tool(
                "capgate.reviews.approve",
                {"proposal_id": proposal_id, "digest": view["params_digest"]},
            )
            assert first.is_error is False, first.content
            said = facts(first)
            assert (said["status"], said["approvals"], said["approvals_required"]) == (
                "awaiting_quorum",
                1,
                2,
            )
            assert "dispatches" not in first.content[0].text  # type: ignore[union-attr]
        async with session(state, "dana", "--no-worker") as dana:
            shown = await dana.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
            view = shown.structured_content or {}
            assert view["quorum"] == {"approvals": 1, "approvals_required": 2}
            second = await dana.call_tool(
                "capgate.reviews.approve",
                {"proposal_id": proposal_id, "digest": view["params_digest"]},
            )
            assert facts(second)["status"] == "approved"

    bounded(test)
    rows = [r for r in ledger(state["store"]) if r.kind == "review"]
    assert [(r.outcome, r.detail["reviewer"]) for r in rows] == [
        ("awaiting_quorum", "carl-bot"),
        ("approved", "dana-bot"),
    ]
    with open_store(state["store"]) as store, store.transaction(read_only=True) as tx:
        assert tx.get_dispatch(rows[-1].proposal_id) is not None


def test_the_proposer_and_other_tenants_cannot_review_over_mcp(state):
    async def test() -> None:
        async with session(state, "sales", "--no-worker") as sales:
            proposal_id = facts(await sales.call_tool("quote.propose", QUOTE))["proposal_id"]
        for who, code in (("sales-as-manager", "self_review"), ("sam-helper", "self_review")):
            async with session(state, who, "--no-worker") as client:
                view = (
                    await client.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
                ).structured_content or {}
                refused = await client.call_tool(
                    "capgate.reviews.approve",
                    {"proposal_id": proposal_id, "digest": view["params_digest"]},
                )
                assert refused.is_error is True
                assert facts(refused)["reason_codes"] == [code], (who, facts(refused))
        async with session(state, "gina", "--no-worker") as gina:
            assert facts(await gina.call_tool("capgate.reviews.pending", {}))["proposals"] == []
            hidden = await gina.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
            assert (hidden.is_error, facts(hidden)["error"]) == (True, "unknown_proposal")
            refused = await gina.call_tool(
                "capgate.reviews.approve",
                {"proposal_id": proposal_id, "digest": "sha256:" + "0" * 64},
            )
            assert refused.is_error is True
            assert facts(refused)["reason_codes"] == ["tenant_mismatch"]
            # Arguments name no identity: an attempt to say who is refused as unknown.
            forged = await gina.call_tool(
                "capgate.reviews.pending", {"reviewer": "maria-bot", "tenant": "acme"}
            )
            assert (forged.is_error, facts(forged)["error"]) == (True, "input_invalid")

    bounded(test)
    store = open_store(state["store"])
    try:
        with store.transaction(read_only=True) as tx:
            (proposal,) = tx.list_proposals(tenant="acme")
            assert proposal.status is ProposalStatus.PENDING
            assert tx.reviews(proposal.id) == []
    finally:
        store.close()
    refusals = [
        (r.detail["reviewer"], r.reason_codes) for r in ledger(state["store"]) if r.kind == "review"
    ]
    assert refusals == [
        ("sales-bot", ["self_review"]),
        ("sam-helper", ["self_review"]),
        ("gina-bot", ["tenant_mismatch"]),
    ]


COMMENT = "Amount checked with the customer.\n\tFine to send: maria-7f3a"


def test_a_comment_given_with_an_mcp_verdict_is_shown_with_the_proposal(state):
    """maria's binding approves with a comment; capgate.reviews.show and the agent's
    capgate.proposals.status show it back; a bad comment is refused and decides nothing;
    the ledger says only that there was one, the server's log never has it."""

    async def test() -> None:
        async with session(state, "sales", "--no-worker") as sales:
            proposal_id = facts(await sales.call_tool("quote.propose", QUOTE))["proposal_id"]
        async with session(state, "maria", "--no-worker") as maria:
            tools = {t.name: t for t in (await maria.list_tools()).tools}
            for name in ("capgate.reviews.approve", "capgate.reviews.reject"):
                schema = tools[name].input_schema
                assert schema["properties"]["comment"]["type"] == "string"
                assert "comment" not in schema["required"]
            shown = await maria.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
            digest = (shown.structured_content or {})["params_digest"]
            verdict = {"proposal_id": proposal_id, "digest": digest}
            bad = await maria.call_tool(
                "capgate.reviews.approve", {**verdict, "comment": "x" * 2001}
            )
            assert (bad.is_error, facts(bad)["error"]) == (True, "input_invalid")
            assert facts(bad)["message"].startswith("comment: must be at most 2000")
            approved = await maria.call_tool(
                "capgate.reviews.approve", {**verdict, "comment": f"  {COMMENT}\n"}
            )
            assert approved.is_error is False, approved.content
            view = (
                await maria.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
            ).structured_content or {}
            assert [(r["reviewer"], r["verdict"], r["comment"]) for r in view["reviews"]] == [
                ("maria-bot", "approved", COMMENT)
            ]
        async with session(state, "sales", "--no-worker") as sales:
            status = await sales.call_tool("capgate.proposals.status", {"proposal_id": proposal_id})
            assert [r["comment"] for r in (status.structured_content or {})["reviews"]] == [COMMENT]

    bounded(test)
    rows = [r for r in ledger(state["store"]) if r.kind == "review"]
    assert [(r.outcome, r.detail["commented"]) for r in rows] == [("approved", True)]
    assert not any("maria-7f3a" in json.dumps(r.model_dump(mode="json")) for r in rows)
    logged = state["errlog"].read_text(encoding="utf-8")
    assert "review proposal=" in logged  # the verdict was logged, its comment not
    assert "maria-7f3a" not in logged


def _approve_in_another_process(state: dict[str, Any], proposal_id: str) -> None:
    """maria's binding approves, in a server of its own (no worker there)."""

    async def approve() -> None:
        async with session(state, "maria", "--no-worker") as maria:
            view = (
                await maria.call_tool("capgate.reviews.show", {"proposal_id": proposal_id})
            ).structured_content or {}
            result = await maria.call_tool(
                "capgate.reviews.approve",
                {"proposal_id": proposal_id, "digest": view["params_digest"]},
            )
            assert result.is_error is False, result.content

    anyio.run(approve)


async def _read(client: Any, uri: str) -> dict[str, Any]:
    contents = (await client.read_resource(uri)).contents
    return dict(json.loads(contents[0].text))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_proposing_agent_hears_when_its_proposal_changes(state, mode):
    """Subscribed to its proposal's resource (resources/subscribe, or a 2026-07-28
    subscriptions/listen stream), the agent is notified as the proposal is approved
    elsewhere and dispatched by its server's worker, and reads the outcome."""
    updates: list[str] = []
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        nonlocal changed
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(str(message.params.uri))
            changed.set()

    async def settled(client: Any, uri: str) -> dict[str, Any]:
        while True:
            seen = await _read(client, uri)
            if seen["status"] == "dispatched" and "outcome" in seen:
                return seen
            await anyio.sleep(0.2)

    async def test() -> None:
        nonlocal changed
        params = {"message_handler": on_message} if mode == "legacy" else {}
        async with stdio_session(
            state["store"], state["configs"]["sales"], state["record"], state["errlog"],
            mode=mode, **params,
        ) as sales:  # fmt: skip
            proposal_id = facts(await sales.call_tool("quote.propose", QUOTE))["proposal_id"]
            uri = f"capgate://proposals/{proposal_id}"
            listed = [str(r.uri) for r in (await sales.list_resources()).resources]
            assert listed == [uri]
            assert (await _read(sales, uri))["status"] == "pending"
            with pytest.raises(MCPError):  # another's proposal is no resource at all
                await sales.read_resource("capgate://proposals/prop-someone-else")
            if mode == "legacy":
                # The handshake era's way (the SDK warns that 2026-07-28 removed it).
                with pytest.warns(MCPDeprecationWarning):
                    await sales.subscribe_resource(uri)
                await anyio.to_thread.run_sync(_approve_in_another_process, state, proposal_id)
                with anyio.fail_after(INNER_HANG_SECONDS):
                    await changed.wait()
                assert updates[0] == uri
            else:
                async with sales.listen(resource_subscriptions=[uri]) as stream:
                    assert list(stream.honored.resource_subscriptions or []) == [uri]
                    await anyio.to_thread.run_sync(_approve_in_another_process, state, proposal_id)
                    with anyio.fail_after(INNER_HANG_SECONDS):
                        event = await stream.__anext__()
                    assert str(getattr(event, "uri", "")) == uri, event
            seen = await settled(sales, uri)
            assert seen["outcome"]["status"] == "success"
            assert seen["outcome"]["receipt"]

    bounded(test)


# ------------------------------------------------------------------ awaiting the decision

AWAIT = {"capgate/await_review": True}


@contextlib.asynccontextmanager
async def patient_session(state: dict[str, Any], who: str) -> Any:
    """A 2026-07-28 client that drives input-required rounds for as long as the test's
    own bound allows (the SDK's default gives up after ten)."""
    params = StdioServerParameters(
        command=str(CAPGATE),
        args=serve_args(state["store"], state["configs"][who], "--stdio", "--log-level", "debug"),
        env=server_env(state["record"]),
        cwd=str(ROOT),
    )
    with state["errlog"].open("a", encoding="utf-8") as err:
        async with Client(
            stdio_client(params, errlog=err), mode="auto", input_required_max_rounds=100_000
        ) as client:
            yield client


def _pending_proposal(state: dict[str, Any]) -> str:
    """The id of the one pending proposal, once the store has it."""
    store = open_store(state["store"])
    try:
        while True:
            with store.transaction(read_only=True) as tx:
                pending = tx.list_proposals(status=ProposalStatus.PENDING)
            if pending:
                return pending[0].id
            time.sleep(0.1)
    finally:
        store.close()


def test_a_reviewed_call_can_wait_for_its_decision_within_the_request(state):
    """The call is proposed, answered input_required with a resume state, and the
    client's retries wait until maria approves elsewhere and the worker dispatches:
    the call's own answer is then the outcome, with the provider's receipt."""

    async def test() -> None:
        async with patient_session(state, "sales") as sales:
            answer: list[Any] = []

            async def call() -> None:
                answer.append(await sales.call_tool("quote.propose", QUOTE, meta=AWAIT))

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(call)
                proposal_id = await anyio.to_thread.run_sync(_pending_proposal, state)
                await anyio.to_thread.run_sync(_approve_in_another_process, state, proposal_id)
            (result,) = answer
            assert result.is_error is False, result.content
            outcome = facts(result)
            assert outcome["status"] == "success"
            assert outcome["receipt"]

    bounded(test)
    runs = [r["name"] for r in records(state["record"])]
    assert runs.count("quote.record_reviewed") == 1


def test_a_resume_state_is_the_servers_word_for_this_caller_and_these_arguments_once(state):
    async def test() -> None:
        async with patient_session(state, "sales") as sales:
            first = await sales.session.call_tool(
                "quote.propose", QUOTE, meta=AWAIT, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult)
            token = first.request_state
            assert token
            body, mac = token.split(".")
            forged = f"{body}.{mac[:-2]}{'AA' if mac[-2:] != 'AA' else 'BB'}"
            for bad, says in (
                (forged, "signature does not verify"),
                ("not-a-state", "not a resume state"),
            ):
                refused = await sales.session.call_tool(
                    "quote.propose", QUOTE, request_state=bad, allow_input_required=True
                )
                assert isinstance(refused, types.CallToolResult)
                assert facts(refused)["error"] == "resume_state_invalid"
                assert says in refused.content[0].text  # type: ignore[union-attr]
            other = await sales.session.call_tool(
                "quote.propose", {**QUOTE, "amount_cents": 9999}, request_state=token,
                allow_input_required=True,
            )  # fmt: skip
            assert isinstance(other, types.CallToolResult)
            assert "other arguments" in other.content[0].text  # type: ignore[union-attr]
            again = await sales.session.call_tool(
                "quote.propose", QUOTE, request_state=token, allow_input_required=True
            )
            assert isinstance(again, types.InputRequiredResult)  # redeemed: waits on
            reused = await sales.session.call_tool(
                "quote.propose", QUOTE, request_state=token, allow_input_required=True
            )
            assert isinstance(reused, types.CallToolResult)
            assert "used already" in reused.content[0].text  # type: ignore[union-attr]
        async with patient_session(state, "maria") as maria:
            theirs = await maria.session.call_tool(
                "quote.propose", QUOTE, request_state=again.request_state, allow_input_required=True
            )
            assert isinstance(theirs, types.CallToolResult)
            # Another caller's server is another process, whose key is not this one's
            # (the same-process case, another binding, is in tests/unit/test_awaiting.py).
            assert facts(theirs)["error"] == "resume_state_invalid"
            assert "another server's" in theirs.content[0].text  # type: ignore[union-attr]

    bounded(test)
    store = open_store(state["store"])
    try:
        with store.transaction(read_only=True) as tx:
            assert len(tx.list_proposals()) == 1  # no retry proposed the call again
    finally:
        store.close()


def test_a_client_that_cannot_wait_is_told_so_and_nothing_is_proposed(state):
    async def test() -> None:
        async with session(state, "sales", "--no-worker") as sales:  # the handshake era
            result = await sales.call_tool("quote.propose", QUOTE, meta=AWAIT)
            assert (result.is_error, facts(result)["error"]) == (True, "no_approval_surface")
            assert "capgate.proposals.status" in result.content[0].text  # type: ignore[union-attr]

    bounded(test)
    store = open_store(state["store"])
    try:
        with store.transaction(read_only=True) as tx:
            assert tx.list_proposals() == []
    finally:
        store.close()
