"""Upstream MCP servers behind capgate: real peers, pinned definitions, typed outcomes.

Every test runs a real OPA (``PolicySidecar``) and real server processes, over stdio
or streamable HTTP on 127.0.0.1, with every wait bounded. Covered:

- real third-party servers as upstreams (``server-everything``, ``server-filesystem``
  from npm, ``mcp-server-time`` from PyPI in its own venv): read tools visible to a
  role granted read; a write tool hidden from a read-only role and denied when it
  calls it (the file is not written), allowed for the writer (it is);
- nothing runs before a person accepts a definition (``tool_quarantined``), and the
  acceptance maps it to the catalogue contract, whatever the server's hints say;
- a denied call never starts a stdio server or opens a connection to a URL;
- a definition that changes on a running server (``notifications/tools/list_changed``,
  on 2026-07-28 listen streams and on the handshake-era wire, and over HTTP)
  quarantines the tool in compose and execute until ``capgate mcp accept``; a call
  already running finishes on its version; every call's ledger rows carry the
  digest of the definition it ran under;
- arguments that break the accepted upstream schema are refused with nothing sent;
  timeouts, a server that dies mid-call, malformed answers and tool errors end in
  the typed outcomes, within the bound.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from capgate import CapabilityViolation
from capgate.adapters.tools.mcp.config import ServerSpec
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.state.records import PinStatus
from tests.hang import HANG_SECONDS
from tests.integration.mcp_upstream_support import (
    EVERYTHING,
    FILESYSTEM,
    GIT,
    TIME,
    ConnectionCounter,
    Harness,
    contract,
    free_port,
    own_server,
    require_peers,
    upstream_tool,
    wait_for,
    write_spec,
)

pytestmark = pytest.mark.integration


def _call(harness: Harness, role: str, tool: str, **params: Any) -> Outcome:
    answer = harness.gateway.call(harness.request(role), tool, params)
    assert isinstance(answer, Outcome), answer
    return answer


def _denied(harness: Harness, role: str, tool: str, **params: Any) -> list[str]:
    with pytest.raises(CapabilityViolation) as caught:
        harness.gateway.call(harness.request(role), tool, params)
    return caught.value.reason_codes


def _ledger_definitions(harness: Harness, tool: str) -> list[tuple[str, str | None]]:
    """(kind, definition digest) of the tool's intent and outcome rows, in order."""
    return [
        (row.kind, row.detail.get("definition"))
        for row in harness.store.ledger()
        if row.tool == tool and row.kind in ("intent", "outcome")
    ]


# -- real peers --------------------------------------------------------------------------


