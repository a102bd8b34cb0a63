"""``capgate serve --http`` against the official MCP client: one real server process on
127.0.0.1 (port 0), several clients at once, bearer tokens mapped to principals.

The server runs with ``--log-level debug`` so that its whole log can be searched
for the tokens; its tools record everything they are given (see
``mcp_server_support.RecordingDesk``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest

from capgate.adapters.fronts.mcp.config import Binding
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import open_store
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.mcp_server_support import (
    MODES,
    SALES,
    SALES_BOT,
    SUPPORT_BOT,
    HttpServer,
    Mode,
    RecordingDesk,
    bearer,
    binding,
    bounded,
    hold_slow,
    http_server,
    http_session,
    ledger,
    listed_names,
    records,
    release_slow,
    seed_store,
    set_connection,
    slow_entered,
    write_config,
)

pytestmark = pytest.mark.integration

#: Every test's own bound, under pytest's timeout: nothing may hang (tests/hang.py).
BOUND = HANG_SECONDS
#: Fresh tokens for this run: the test searches everything for them afterwards.
TOKENS = {name: f"cg-{name}-{secrets.token_urlsafe(24)}" for name in ("ada", "bob", "carol")}
BINDINGS = {
    "ada": SALES_BOT,
    "bob": SUPPORT_BOT,
    "carol": binding("carol-bot", "sales", "task-quote-18"),
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "0"}},
}  # fmt: skip
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("serve-http")
    store = seed_store(folder / "state.db")
    config = write_config(
        folder / "serve.yaml", http={name: (TOKENS[name], BINDINGS[name]) for name in BINDINGS}
    )
    record = folder / "record.jsonl"
    with http_server(store, config, record) as server:
        yield {"server": server, "url": server.url, "store": store, "record": record}


@pytest.fixture(scope="module")
def expected(served: dict[str, Any], sales_sidecar: PolicySidecar) -> dict[str, list[str]]:
    store = open_store(served["store"])
    try:
        gateway = Gateway(
            load_catalogue(SALES),
            sales_sidecar.client,
            ToolRegistry(RecordingDesk().tools()),
            store,
        )
        return {
            name: listed_names(gateway, Binding.model_validate(bound))
            for name, bound in BINDINGS.items()
        }
    finally:
        store.close()


def names(result: types.ListToolsResult) -> list[str]:
    return [tool.name for tool in result.tools]


# ------------------------------------------------------------------ authentication


def test_no_valid_token_no_session_and_no_tools(served: dict[str, Any]):
    url = served["url"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}

    async def test() -> None:
        wrong = [None, "not-a-token", TOKENS["ada"] + "x", TOKENS["ada"].upper()]
        for token in wrong:
            async with bearer(token) as http:
                for body in (INITIALIZE, listing):
                    answer = await http.post(url, json=body, headers=ACCEPT)
                    assert answer.status_code == 401, (token, answer.status_code)
                    assert answer.headers["www-authenticate"].startswith("Bearer ")
                    assert "tools" not in answer.text
                    assert "contact" not in answer.text
                got = await http.get(url, headers={"Accept": "text/event-stream"})
                assert got.status_code == 401
        async with httpx2.AsyncClient(timeout=INNER_HANG_SECONDS) as http:
            # A token in the query string, or under another scheme, is no token.
            answer = await http.post(f"{url}?access_token={TOKENS['ada']}", json=INITIALIZE)
            assert answer.status_code == 401
            basic = {**ACCEPT, "Authorization": f"Basic {TOKENS['ada']}"}
            assert (await http.post(url, json=INITIALIZE, headers=basic)).status_code == 401
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the client raises
            async with http_session(url, "not-a-token") as client:
                await client.list_tools()

    bounded(test)


def test_a_session_belongs_to_the_token_that_opened_it(served: dict[str, Any]):
    async def test() -> None:
        async with bearer(TOKENS["ada"]) as ada, bearer(TOKENS["bob"]) as bob:
            opened = await ada.post(served["url"], json=INITIALIZE, headers=ACCEPT)
            assert opened.status_code == 200
            session = opened.headers["mcp-session-id"]
            headers = {**ACCEPT, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
            stolen = await bob.post(served["url"], json=listing, headers=headers)
            assert stolen.status_code == 404
            assert "contact" not in stolen.text

    bounded(test)


def test_the_host_header_must_be_this_loopback_server(served: dict[str, Any]):
    async def test() -> None:
        async with bearer(TOKENS["ada"]) as http:
            rebound = await http.post(
                served["url"], json=INITIALIZE, headers={**ACCEPT, "Host": "attacker.example"}
            )
            assert rebound.status_code in (403, 421), rebound.status_code
            origin = await http.post(
                served["url"], json=INITIALIZE, headers={**ACCEPT, "Origin": "http://evil.example"}
            )
            assert origin.status_code == 403, origin.status_code

    bounded(test)


# ------------------------------------------------------------------ principals


@pytest.mark.parametrize("mode", MODES)
def test_each_token_sees_its_own_principals_tools(
    served: dict[str, Any], expected: dict[str, list[str]], mode: Mode
):
    async def test() -> None:
        for name in BINDINGS:
            async with http_session(served["url"], TOKENS[name], mode=mode) as client:
                assert names(await client.list_tools()) == expected[name]
        async with http_session(served["url"], TOKENS["bob"], mode=mode) as support:
            hidden = await support.call_tool(
                "quote.propose", {"opportunity_id": "opp-17", "amount_cents": 1, "currency": "EUR"}
            )
            missing = await support.call_tool("quote.nonexistent", {})
            assert hidden.model_dump_json() == missing.model_dump_json()
            assert (hidden.meta or {})["capgate/outcome"]["error"] == "unknown_tool"
            assert hidden.structured_content is None
        assert "quote.propose" in expected["ada"]
        assert "quote.propose" not in expected["bob"]

    bounded(test)


def test_many_clients_at_once(served: dict[str, Any], expected: dict[str, list[str]]):
    seen: dict[str, list[str]] = {}

    async def one(name: str, mode: Mode, round_: int) -> None:
        async with http_session(served["url"], TOKENS[name], mode=mode) as client:
            seen[f"{name}/{mode}/{round_}"] = names(await client.list_tools())
            result = await client.call_tool("contact.read", {"contact_id": "c-42"})
            assert result.is_error is False, result.structured_content

    async def test() -> None:
        async with anyio.create_task_group() as tasks:
            for name in BINDINGS:
                for mode in MODES:
                    for round_ in range(2):
                        tasks.start_soon(one, name, mode, round_)

    bounded(test)
    assert len(seen) == 12
    assert all(listed == expected[key.split("/")[0]] for key, listed in seen.items())


@pytest.mark.parametrize("mode", MODES)
def test_a_slow_tool_in_one_session_does_not_stall_another(served: dict[str, Any], mode: Mode):
    # A's read is held in its tool until the test lets it go: B's calls must all
    # finish meanwhile, however slow the machine is.
    done: list[str] = []

    async def test() -> None:
        async with (
            http_session(served["url"], TOKENS["ada"], mode=mode) as a,
            http_session(served["url"], TOKENS["carol"], mode=mode) as b,
        ):
            await a.list_tools()
            await b.list_tools()

            async def slow() -> None:
                result = await a.call_tool("contact.read", {"contact_id": "c-slow"})
                assert result.is_error is False
                done.append("slow")

            before = hold_slow(served["record"])
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow)
                await slow_entered(served["record"], before)  # A is inside its tool now
                for _ in range(3):
                    assert names(await b.list_tools())
                    fast = await b.call_tool("contact.read", {"contact_id": "c-42"})
                    assert fast.is_error is False
                done.append("other session")
                assert done == ["other session"], "B finished while A's tool still ran"
                release_slow(served["record"])

    bounded(test)
    assert done == ["other session", "slow"]


# ------------------------------------------------------------------ list_changed


def test_a_revoked_connection_notifies_a_handshake_session(served: dict[str, Any]):
    changed = anyio.Event()
    get_stream = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def test() -> None:
        nonlocal changed
        async with (
            http_session(
                served["url"], TOKENS["ada"], message_handler=on_message, get_stream=get_stream
            ) as sales,
            http_session(served["url"], TOKENS["bob"]) as support,
        ):
            before = names(await sales.list_tools())
            support_before = names(await support.list_tools())
            with anyio.fail_after(INNER_HANG_SECONDS):
                await get_stream.wait()  # the stream the notification comes by is open
            await anyio.to_thread.run_sync(
                set_connection, served["store"], "sales_mailbox", "revoke"
            )
            try:
                with anyio.fail_after(INNER_HANG_SECONDS):
                    await changed.wait()
                after = names(await sales.list_tools())
                assert after == [name for name in before if name != "quote.prepare_send"]
                assert names(await support.list_tools()) == support_before
                changed = anyio.Event()
            finally:
                await anyio.to_thread.run_sync(
                    set_connection, served["store"], "sales_mailbox", "restore"
                )
            with anyio.fail_after(INNER_HANG_SECONDS):
                await changed.wait()
            assert names(await sales.list_tools()) == before

    bounded(test)


def test_a_revoked_connection_reaches_a_2026_listen_stream_over_http(served: dict[str, Any]):
    async def test() -> None:
        async with http_session(served["url"], TOKENS["carol"], mode="auto") as client:
            assert client.protocol_version == "2026-07-28"
            before = names(await client.list_tools())
            async with client.listen(tools_list_changed=True) as subscription:
                await anyio.to_thread.run_sync(
                    set_connection, served["store"], "sales_mailbox", "revoke"
                )
                try:
                    with anyio.fail_after(INNER_HANG_SECONDS):
                        await subscription.__anext__()
                    assert "quote.prepare_send" not in names(await client.list_tools())
                finally:
                    await anyio.to_thread.run_sync(
                        set_connection, served["store"], "sales_mailbox", "restore"
                    )
                with anyio.fail_after(INNER_HANG_SECONDS):
                    await subscription.__anext__()
                assert names(await client.list_tools()) == before

    bounded(test)


def test_watches_end_with_their_sessions(served: dict[str, Any]):
    server: HttpServer = served["server"]

    def count(words: str) -> int:
        return server.stderr.count(words)

    async def test() -> None:
        started = count("watching the tools visible to")

        async def all_watching() -> None:
            # Until the server's log (read by a thread) has every watch started: a
            # stream left before its watch started would not show one.
            while count("watching the tools visible to") - started < 2 * len(BINDINGS):
                await anyio.sleep(0.05)

        async with anyio.create_task_group() as tasks:
            for name in BINDINGS:

                async def handshake(token: str = TOKENS[name]) -> None:
                    async with http_session(served["url"], token) as client:
                        await client.list_tools()
                        await client.list_tools()  # one watch per session, not per list

                async def listen(token: str = TOKENS[name]) -> None:
                    async with (
                        http_session(served["url"], token, mode="auto") as client,
                        client.listen(tools_list_changed=True),
                    ):
                        await all_watching()

                tasks.start_soon(handshake)
                tasks.start_soon(listen)
        with anyio.fail_after(INNER_HANG_SECONDS):
            while count("the watch of the tools visible to") < count(
                "watching the tools visible to"
            ):
                await anyio.sleep(0.05)
        assert count("watching the tools visible to") - started == 2 * len(BINDINGS)

    bounded(test)


# ------------------------------------------------------------------ tokens stay here


def test_inbound_tokens_reach_no_tool_no_log_and_no_ledger_row(served: dict[str, Any]):
    async def test() -> None:
        for name in BINDINGS:
            for mode in MODES:
                async with http_session(served["url"], TOKENS[name], mode=mode) as client:
                    await client.list_tools()
                    await client.call_tool("contact.read", {"contact_id": "c-42"})
                    await client.call_tool("contact.read", {"contact_id": "c-99"})

    bounded(test)
    seen = records(served["record"])
    assert len(seen) >= len(BINDINGS) * len(MODES)
    server: HttpServer = served["server"]
    rows = "\n".join(row.model_dump_json() for row in ledger(served["store"]))
    # What the tools were given: parameters, the whole CallContext, the credential
    # they were handed (the connection's secret, not the caller's token) and their
    # process's environment.
    handed = json.dumps(seen)
    assert "sales-bot/sales" in rows
    assert "support-bot/support" in rows
    for token in TOKENS.values():
        assert token not in handed
        assert token not in server.stderr
        assert token not in rows
    assert {r["context"]["credential"] for r in seen} == {"crm-secret-7f3a"}
    assert {r["access_token"].count("client_id='") for r in seen} == {1}  # a name, no token
    assert "DEBUG" in server.stderr  # the search covered debug lines too
