"""``capgate serve --http`` read by the MCP Inspector's CLI: the TypeScript SDK's client.

Issue 17, defect 5: for a tool that advertises an output schema, capgate put its
error object in ``structuredContent``, which the TypeScript clients validate against
that schema, error or not; the call then failed (``-32602 Structured content does not
match the tool's output schema``) and the client never saw the reason codes, that
nothing was run, or the recovery. Here every kind of answer goes through the real CLI
of both pinned Inspector releases (``scripts/versions.env``; one on the TypeScript
client 2.x, one on the SDK 1.x), against a real server process, a real embedded OPA
and a SQLite store, and each printed result must carry its facts.

The CLI exits 0 for a result it read; the 2.x CLI exits 5 for a result it read that
says ``isError`` (its documented ``tool_is_error``), and 1 when it could not read
the result at all. The 2.x CLI never sends a call for a tool the server did not
list, so hidden and missing tools reach the server through the 1.x CLI only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from jsonschema import Draft202012Validator

from capgate.gateway.catalogue import load_catalogue
from tests.hang import HANG_SECONDS
from tests.integration.mcp_server_support import (
    RETRY_AFTER_SECONDS,
    ROOT,
    SALES,
    SALES_BOT,
    http_server,
    ledger,
    linking_catalogue,
    records,
    seed_store,
    work_order,
    write_config,
)

pytestmark = pytest.mark.integration

#: Seconds one CLI run may take: a bound on a hang, never a measure of speed.
BOUND: Final = HANG_SECONDS
PEERS: Final = ROOT / ".tools" / "mcp-peers"
PINS: Final = dict(
    line.split("=", 1)
    for line in (ROOT / "scripts" / "versions.env").read_text(encoding="utf-8").splitlines()
    if re.match(r"^[A-Z0-9_]+=", line)
)
TOKEN: Final = f"cg-inspector-{secrets.token_urlsafe(24)}"
CATALOGUE: Final = load_catalogue(SALES)


@dataclass(frozen=True)
class Inspector:
    """One pinned Inspector release, in its own npm prefix under ``.tools/mcp-peers``."""

    folder: str
    pin: str
    #: The TypeScript client package it is built on, and that package's major version.
    client: str
    client_major: str
    #: Its exit status for a result it read that says ``isError``.
    error_exit: int
    #: Whether it sends a call for a tool the server did not list.
    calls_unlisted: bool

    @property
    def program(self) -> Path:
        return PEERS / self.folder / "node_modules" / ".bin" / "mcp-inspector"

    def argv(self, url: str, *method: str) -> list[str]:
        auth = f"Authorization: Bearer {TOKEN}"
        if self.calls_unlisted:  # 1.x: the URL is the target
            return [str(self.program), "--cli", url, "--transport", "http",
                    "--header", auth, *method]  # fmt: skip
        return [str(self.program), "--cli", "--transport", "http", "--server-url", url,
                "--header", auth, *method]  # fmt: skip

    def __str__(self) -> str:
        return f"inspector-{self.pin}"


INSPECTORS: Final = [
    Inspector("inspector", PINS["MCP_INSPECTOR_VERSION"], "client", "2", 5, False),
    Inspector("inspector-v1", PINS["MCP_INSPECTOR_V1_VERSION"], "sdk", "1", 0, True),
]


@dataclass(frozen=True)
class Run:
    """One CLI run: its exit status, the result it printed, and its stderr."""

    status: int
    result: dict[str, Any]
    stdout: str
    stderr: str

    @property
    def facts(self) -> dict[str, Any]:
        facts = self.result.get("_meta", {}).get("capgate/outcome")
        assert isinstance(facts, dict), self.stdout
        return facts

    @property
    def text(self) -> str:
        [block] = self.result["content"]
        assert block["type"] == "text"
        return str(block["text"])


def _serve(
    tmp_path_factory: pytest.TempPathFactory,
    without: tuple[str, ...] = (),
    bound: dict[str, Any] = SALES_BOT,
    extra: tuple[str, ...] = (),
) -> Iterator[dict[str, Any]]:
    for inspector in INSPECTORS:
        if not os.access(inspector.program, os.X_OK):
            pytest.fail(f"{inspector.program.relative_to(ROOT)} is missing; run `make setup-test`")
    folder = tmp_path_factory.mktemp("serve-inspector")
    store = seed_store(folder / "state.db")
    config = write_config(folder / "serve.yaml", http={"caller": (TOKEN, bound)})
    record = folder / "record.jsonl"
    home = folder / "home"  # the Inspector keeps state in $HOME/.mcp-inspector
    home.mkdir()
    with http_server(store, config, record, without=without, extra=extra) as server:
        yield {"url": server.url, "store": store, "record": record, "home": home}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from _serve(tmp_path_factory)


@pytest.fixture(scope="module")
def served_without_crm_secret(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server whose environment lacks the CRM connection's secret."""
    yield from _serve(tmp_path_factory, without=("CAPGATE_SECRET_ACME__CRM",))