def test_real_peers_read_for_readers_write_hidden_and_denied(tmp_path: Path):
    require_peers(EVERYTHING, FILESYSTEM, TIME)
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("hello from the filesystem peer\n", encoding="utf-8")
    servers = [
        ServerSpec("everything", command=(str(EVERYTHING), "stdio")),
        ServerSpec("files", command=(str(FILESYSTEM), str(root))),
        ServerSpec("time", command=(str(TIME),)),
    ]
    tools = [
        contract(
            "peer.echo",
            "everything",
            "echo",
            input_schema={
                "type": "object",
                "properties": {"message": {"type": "string"}},
                "required": ["message"],
                "additionalProperties": False,
            },
        ),
        contract("peer.sum", "everything", "get-sum"),
        contract("peer.time", "time", "get_current_time"),
        contract("files.read", "files", "read_text_file"),
        contract(
            "files.write",
            "files",
            "write_file",
            roles=["writer"],
            mode="write",
            idempotency="not_idempotent",
            recovery="inspect_the_file",
        ),
    ]
    with Harness(tmp_path, tools, servers) as harness:
        # Before any review nothing upstream is visible, or callable.
        before = harness.compose("writer")
        assert before.visible == []
        assert {name: before.reasons_for(name) for name in before.excluded} == {
            t["name"]: ["tool_quarantined"] for t in tools
        }
        assert _denied(harness, "reader", "peer.echo", message="hi") == ["tool_quarantined"]

        code, out = harness.cli(
            "mcp",
            "discover",
            env={"MCP_SERVERS": " :: ".join(f"{s.id}={s.describe()}" for s in servers)},
        )
        assert code == 0, out
        assert "pending   echo" in out
        assert "pending   write_file" in out
        assert "pending   get_current_time" in out
        # The filesystem server calls write_file destructive; the catalogue's contract,
        # not this hint, is what decides.
        write_hint = harness.pin("files", "write_file")
        assert write_hint is not None
        assert write_hint.observed_definition is not None
        assert write_hint.observed_definition["annotations"]["readOnlyHint"] is False
        for server, tool, as_tool in (
            ("everything", "echo", "peer.echo"),
            ("everything", "get-sum", "peer.sum"),
            ("time", "get_current_time", "peer.time"),
            ("files", "read_text_file", "files.read"),
            ("files", "write_file", "files.write"),
        ):
            assert harness.accept(server, tool, as_tool).status is PinStatus.ACCEPTED

        reader = harness.compose("reader")
        assert sorted(reader.visible) == ["files.read", "peer.echo", "peer.sum", "peer.time"]
        assert reader.reasons_for("files.write") == ["role_not_granted"]
        assert "files.write" in harness.compose("writer").visible

        echo = _call(harness, "reader", "peer.echo", message="hi")
        assert echo.status is OutcomeStatus.SUCCESS
        assert echo.result == {"content": [{"type": "text", "text": "Echo: hi"}], "untrusted": True}
        total = _call(harness, "reader", "peer.sum", a=2, b=3)
        assert total.ok
        assert "5" in json.dumps(total.result)
        now = _call(harness, "reader", "peer.time", timezone="Etc/UTC")
        assert now.ok
        assert now.result is not None
        assert now.result["timezone"] == "Etc/UTC"
        read = _call(harness, "reader", "files.read", path=str(root / "notes.txt"))
        assert read.ok
        assert "hello from the filesystem peer" in json.dumps(read.result)

        target = root / "written.txt"
        codes = _denied(harness, "reader", "files.write", path=str(target), content="x")
        assert codes == ["role_not_granted"]
        assert not target.exists()
        wrote = _call(harness, "writer", "files.write", path=str(target), content="by the writer")
        assert wrote.ok, wrote
        assert target.read_text(encoding="utf-8") == "by the writer"

        # Every run's intent and outcome rows name the definition it ran under.
        accepted = harness.pin("files", "write_file")
        assert accepted is not None
        assert _ledger_definitions(harness, "files.write") == [
            ("intent", accepted.accepted_digest),
            ("outcome", accepted.accepted_digest),
        ]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=True,
    )
    return done.stdout


def test_a_second_real_peer_git_reads_for_readers_commits_only_for_writers(tmp_path: Path):
    require_peers(GIT)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.name", "Capgate Test")
    _git(repo, "config", "user.email", "test@capgate.invalid")
    (repo / "README").write_text("first\n", encoding="utf-8")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "first")
    server = ServerSpec("git", command=(str(GIT), "--repository", str(repo)))
    tools = [
        contract("git.status", "git", "git_status"),
        contract("git.log", "git", "git_log"),
        contract("git.add", "git", "git_add", roles=["writer"], mode="write"),
        contract(
            "git.commit",
            "git",
            "git_commit",
            roles=["writer"],
            mode="write",
            idempotency="not_idempotent",
            recovery="inspect_the_log",
        ),
    ]
    with Harness(tmp_path, tools, [server]) as harness:
        code, out = harness.cli("mcp", "discover", "--servers", f"git={server.describe()}")
        assert code == 0, out
        for entry in tools:
            harness.accept("git", entry["upstream"]["tool"], entry["name"])
        reader = harness.compose("reader")
        assert sorted(reader.visible) == ["git.log", "git.status"]
        assert reader.reasons_for("git.commit") == ["role_not_granted"]
        assert reader.reasons_for("git.add") == ["role_not_granted"]

        (repo / "NEW").write_text("second\n", encoding="utf-8")
        status = _call(harness, "reader", "git.status", repo_path=str(repo))
        assert status.ok
        assert "NEW" in json.dumps(status.result)
        assert _denied(harness, "reader", "git.add", repo_path=str(repo), files=["NEW"]) == [
            "role_not_granted"
        ]
        codes = _denied(harness, "reader", "git.commit", repo_path=str(repo), message="no")
        assert codes == ["role_not_granted"]
        assert _git(repo, "rev-list", "--count", "HEAD").strip() == "1"

        assert _call(harness, "writer", "git.add", repo_path=str(repo), files=["NEW"]).ok
        committed = _call(harness, "writer", "git.commit", repo_path=str(repo), message="second")
        assert committed.ok, committed
        assert _git(repo, "rev-list", "--count", "HEAD").strip() == "2"
        log = _call(harness, "reader", "git.log", repo_path=str(repo))
        assert "second" in json.dumps(log.result)


# -- a denied call touches no server ----------------------------------------------------------


