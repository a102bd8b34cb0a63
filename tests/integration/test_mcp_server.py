"""``capgate serve --stdio`` against the official MCP client, over real processes.

Each test starts ``capgate serve`` through the ``mcp`` package's own stdio client (or,
for the byte-level checks, writes JSON-RPC lines to the process itself), with the
demo's sales catalogue, a real embedded OPA and a SQLite store in a temporary
folder; both protocol eras are exercised: the 2025-11-25 ``initialize`` handshake
(``legacy``) and 2026-07-28 (``auto`` negotiates it with this server).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import yaml
from mcp.shared.exceptions import MCPError

from capgate.adapters.fronts.mcp.config import Binding, parse_config, token_digest
from capgate.adapters.fronts.mcp.desk_tools import DESK_PREFIX
from capgate.cli.main import main
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import ConfigError
from capgate.gateway.opa.bundle import write_bundle
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import open_store
from capgate.gateway.state.records import LedgerEntry
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.mcp_server_support import (
    CAPGATE,
    FINANCE_BOT,
    MODES,
    ROOT,
    SALES,
    SALES_BOT,
    SECRETS,
    SUPPORT_BOT,
    Mode,
    RecordingDesk,
    bounded,
    hold_slow,
    ledger,
    listed_names,
    opa_at,
    records,
    release_slow,
    run_capgate,
    seed_store,
    serve_args,
    server_env,
    set_connection,
    slow_entered,
    stdio_session,
    write_config,
)
from tests.integration.opa_servers import free_port

pytestmark = pytest.mark.integration

#: Every test's own bound, under pytest's timeout: nothing may hang (tests/hang.py).
BOUND = HANG_SECONDS


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("serve-stdio")
    store = seed_store(folder / "state.db")
    # The finance server also names an upstream MCP server; the sales catalogue maps no
    # tool to it, so it is never started: its adapter must not get in the way.
    ghost = "ghost=python -m tests.integration.no_such_server"
    configs = {
        name: write_config(
            folder / f"{name}.yaml", stdio=bound, upstreams=ghost if name == "finance" else None
        )
        for name, bound in (
            ("sales", SALES_BOT),
            ("support", SUPPORT_BOT),
            ("finance", FINANCE_BOT),
        )
    }
    return {
        "folder": folder,
        "store": store,
        "configs": configs,
        "record": folder / "record.jsonl",
        "errlog": folder / "stderr.log",
    }


@pytest.fixture(scope="module")
def expected(state: dict[str, Any], sales_sidecar: PolicySidecar) -> dict[str, list[str]]:
    """What Gateway.compose makes visible to each binding, asked in this process."""
    catalogue = load_catalogue(SALES)
    store = open_store(state["store"])
    try:
        gateway = Gateway(
            catalogue, sales_sidecar.client, ToolRegistry(RecordingDesk().tools()), store
        )
        # The composed set, then the server's own tools for the binding (desk_tools).
        return {
            name: listed_names(gateway, Binding.model_validate(bound))
            for name, bound in (
                ("sales", SALES_BOT),
                ("support", SUPPORT_BOT),
                ("finance", FINANCE_BOT),
            )
        }
    finally:
        store.close()


def session(state: dict[str, Any], who: str = "sales", mode: Mode = "legacy", **kw: Any) -> Any:
    return stdio_session(
        state["store"], state["configs"][who], state["record"], state["errlog"], mode=mode, **kw
    )


# ------------------------------------------------------------------ tools/list


@pytest.mark.parametrize("mode", MODES)
def test_lists_exactly_the_composed_set_with_the_catalogues_definitions(
    state: dict[str, Any], expected: dict[str, list[str]], mode: Mode
):
    catalogue = load_catalogue(SALES)

    async def one(who: str) -> None:
        async with session(state, who, mode) as client:
            listed = (await client.list_tools()).tools
        assert [tool.name for tool in listed] == expected[who]
        for tool in listed:
            if tool.name.startswith(DESK_PREFIX):
                continue  # the server's own (test_mcp_review_tools.py)
            contract = catalogue.tools[tool.name]
            assert tool.description is not None
            assert tool.description.startswith(contract.description.strip())
            assert "UPSTREAM" not in tool.description
            assert tool.input_schema == contract.input_schema
            assert (tool.output_schema is None) is contract.needs_review

    async def test() -> None:
        async with anyio.create_task_group() as tasks:
            for who in ("sales", "support", "finance"):
                tasks.start_soon(one, who)
        assert "payment.execute" not in expected["sales"]
        assert "payment.execute" in expected["finance"]

    bounded(test)


# ------------------------------------------------------------------ tools/call


@pytest.mark.parametrize("mode", MODES)
def test_calls_go_through_the_gateway_and_come_back_as_tool_results(
    state: dict[str, Any], mode: Mode
):
    async def test() -> None:
        async with session(state, "sales", mode) as client:
            read = await client.call_tool("contact.read", {"contact_id": "c-42"})
            assert read.is_error is False
            assert read.structured_content == {
                "contact_id": "c-42", "name": "Ada Lovelace", "email": "ada@example.test"
            }  # fmt: skip
            assert json.loads(read.content[0].text) == read.structured_content  # type: ignore[union-attr]
            outcome = (read.meta or {})["capgate/outcome"]
            assert outcome["status"] == "success"
            assert outcome["decision_id"]

            proposed = await client.call_tool(
                "quote.propose",
                {"opportunity_id": "opp-17", "amount_cents": 1200, "currency": "EUR"},
            )
            assert proposed.is_error is False
            pending = proposed.structured_content or {}
            assert pending["status"] == "pending_review"  # a reviewed tool: no output schema
            assert (proposed.meta or {})["capgate/outcome"] == pending
            assert "quote.record_reviewed" not in [r["name"] for r in records(state["record"])]

            # The facts of an answer are in _meta; structuredContent is only ever what
            # the tool's output schema admits, so an error for contact.read has none.
            denied = await client.call_tool("contact.read", {"contact_id": "c-99"})
            assert denied.is_error is True
            assert denied.structured_content is None
            assert (denied.meta or {})["capgate/outcome"] == {
                "error": "capability_denied",
                "reason_codes": ["subject_out_of_scope"],
                "message": denied.content[0].text,  # type: ignore[union-attr]
            }
            assert "Traceback" not in denied.content[0].text  # type: ignore[union-attr]

            refused = await client.call_tool(
                "contact.verify_email", {"contact_id": "c-77", "email": "cb@example.test"}
            )
            assert refused.is_error is True
            assert refused.structured_content is None
            refusal = (refused.meta or {})["capgate/outcome"]
            assert refusal["error"] == "tool_refused"
            assert refusal["tool_error"] == "the contact's email address is not verified"
            assert refusal["operation_id"] in refused.content[0].text  # type: ignore[union-attr]

        store = open_store(state["store"])
        try:
            with store.transaction(read_only=True) as tx:
                proposal = tx.get_proposal(pending["proposal_id"])
        finally:
            store.close()
        assert proposal is not None
        assert proposal.status.value == "pending"
        assert proposal.proposer.agent == "sales-bot"  # the config's principal
        rows = [r for r in ledger(state["store"]) if r.operation_id == outcome["operation_id"]]
        assert {r.principal for r in rows} == {"sales-bot/sales"}
        assert [r.kind for r in rows] == ["intent", "outcome"]

    bounded(test)


@pytest.mark.parametrize("mode", MODES)
def test_invalid_arguments_name_the_field_not_the_value(state: dict[str, Any], mode: Mode):
    secret = "sk-live-do-not-echo-4242"

    async def test() -> None:
        async with session(state, "sales", mode) as client:
            wrong_type = await client.call_tool("contact.read", {"contact_id": [secret]})
            bad_pattern = await client.call_tool("contact.read", {"contact_id": f"!{secret}"})
            missing = await client.call_tool("contact.read", {})
            extra = await client.call_tool("contact.read", {"contact_id": "c-42", "tenant": secret})
        for result, words in (
            (wrong_type, ["'contact_id'", "'type' rule"]),
            (bad_pattern, ["'contact_id'", "pattern"]),
            (missing, ["missing required field(s) 'contact_id'"]),
            (extra, ["'tenant'"]),
        ):
            assert result.is_error is True
            assert result.structured_content is None
            assert (result.meta or {})["capgate/outcome"]["error"] == "input_invalid"
            text = result.model_dump_json()
            assert all(word in text for word in words), text
            assert secret not in text
        assert not [r for r in records(state["record"]) if secret in json.dumps(r["params"])]

    bounded(test)


# ------------------------------------------------------- hidden = nonexistent, bytes


class RawStdio:
    """``capgate serve --stdio`` driven with JSON-RPC lines, reading raw answer bytes."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [str(CAPGATE), *serve_args(state["store"], state["configs"]["sales"], "--stdio")],
            cwd=ROOT,
            env=server_env(state["record"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, request_id: int) -> bytes:
        """The raw line answering ``request_id`` (notifications in between skipped)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + INNER_HANG_SECONDS
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1)
            if ready:
                line = self.proc.stdout.readline()
                assert line, "the server closed its stdout"
                if json.loads(line).get("id") == request_id:
                    return line
        raise AssertionError(f"no answer within {INNER_HANG_SECONDS:g} s")

    def call(self, request_id: int, name: str, arguments: dict[str, Any]) -> bytes:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments}})  # fmt: skip
        return self.answer(request_id)

    def close(self) -> int:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=HANG_SECONDS)  # asserted: it must exit
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()


def test_a_hidden_tool_and_a_missing_one_get_the_same_bytes(state: dict[str, Any]):
    def unseen() -> list[LedgerEntry]:
        return [e for e in ledger(state["store"]) if e.reason_codes == ["unknown_tool"]]

    before = len(unseen())
    raw = RawStdio(state)
    try:
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}})  # fmt: skip
        assert b'"tools":{"listChanged":true}' in raw.answer(1)
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        payment = {"invoice_id": "inv-9", "amount_cents": 5, "currency": "EUR",
                   "beneficiary": "DE44500105175407324931"}  # fmt: skip
        answers = {
            "hidden (payment.execute, valid arguments)": raw.call(2, "payment.execute", payment),
            "hidden, invalid arguments": raw.call(2, "payment.execute", {"x": [1]}),
            "no such tool": raw.call(2, "no.such.tool", payment),
            "no such tool, a long name": raw.call(2, "z" * 5000, {}),
        }
        visible = raw.call(2, "contact.read", {"contact_id": "c-42"})
    finally:
        assert raw.close() == 0  # stdin closed: the server ends cleanly
    first = answers["hidden (payment.execute, valid arguments)"]
    result = json.loads(first)["result"]
    assert result["_meta"]["capgate/outcome"]["error"] == "unknown_tool"
    assert "structuredContent" not in result  # whatever schema the name had been listed with
    assert all(answer == first for answer in answers.values()), answers
    assert visible != first
    assert "payment.execute" not in [r["name"] for r in records(state["record"])]
    # Each attempt is in the ledger alike, hidden or missing; an odd name as a digest.
    attempts = unseen()[before:]
    assert [(e.kind, e.outcome, e.tool, e.principal) for e in attempts] == [
        ("decision", "denied", "payment.execute", "sales-bot/sales"),
        ("decision", "denied", "payment.execute", "sales-bot/sales"),
        ("decision", "denied", "no.such.tool", "sales-bot/sales"),
        ("decision", "denied", None, "sales-bot/sales"),
    ]
    assert attempts[3].detail["tool_digest"].startswith("sha256:")
    assert "z" * 100 not in json.dumps([e.model_dump(mode="json") for e in attempts])


def test_hidden_and_missing_tools_look_alike_on_2026_connections_too(state: dict[str, Any]):
    async def test() -> None:
        async with session(state, "sales", "auto") as client:
            assert client.protocol_version == "2026-07-28"
            hidden = await client.call_tool("payment.execute", {})
            missing = await client.call_tool("no.such.tool", {})
        assert hidden.model_dump_json() == missing.model_dump_json()
        assert hidden.is_error is True

    bounded(test)


# ------------------------------------------------------------------ list_changed


def test_a_revoked_connection_notifies_the_handshake_client(state: dict[str, Any]):
    changes: list[float] = []
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changes.append(time.monotonic())
            changed.set()

    async def test() -> None:
        nonlocal changed
        async with session(state, "sales", "legacy", message_handler=on_message) as client:
            before = [t.name for t in (await client.list_tools()).tools]
            assert "quote.prepare_send" in before
            await anyio.to_thread.run_sync(
                set_connection, state["store"], "sales_mailbox", "revoke"
            )
            try:
                with anyio.fail_after(INNER_HANG_SECONDS):
                    await changed.wait()
                after = [t.name for t in (await client.list_tools()).tools]
                assert after == [name for name in before if name != "quote.prepare_send"]
                changed = anyio.Event()
            finally:
                await anyio.to_thread.run_sync(
                    set_connection, state["store"], "sales_mailbox", "restore"
                )
            with anyio.fail_after(INNER_HANG_SECONDS):
                await changed.wait()
            assert [t.name for t in (await client.list_tools()).tools] == before
            assert len(changes) == 2  # one per change, no repeats

    bounded(test)


def test_a_revoked_connection_reaches_a_2026_listen_stream(state: dict[str, Any]):
    async def test() -> None:
        async with session(state, "sales", "auto") as client:
            before = [t.name for t in (await client.list_tools()).tools]
            async with client.listen(tools_list_changed=True) as subscription:
                assert subscription.honored.tools_list_changed is True
                await anyio.to_thread.run_sync(
                    set_connection, state["store"], "sales_mailbox", "revoke"
                )
                try:
                    with anyio.fail_after(INNER_HANG_SECONDS):
                        event = await subscription.__anext__()
                    assert type(event).__name__ == "ToolsListChanged"
                    after = [t.name for t in (await client.list_tools()).tools]
                    assert "quote.prepare_send" in before
                    assert "quote.prepare_send" not in after
                finally:
                    await anyio.to_thread.run_sync(
                        set_connection, state["store"], "sales_mailbox", "restore"
                    )
                with anyio.fail_after(INNER_HANG_SECONDS):
                    await subscription.__anext__()

    bounded(test)


def test_a_replaced_policy_bundle_is_announced_and_fails_closed(
    state: dict[str, Any], tmp_path: Path
):
    """An operator's OPA restarted with another catalogue's bundle: the server obeys it
    in nothing (every decision fails closed), so the client is told its tools went
    away, and told again when the right bundle is back."""
    other = tmp_path / "other-catalogue"
    shutil.copytree(SALES, other)
    tools = other / "tools.yaml"
    document = yaml.safe_load(tools.read_text())
    for contract in document["tools"]:
        if contract["name"] == "contact.read":
            contract["roles"] = ["support"]  # policy data: another catalogue digest
    tools.write_text(yaml.safe_dump(document))
    ours = write_bundle(load_catalogue(SALES), tmp_path / "ours")
    theirs = write_bundle(load_catalogue(other), tmp_path / "theirs")
    address = f"http://127.0.0.1:{free_port()}"
    changed = anyio.Event()
    entered = len(records(state["record"]))

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def test() -> None:
        nonlocal changed
        with contextlib.ExitStack() as first_opa:
            first_opa.enter_context(opa_at(address, ours, tmp_path / "ours.log"))
            async with session(
                state, "sales", "legacy", message_handler=on_message, extra=("--opa", address)
            ) as client:
                before = [t.name for t in (await client.list_tools()).tools]
                assert before
                first_opa.close()  # the operator stops OPA, and starts it with another bundle
                with opa_at(address, theirs, tmp_path / "theirs.log"):
                    with anyio.fail_after(INNER_HANG_SECONDS):
                        await changed.wait()
                    changed = anyio.Event()
                    with pytest.raises(MCPError, match="policy_unavailable"):
                        await client.list_tools()
                    refused = await client.call_tool("contact.read", {"contact_id": "c-42"})
                    assert (refused.meta or {})["capgate/outcome"]["error"] == "policy_unavailable"
                    assert refused.structured_content is None
                with opa_at(address, ours, tmp_path / "ours-again.log"):
                    with anyio.fail_after(INNER_HANG_SECONDS):
                        await changed.wait()
                    assert [t.name for t in (await client.list_tools()).tools] == before

    bounded(test)
    assert len(records(state["record"])) == entered, "no tool ran while OPA was foreign"


# ------------------------------------------------------------------ concurrency


def test_a_slow_tool_does_not_hold_up_the_same_session(state: dict[str, Any]):
    # The slow read is held in its tool until the test lets it go: the fast calls of
    # the same session must all finish meanwhile, however slow the machine is.
    async def test() -> None:
        async with session(state, "sales", "legacy") as client:
            await client.list_tools()
            slow_done: list[bool] = []

            async def slow() -> None:
                result = await client.call_tool("contact.read", {"contact_id": "c-slow"})
                assert result.is_error is False
                slow_done.append(True)

            before = hold_slow(state["record"])
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(slow)
                await slow_entered(state["record"], before)  # the slow call is in its tool now
                for _ in range(3):
                    assert (await client.list_tools()).tools
                    fast = await client.call_tool("contact.read", {"contact_id": "c-42"})
                    assert fast.is_error is False
                assert not slow_done, "the fast calls should finish while the slow one runs"
                release_slow(state["record"])
            assert slow_done == [True]

    bounded(test)


def test_several_stdio_servers_serve_their_own_principals_at_once(
    state: dict[str, Any], expected: dict[str, list[str]]
):
    seen: dict[str, list[str]] = {}

    async def one(who: str, mode: Mode) -> None:
        async with session(state, who, mode) as client:
            seen[f"{who}/{mode}"] = [t.name for t in (await client.list_tools()).tools]
            name = "contact.read" if who != "finance" else "invoice.check_approval"
            params = {"contact_id": "c-42"} if who != "finance" else {"invoice_id": "inv-9"}
            assert name in expected[who]
            result = await client.call_tool(name, params)
            assert result.is_error is False, result.structured_content

    async def test() -> None:
        async with anyio.create_task_group() as tasks:
            for who in ("sales", "support", "finance"):
                for mode in MODES:
                    tasks.start_soon(one, who, mode)

    bounded(test)
    assert seen == {f"{w}/{m}": expected[w] for w in ("sales", "support", "finance") for m in MODES}


# ------------------------------------------------------------------ the command


def test_the_configuration_is_read_strictly():
    digest = token_digest("tok-1")
    good = {
        "tools": "capgate.demo.tools.sales_desk:SalesDesk",
        "http": [{"name": "a", "token_sha256": digest, **SALES_BOT},
                 {"name": "b", "token_sha256": token_digest("tok-2"), **SUPPORT_BOT}],
    }  # fmt: skip
    config = parse_config(json.dumps(good))
    assert config.token_binding("tok-1") is config.http[0]
    assert config.token_binding("tok-2") is config.http[1]
    assert config.token_binding("tok-3") is None
    assert config.token_binding("") is None
    assert [type(adapter).__name__ for adapter in config.adapters()] == ["InProcessTools"]

    def refused(change: dict[str, Any], words: str) -> None:
        with pytest.raises(ConfigError) as caught:
            parse_config(json.dumps({**good, **change}), "serve.yaml")
        assert words in str(caught.value), str(caught.value)
        assert "tok-1" not in str(caught.value)

    first = good["http"][0]
    refused({"http": [first, {**first, "name": "c"}]}, "the same token digest is given twice")
    refused({"http": [first, {**good["http"][1], "name": "a"}]}, "the same name is given twice")
    refused({"http": [{**first, "token_sha256": digest.upper()}]}, "token_sha256")
    refused({"http": [{**first, "token": "tok-1"}]}, "token")
    refused({"http": [{**first, "principal": {**first["principal"], "admin": True}}]}, "admin")
    refused({"http": [{**first, "task": {"type": "customer_quote"}}]}, "needs an id")
    refused({"tools": "no_colon_here"}, "not an entry point")
    refused({"role": "sales"}, "role")
    upstreams = parse_config(
        json.dumps({**good, "upstreams": "time=mcp-server-time :: http://127.0.0.1:8931/mcp"})
    ).upstream_servers()
    assert [server.id for server in upstreams] == ["time", "127.0.0.1-8931"]
    refused({"upstreams": "http://mcp.example.com/mcp"}, "on this machine")
    with pytest.raises(ConfigError, match="cannot import"):
        parse_config(json.dumps({**good, "tools": "no.such.module:Thing"})).adapters()
    with pytest.raises(ConfigError, match="is given twice"):
        parse_config("tools: a:b\ntools: c:d\n")


def test_the_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    section = out[out.index("exit status") :]
    assert [line.split()[0] for line in section.splitlines()[1:] if line.strip()] == [
        "0", "2", "130"
    ]  # fmt: skip
    assert "docs/mcp-server.md" in out


def test_the_command_refuses_what_it_cannot_serve_safely(state: dict[str, Any], tmp_path: Path):
    store = state["store"]
    http_only = write_config(tmp_path / "http-only.yaml", http={"a": ("tok", SALES_BOT)})
    globex = {"agent": "x", "role": "sales", "tenant": "globex"}
    stranger = write_config(tmp_path / "stranger.yaml", stdio={**SALES_BOT, "principal": globex})
    writable = write_config(tmp_path / "writable.yaml", stdio=SALES_BOT)
    writable.chmod(0o666)
    twice = tmp_path / "twice.yaml"
    twice.write_text(
        "tools: capgate.demo.tools.sales_desk:SalesDesk\n"
        "stdio:\n  principal: {agent: a, role: sales, tenant: acme, role: finance}\n"
    )
    twice.chmod(0o600)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **SECRETS}
    cases = {
        "no stdio binding": (serve_args(store, http_only), "serve_config_invalid"),
        "unknown tenant": (serve_args(store, stranger), "unknown_tenant"),
        "others may write the config": (serve_args(store, writable), "chmod go-w"),
        "a key twice": (serve_args(store, twice), "'role' is given twice"),
        "all interfaces": (
            serve_args(store, http_only, "--http", "0.0.0.0:0"),
            "loopback only",
        ),
        "another host": (serve_args(store, http_only, "--http", "192.0.2.1:8765"), "loopback"),
        "a host name": (serve_args(store, http_only, "--http", "localhost:8765"), "no host names"),
        "no store there": (
            serve_args(str(tmp_path / "nothing.db"), writable.with_name("x")),
            "cannot read",
        ),
    }
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        done_by_case = dict(
            zip(
                cases,
                pool.map(lambda case: run_capgate(*case[0], env=env), cases.values()),
                strict=True,
            )
        )
    for what, (_, words) in cases.items():
        done = done_by_case[what]
        assert done.returncode == 2, f"{what}: {done.returncode}\n{done.stderr}"
        assert done.stderr.startswith("capgate: error"), f"{what}: {done.stderr}"
        assert words in done.stderr, f"{what}: {done.stderr}"
        assert "Traceback" not in done.stderr, what
        assert done.stdout == "", what