@pytest.fixture(scope="module")
def served_work_order(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server whose one caller is a work-order agent, which may link invoices."""
    catalogue = linking_catalogue(tmp_path_factory.mktemp("linking") / "catalogue")
    bound = work_order("wo-bot", "task-wo-1")
    yield from _serve(tmp_path_factory, bound=bound, extra=("--catalogue", str(catalogue)))


def inspect(served: dict[str, Any], inspector: Inspector, *method: str) -> Run:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(served["home"]),
        "MCP_INSPECTOR_SECRET_STORE": "memory",
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        inspector.argv(served["url"], *method),
        cwd=served["home"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"{inspector} printed no result (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
        ) from None
    assert TOKEN not in done.stdout + done.stderr
    return Run(done.returncode, result, done.stdout, done.stderr)


def call(served: dict[str, Any], inspector: Inspector, tool: str, *args: str) -> Run:
    method = ["--method", "tools/call", "--tool-name", tool]
    return inspect(served, inspector, *method, *(["--tool-arg", *args] if args else []))


@pytest.fixture(scope="module")
def listed(served: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each Inspector's ``tools/list``, by tool name: what it validates results against."""
    tools = {}
    for inspector in INSPECTORS:
        run = inspect(served, inspector, "--method", "tools/list")
        assert run.status == 0, run.stderr
        tools[inspector.folder] = {tool["name"]: tool for tool in run.result["tools"]}
    return tools


def read_back(run: Run, inspector: Inspector) -> None:
    """The CLI read the result: the exit status it documents for one, never a failure."""
    error = run.result.get("isError") is True
    assert run.status == (inspector.error_exit if error else 0), (run.status, run.stderr)
    if error and inspector.error_exit:
        envelope = json.loads(run.stderr.strip().splitlines()[-1])
        assert envelope["error"]["code"] == "tool_is_error", run.stderr


def fits_listing(run: Run, tool: dict[str, Any]) -> None:
    """Structured content only where the listed tool admits it; none else."""
    schema = tool.get("outputSchema")
    if schema is not None and "structuredContent" in run.result:
        errors = list(Draft202012Validator(schema).iter_errors(run.result["structuredContent"]))
        assert not errors, errors
    if schema is not None and run.result.get("isError") is not True:
        assert "structuredContent" in run.result


# ------------------------------------------------------------------ the installs


@pytest.mark.parametrize("inspector", INSPECTORS, ids=str)
def test_the_pinned_inspectors_are_installed_on_both_client_lines(inspector: Inspector):
    package = PEERS / inspector.folder / "node_modules" / "@modelcontextprotocol"
    version = json.loads((package / "inspector" / "package.json").read_text())["version"]
    assert version == inspector.pin
    client = json.loads((package / inspector.client / "package.json").read_text())["version"]
    assert client.split(".")[0] == inspector.client_major, client


# ------------------------------------------------------------------ every answer kind

#: Each kind of answer: the call that produces it (tool, ``--tool-arg`` pairs).
KINDS: Final = {
    "allow": ("contact.read", ["contact_id=c-42"]),
    "deny": ("contact.read", ["contact_id=c-99"]),
    "invalid input": ("contact.read", ["contact_id=42"]),  # the CLI sends 42, a number
    "refused": ("contact.verify_email", ["contact_id=c-77", "email=cb@example.test"]),
    "retryable": ("contact.read", ["contact_id=c-busy"]),
    "unknown": ("contact.read", ["contact_id=c-lost"]),
    "proposed": ("quote.propose", ["opportunity_id=opp-17", "amount_cents=1200", "currency=EUR"]),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("inspector", INSPECTORS, ids=str)
def test_every_answer_kind_reads_through_the_inspector_cli(
    served: dict[str, Any],
    listed: dict[str, dict[str, dict[str, Any]]],
    inspector: Inspector,
    kind: str,
):
    tool, args = KINDS[kind]
    shown = listed[inspector.folder][tool]
    assert ("outputSchema" in shown) is (tool != "quote.propose"), shown
    run = call(served, inspector, tool, *args)
    read_back(run, inspector)
    fits_listing(run, shown)
    facts = run.facts
    entered = [r for r in records(served["record"]) if r["name"] == tool]
    if kind == "allow":
        assert run.result["isError"] is False
        assert run.result["structuredContent"] == {
            "contact_id": "c-42", "name": "Ada Lovelace", "email": "ada@example.test"
        }  # fmt: skip
        assert facts["status"] == "success"
        assert facts["operation_id"].startswith("op-")
        assert json.loads(run.text) == run.result["structuredContent"]
        return
    if kind == "proposed":
        assert run.result["isError"] is False
        assert run.result["structuredContent"]["status"] == "pending_review"
        assert facts["status"] == "pending_review"
        assert facts["proposal_id"] in run.text
        assert facts["operation_id"] in run.text
        assert "nothing was run" in run.text
        assert "quote.record_reviewed" not in [r["name"] for r in records(served["record"])]
        return
    assert run.result["isError"] is True
    assert "structuredContent" not in run.result  # every one of these tools has a schema
    if kind == "deny":
        assert facts["error"] == "capability_denied"
        assert facts["reason_codes"] == ["subject_out_of_scope"]
        assert "subject_out_of_scope" in run.text
        assert "nothing was run" in run.text
        assert not [r for r in entered if r["params"] == {"contact_id": "c-99"}]
    elif kind == "invalid input":
        assert facts["error"] == "input_invalid"
        assert "'contact_id'" in facts["message"]
        assert "'type' rule" in run.text
        assert "nothing was run" in run.text
        assert not [r for r in entered if r["params"] == {"contact_id": 42}]
    else:  # the tool ran and did not succeed
        assert facts["error"] == f"tool_{kind}"
        assert facts["status"] == kind
        assert facts["operation_id"] in run.text
        assert facts["tool"] == tool
        assert f"ended {kind}" in run.text
    if kind == "refused":
        assert facts["tool_error"] == "the contact's email address is not verified"
        assert "will not help" in run.text
    if kind == "retryable":
        assert facts["retry_after_seconds"] == RETRY_AFTER_SECONDS
        assert f"Retry after {RETRY_AFTER_SECONDS} seconds." in run.text
    if kind == "unknown":
        recovery = CATALOGUE.tools[tool].recovery
        assert facts["recovery"] == recovery
        assert f"Recovery: {recovery}." in run.text
        assert "do not repeat it blindly" in run.text


@pytest.mark.parametrize("inspector", [i for i in INSPECTORS if i.calls_unlisted], ids=str)
def test_a_hidden_tool_and_a_missing_one_read_alike_through_the_inspector_cli(
    served: dict[str, Any], inspector: Inspector
):
    def unseen() -> int:
        return sum(e.reason_codes == ["unknown_tool"] for e in ledger(served["store"]))

    before = unseen()
    payment = ["invoice_id=inv-9", "amount_cents=5", "currency=EUR",
               "beneficiary=DE44500105175407324931"]  # fmt: skip
    hidden = call(served, inspector, "payment.execute", *payment)  # finance's tool
    missing = call(served, inspector, "no.such.tool", *payment)
    for run in (hidden, missing):
        read_back(run, inspector)
        assert run.result["isError"] is True
        assert "structuredContent" not in run.result
        assert run.facts["error"] == "unknown_tool"
        assert "Nothing was run" in run.text
    assert hidden.stdout == missing.stdout
    assert "payment.execute" not in hidden.stdout
    assert unseen() == before + 2  # both reached the server, and both were audited
    assert "payment.execute" not in [r["name"] for r in records(served["record"])]


@pytest.mark.parametrize("inspector", INSPECTORS, ids=str)
def test_a_failure_after_the_decision_reads_through_the_inspector_cli(
    served_without_crm_secret: dict[str, Any], inspector: Inspector
):
    """A fault between an allow and the tool (the CRM connection's secret is missing
    from the server's environment) fails closed, for a tool with an output schema, and
    the client reads why."""
    served = served_without_crm_secret
    run = call(served, inspector, "contact.read", "contact_id=c-42")
    read_back(run, inspector)
    assert run.result["isError"] is True
    assert "structuredContent" not in run.result
    assert run.facts["error"] == "credential_unavailable"
    assert "[credential_unavailable]" in run.text
    assert not records(served["record"])  # the tool was never entered


@pytest.mark.parametrize("inspector", INSPECTORS, ids=str)
def test_an_agent_links_and_is_refused_through_the_inspector_cli(
    served_work_order: dict[str, Any], inspector: Inspector
):
    """The link tools read through the TypeScript clients like every other answer: a
    link made (and then made again, which changes nothing), and the link policy's
    refusal with its reason code."""
    listed = inspect(served_work_order, inspector, "--method", "tools/list")
    assert {"capgate.tasks.link", "capgate.tasks.unlink"} <= {
        tool["name"] for tool in listed.result["tools"]
    }
    invoice = f"inv-{inspector.folder}"  # each client its own, so the runs do not meet
    args = ("task_id=task-pay-9", "resource_type=invoice", f"resource_id={invoice}")
    for status in ("linked", "already_linked"):
        run = call(served_work_order, inspector, "capgate.tasks.link", *args)
        read_back(run, inspector)
        assert run.result["isError"] is False
        assert run.facts["status"] == status
        assert run.facts["resource"] == {"type": "invoice", "id": invoice}
    refused = call(served_work_order, inspector, "capgate.tasks.link",
                   "task_id=task-pay-9", "resource_type=contact", "resource_id=c-42")  # fmt: skip
    read_back(refused, inspector)
    assert refused.result["isError"] is True
    assert refused.facts["reason_codes"] == ["link_not_permitted"]
    assert "link_not_permitted" in refused.text
    own = call(served_work_order, inspector, "capgate.tasks.link",
               "task_id=task-wo-1", "resource_type=invoice", f"resource_id={invoice}")  # fmt: skip
    assert own.facts["reason_codes"] == ["link_own_task"]
    rows = [r for r in ledger(served_work_order["store"]) if r.kind == "task_link"]
    mine = [(r.outcome, r.detail["resource"]["id"]) for r in rows
            if r.detail["resource"]["id"] in (invoice, "c-42")]  # fmt: skip
    assert ("linked", invoice) in mine
    assert ("already_linked", invoice) in mine
    assert ("refused", "c-42") in mine