def test_a_denied_call_never_starts_or_contacts_a_server(tmp_path: Path):
    spec = write_spec(tmp_path / "spec.json", [upstream_tool("echo", "Echo.", {"echo": True})])
    started = tmp_path / "started.txt"
    calls = tmp_path / "calls.txt"
    counter = ConnectionCounter()
    servers = [
        own_server("local", spec, started=started, calls=calls),
        ServerSpec("remote", url=f"http://127.0.0.1:{counter.port}/mcp"),
    ]
    tools = [
        contract("local.echo", "local", "echo", roles=["writer"]),
        contract("remote.echo", "remote", "echo", roles=["writer"]),
    ]
    definition = {
        "name": "echo",
        "title": None,
        "description": "Echo.",
        "inputSchema": {"type": "object"},
        "outputSchema": None,
        "annotations": None,
    }
    try:
        with Harness(tmp_path, tools, servers) as harness:
            # Definitions accepted from a listing recorded earlier: no server was needed.
            with harness.store.transaction() as tx:
                for server in ("local", "remote"):
                    pin = tx.observe_pin(server, "echo", definition)
                    tx.accept_pin(
                        server,
                        "echo",
                        digest=str(pin.observed_digest),
                        catalogue_tool=f"{server}.echo",
                        by="maria",
                    )
            assert sorted(harness.compose("writer").visible) == ["local.echo", "remote.echo"]
            for tool in ("local.echo", "remote.echo"):
                assert _denied(harness, "reader", tool, message="x") == ["role_not_granted"]
            time.sleep(0.5)
            assert not started.exists(), "a denied call started the server"
            assert counter.accepted == 0, "a denied call connected to the URL"

            # The same calls, allowed: the server starts; the URL is contacted.
            assert _call(harness, "writer", "local.echo", message="x").ok
            assert len(started.read_text().splitlines()) == 1
            assert calls.read_text().splitlines() == ['echo {"message": "x"}']
            # Not an MCP server: refused at once, not by a deadline (nor how soon).
            unreachable = _call(harness, "writer", "remote.echo", message="x")
            assert unreachable.status is OutcomeStatus.RETRYABLE
            assert "nothing was sent" in (unreachable.error or "")
            assert counter.accepted >= 1
    finally:
        counter.close()


# -- a definition that changes upstream ----------------------------------------------------------


def _echo_v(version: int, **behaviour: Any) -> dict[str, Any]:
    return upstream_tool(
        "echo",
        f"Echo the message back (version {version}).",
        behaviour or {"echo": True},
        input_schema={
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
        output_schema={
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
        annotations={"readOnlyHint": True},
    )


@pytest.mark.parametrize(
    "transport", ["stdio", "stdio-handshake-era", "streamable-http"], ids=lambda t: t
)
def test_a_changed_definition_is_quarantined_until_accepted_again(tmp_path: Path, transport: str):
    spec = write_spec(tmp_path / "spec.json", [_echo_v(1)])
    process = None
    if transport == "streamable-http":
        import sys

        from tests.integration.mcp_upstream_support import SERVER_SCRIPT

        port = free_port()
        process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), str(spec), "--http", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        server = ServerSpec("test", url=f"http://127.0.0.1:{port}/mcp")
        wait_for(lambda: _listening(port), what="the HTTP server")
    else:
        server = own_server("test", spec)
    mode = "legacy" if transport == "stdio-handshake-era" else "auto"
    tools = [contract("test.echo", "test", "echo")]
    try:
        with Harness(tmp_path, tools, [server], mode=mode) as harness:
            harness.discover("test")
            first = harness.accept("test", "echo", "test.echo")
            assert _call(harness, "reader", "test.echo", message="one").result == {"message": "one"}

            # The server changes its tool while the session is open and says so.
            write_spec(spec, [_echo_v(2)])
            changed = wait_for(
                lambda: (p := harness.pin("test", "echo")) and p.status is PinStatus.CHANGED and p,
                what="the change to be recorded",
            )
            assert changed.observed_digest != first.accepted_digest
            composed = harness.compose("reader")
            assert composed.visible == []
            assert composed.reasons_for("test.echo") == ["tool_quarantined"]
            assert _denied(harness, "reader", "test.echo", message="two") == ["tool_quarantined"]

            code, out = harness.cli("mcp", "pending")
            assert code == 0, out
            assert "changed upstream since it was accepted" in out
            assert "-  Echo the message back (version 1)." in out
            assert "+  Echo the message back (version 2)." in out
            # Accepting the definition that was shown before is refused: exit 3.
            code, out = harness.cli(
                "mcp",
                "accept",
                "test",
                "echo",
                "--as",
                "test.echo",
                "--catalogue",
                str(harness.catalogue_dir),
                "--digest",
                str(first.accepted_digest),
            )
            assert code == 3, out
            second = harness.accept("test", "echo", "test.echo")
            assert second.accepted_digest == changed.observed_digest
            assert harness.compose("reader").visible == ["test.echo"]
            assert _call(harness, "reader", "test.echo", message="three").ok
            assert _ledger_definitions(harness, "test.echo") == [
                ("intent", first.accepted_digest),
                ("outcome", first.accepted_digest),
                ("intent", second.accepted_digest),
                ("outcome", second.accepted_digest),
            ]
            kinds = [(r.kind, r.outcome) for r in harness.store.ledger() if r.kind == "upstream"]
            assert kinds == [
                ("upstream", "pending"),
                ("upstream", "accepted"),
                ("upstream", "changed"),
                ("upstream", "accepted"),
            ]
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=HANG_SECONDS)  # no kill() after it: it must end


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_call_already_running_finishes_on_its_version(tmp_path: Path):
    spec = write_spec(tmp_path / "spec.json", [_echo_v(1, sleep=2, echo=True)])
    tools = [contract("test.echo", "test", "echo")]
    calls = tmp_path / "calls.log"
    with Harness(tmp_path, tools, [own_server("test", spec, calls=calls)]) as harness:
        harness.discover("test")
        first = harness.accept("test", "echo", "test.echo")
        results: list[Outcome] = []
        running = threading.Thread(
            target=lambda: results.append(_call(harness, "reader", "test.echo", message="slow"))
        )
        running.start()
        wait_for(lambda: calls.exists() and "slow" in calls.read_text(), what="the call to arrive")
        write_spec(spec, [_echo_v(2, sleep=2, echo=True)])
        wait_for(
            lambda: (p := harness.pin("test", "echo")) and p.status is PinStatus.CHANGED,
            what="the change to be recorded",
        )
        assert _denied(harness, "reader", "test.echo", message="next") == ["tool_quarantined"]
        running.join(timeout=HANG_SECONDS)
        assert results
        assert results[0].status is OutcomeStatus.SUCCESS
        assert results[0].result == {"message": "slow"}
        assert _ledger_definitions(harness, "test.echo") == [
            ("intent", first.accepted_digest),
            ("outcome", first.accepted_digest),
        ]


def test_rejecting_keeps_the_tool_quarantined_and_reverting_upstream_restores_it(tmp_path: Path):
    spec = write_spec(tmp_path / "spec.json", [_echo_v(1)])
    tools = [contract("test.echo", "test", "echo")]
    with Harness(tmp_path, tools, [own_server("test", spec)]) as harness:
        harness.discover("test")
        harness.accept("test", "echo", "test.echo")
        write_spec(spec, [_echo_v(2)])
        harness.discover("test")  # a re-list, as `capgate mcp discover` does
        assert harness.compose("reader").reasons_for("test.echo") == ["tool_quarantined"]
        code, out = harness.cli("mcp", "reject", "test", "echo", "--by", "maria")
        assert code == 0, out
        assert "rejected" in out
        assert harness.compose("reader").reasons_for("test.echo") == ["tool_quarantined"]
        write_spec(spec, [_echo_v(1)])  # the server goes back to what was accepted
        harness.discover("test")
        assert harness.compose("reader").visible == ["test.echo"]
        # A tool that is not accepted as this catalogue tool is refused at accept time.
        code, out = harness.cli(
            "mcp",
            "accept",
            "test",
            "echo",
            "--as",
            "other.tool",
            "--catalogue",
            str(harness.catalogue_dir),
        )
        assert code == 2
        assert "no tool 'other.tool'" in out


# -- typed outcomes ------------------------------------------------------------------------


def test_failures_are_typed_outcomes_within_the_bound(tmp_path: Path):
    strict = {
        "type": "object",
        "properties": {"message": {"type": "string", "maxLength": 5}},
        "required": ["message"],
    }
    spec = write_spec(
        tmp_path / "spec.json",
        [
            upstream_tool("slow", "Sleeps.", {"sleep": 30, "text": "late"}),
            upstream_tool("die", "Dies mid-call.", {"exit": 3}),
            upstream_tool(
                "bad", "Answers with something that is not a result.", {"malformed": True}
            ),
            upstream_tool("fails", "Reports a tool error.", {"error": "the provider said no"}),
            upstream_tool("strict", "Takes short messages.", {"echo": True}, input_schema=strict),
            upstream_tool(
                "shape",
                "Breaks its own output schema.",
                {"structured": {"n": "one"}},
                output_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
            ),
        ],
    )
    started = tmp_path / "started.txt"
    calls = tmp_path / "calls.txt"
    server = own_server("test", spec, started=started, calls=calls)
    tools = []
    for name in ("slow", "die", "bad", "fails", "strict", "shape"):
        tools.append(contract(f"read.{name}", "test", name))
    for name in ("slow", "die", "bad"):
        tools.append(
            contract(
                f"write.{name}",
                None,
                None,
                roles=["writer"],
                mode="write",
                idempotency="not_idempotent",
                recovery="ask_the_provider",
            )
        )
    # The write contracts run the same upstream tools under other names: one contract
    # per upstream tool, so these name a second server on the same spec.
    for entry in tools[6:]:
        entry["upstream"] = {"server": "again", "tool": entry["name"].split(".")[1]}
    again = own_server("again", spec, started=started, calls=calls)
    # The call timeout is under test (read.slow, write.slow); a server's start is waited
    # for by the Harness's hang bound.
    with Harness(tmp_path, tools, [server, again], call_timeout=4.0) as harness:
        harness.discover("test", "again")
        for entry in tools:
            upstream = entry["upstream"]
            harness.accept(upstream["server"], upstream["tool"], entry["name"])

        def timed(role: str, tool: str, **params: Any) -> Outcome:
            # Each call ends by a deadline of the gateway's or by its answer, which its
            # outcome tells; how long a loaded machine takes to get there is none of it.
            return _call(harness, role, tool, **params)

        slow = timed("reader", "read.slow")
        assert (slow.status, slow.recovery) == (OutcomeStatus.RETRYABLE, None)
        slow_write = timed("writer", "write.slow")
        assert (slow_write.status, slow_write.recovery) == (
            OutcomeStatus.UNKNOWN,
            "ask_the_provider",
        )

        died = timed("reader", "read.die")
        assert died.status is OutcomeStatus.RETRYABLE
        died_write = timed("writer", "write.die")
        assert (died_write.status, died_write.recovery) == (
            OutcomeStatus.UNKNOWN,
            "ask_the_provider",
        )
        # The next call starts the server again.
        before = len(started.read_text().splitlines())
        assert timed("reader", "read.fails").status is OutcomeStatus.REFUSED
        assert len(started.read_text().splitlines()) == before + 1

        bad = timed("reader", "read.bad")
        assert bad.status is OutcomeStatus.RETRYABLE
        assert "not a valid MCP result" in (bad.error or "")
        bad_write = timed("writer", "write.bad")
        assert bad_write.status is OutcomeStatus.UNKNOWN

        refused = timed("reader", "read.fails")
        assert (refused.status, refused.error) == (OutcomeStatus.REFUSED, "the provider said no")

        # Arguments the catalogue allows but the accepted upstream schema does not:
        # refused before anything is sent.
        sent_before = calls.read_text().count("strict ")
        too_long = timed("reader", "read.strict", message="longer than five")
        assert too_long.status is OutcomeStatus.REFUSED
        assert "accepted input schema" in (too_long.error or "")
        assert "nothing was sent" in (too_long.error or "")
        assert "longer than five" not in (too_long.error or "")
        assert calls.read_text().count("strict ") == sent_before
        assert timed("reader", "read.strict", message="short").ok

        # A result outside the output schema: the tool ran, its answer is unusable.
        shape = timed("reader", "read.shape")
        assert shape.status is OutcomeStatus.RETRYABLE
        assert "output schema" in (shape.error or "")


def test_a_server_that_cannot_start_is_retryable_and_nothing_was_sent(tmp_path: Path):
    server = ServerSpec("ghost", command=(str(tmp_path / "no-such-server"),))
    tools = [contract("ghost.echo", "ghost", "echo")]
    definition = {
        "name": "echo",
        "title": None,
        "description": "Echo.",
        "inputSchema": {"type": "object"},
        "outputSchema": None,
        "annotations": None,
    }
    with Harness(tmp_path, tools, [server], connect_timeout=5) as harness:
        with harness.store.transaction() as tx:
            pin = tx.observe_pin("ghost", "echo", definition)
            tx.accept_pin(
                "ghost",
                "echo",
                digest=str(pin.observed_digest),
                catalogue_tool="ghost.echo",
                by="maria",
            )
        # No such program: refused at its start, not by a deadline (nor how soon).
        outcome = _call(harness, "reader", "ghost.echo")
        assert outcome.status is OutcomeStatus.RETRYABLE
        assert "could not be reached" in (outcome.error or "")
        code, out = harness.cli(
            "mcp", "discover", "--servers", f"ghost={server.describe()}", "--timeout", "5"
        )
        assert code == 2
        assert "could not be listed" in out
