"""Every fenced code block in README.md and docs/, and every file in docs/examples/,
is run or checked against the real code and a real OPA.

A block is named by its info string: the first word is the language, and where the
language alone does not say what to check, a second word names the document, e.g.
```` ```json compose-input ````. Each block must be claimed by exactly one rule below
(``test_every_block_has_exactly_one_rule``), so a new block without a rule fails.

=================================  =========================================================
info string                        rule
=================================  =========================================================
``python``                         executed in-process (fresh namespace, the repository
                                   root as cwd); it must not raise. The README's library
                                   example must print the AVAILABLE TOOLS block and a
                                   call result.
``sh``                             one shell session per document, see "Shell blocks".
``mermaid``                        starts with a diagram keyword; every ``CamelCase`` name
                                   and ``Name.method`` it shows exists in ``gateway``.
``yaml tools.yaml``,               the example catalogue of docs/catalogue.md, one block
``yaml roles.yaml``,               per file ("the docs catalogue"): written to a folder,
``yaml task_types.yaml``,          loaded with ``load_catalogue``, accepted by ``capgate
``yaml budget_classes.yaml``       check``, compiled, and asked compose questions of OPA.
``json catalogue-data``            equals ``compile_catalogue(docs catalogue)`` exactly.
``yaml catalogue-tools``           tool contracts shown apart from the docs catalogue:
                                   each is a contract the catalogue accepts.
``yaml currencies.yaml``           an optional catalogue file: loads beside the docs
                                   catalogue, changes its digest, and converts the
                                   worked figure of the prose with the contract above.
``yaml retained.yaml``             an optional catalogue file: beside the docs catalogue
                                   with each kept tool's version raised by one, it loads
                                   and keeps exactly that tool's former contract.
``yaml fixtures.yaml``             an optional catalogue file: beside the docs catalogue
                                   it loads, leaves the digest alone, and each fixture
                                   gets its decision from OPA.
``text fixture-refused``           produced for real by the demo's sales catalogue with
                                   its finance limit lowered to 1,000.00 EUR (the first
                                   of the problems it gives).
``json compose-input``             a valid ``ComposeInput``; OPA composes it against the
                                   docs catalogue.
``json compose-decision``          a valid ``ComposeDecision``, equal to OPA's answer to
                                   the nearest ``compose-input`` above it: the same
                                   visible tools and, when the block shows ``excluded``,
                                   the same excluded tools with the same reason codes
                                   (asked with ``reasons=True``); a message ``"..."``
                                   stands for any message, any other must be exact.
``json execute-input``             a valid ``ExecuteInput``; OPA decides it against the
                                   docs catalogue.
``json execute-decision``          a valid ``ExecuteDecision``, equal to OPA's answer to
                                   the nearest ``execute-input`` above it: the same
                                   ``allow``, reason codes (messages as above) and
                                   obligations.
``json call-params``               the parameters of the call of the nearest
                                   ``execute-input`` above it: valid for the tool's input
                                   schema, their ``params_digest`` is the call's (and the
                                   approval's) digest, and the subject's id is theirs.
``text catalogue-errors``          each line is produced for real by one small mistake
                                   (``CATALOGUE_MISTAKES``) in the docs catalogue; a line
                                   ending in ``...`` is a prefix of the real problem.
``text catalogue-error-format``    every real problem that names a field (from the
                                   mistakes above) matches this ``<placeholder>`` shape.
``text contract-version-refused``  produced for real by pinning the demo's sales catalogue
                                   in a fresh store and starting again with the block's
                                   tool let in for one more role, the time aside.
``yaml serve-config``              a ``capgate serve`` configuration: accepted by
                                   ``fronts.mcp.config.parse_config``, and its ``tools``
                                   entry points import and give adapters.
``json mcp-client``                an MCP client's ``mcpServers``: each stdio server runs a
                                   ``capgate`` whose ``args`` the real ``serve`` parser
                                   accepts; each HTTP server's URL is ``/mcp`` at an
                                   address ``--http`` accepts, and its bearer token is one
                                   of the nearest ``serve-config`` above it.
``json mcp-tool-result``           a ``tools/call`` result as the server writes it (without
                                   ``resultType``), equal to one that ``capgate serve``
                                   really produces (``_serve_results``).
``json notice``                    a webhook notice's body, equal to the one the notifier
                                   writes (``notice_body``) for a ledger row and proposal
                                   with the block's own values.
``json log-line``                  a decision's JSON log line, equal to the one
                                   ``log_decision`` writes for a decision with the block's
                                   own values (its time and span ids aside).
``json readyz``                    ``/readyz``'s answer when ready: equal to what the
                                   checks of ``capgate serve`` answer over the sales
                                   catalogue's OPA, a fresh store and a running worker,
                                   the bundle revision shortened to ``...``.
=================================  =========================================================

Shell blocks: all ``sh`` blocks of one document run in order in one session, whose
working folder is a fresh ``/tmp`` folder with a symlink to every top-level entry of
the checkout except ``.git``, ``.capgate`` and ``build``. Commands therefore read
the checkout by relative path as written, and what they create (``.capgate/``,
``build/``) stays out of it; ``$PWD`` is the session folder (short enough for a unix
socket path). Blank and comment lines are skipped and ``\\`` continuations joined;
then each command, after any leading ``VAR=value`` assignments, is one of:

- ``make TARGET...``: checked with ``make -n TARGET`` (never run: ``make test`` runs
  this very test);
- ``.tools/bin/opa run --server ...``: started in the background exactly as written,
  waited for at its ``--addr`` until healthy, and stopped when the document is done;
- ``mkdir ...`` or ``.venv/bin/<program> ...``: run with bash; the exit status must
  be 0, or N when a trailing comment says ``exit status N``. A command that sets
  ``CAPGATE_OPA_URL`` must name a server of this session, and that server must log a
  decision while the command runs (so the variable really was used);
- anything else fails: add a rule here first.

Files in docs/examples/ are checked by ``EXAMPLE_FILES``; a file without an entry
there fails. They are inputs for the sales demo catalogue: each validates against
its model, and ``capgate eval`` answers it (compose.json: exit status 0 with the
visible tools; execute.yaml: 3, a deny by role). A ``# params: {...}`` comment in an
example gives the call's parameters, checked as a ``call-params`` block is.

Beside the blocks: every path in the first column of a table exists, every
``gateway.x``, ``adapters.x`` and ``capgate.x`` name in the prose resolves, the
sentence after policy-interface.md's execute decision (fixed, the call is allowed)
holds, and the README's first backtick fence opens the block whose first two
commands are ``make demo`` and ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

import capgate
from capgate.adapters.fronts.answers import error_answer, unknown_tool_answer
from capgate.adapters.fronts.mcp.config import parse_config
from capgate.adapters.fronts.mcp.http import MCP_PATH, parse_listen_address
from capgate.adapters.fronts.mcp.results import tool_result
from capgate.adapters.fronts.mcp.server import tool_view
from capgate.cli import serve as serve_command
from capgate.cli.logs import JsonLines, log_decision
from capgate.cli.main import EXIT_DENIED, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import CATALOGUE_FILES, compile_catalogue, load_catalogue
from capgate.gateway.digest import params_digest
from capgate.gateway.enforce.arguments import values_of
from capgate.gateway.enforce.dispatcher import DecisionEvent, Dispatcher
from capgate.gateway.errors import CapabilityViolation, CatalogueError, InvalidInput
from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision, Reason
from capgate.gateway.model.facts import ComposeInput, ExecuteInput, Principal
from capgate.gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from capgate.gateway.service.fixtures import check_fixtures
from capgate.gateway.service.health import Readiness, store_check, worker_check
from capgate.gateway.service.notices import NoticeSettings
from capgate.gateway.service.notices.events import event_id, notice_body
from capgate.gateway.service.versions import pin_contracts
from capgate.gateway.service.worker import Worker
from capgate.gateway.state import open_store
from capgate.gateway.state.records import LedgerRow, ProposalRecord, ProposalStatus
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.catalogue_edits import edit_tool, payment_limit
from tests.integration.opa_servers import wait_healthy

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
SALES = demo_catalogue_dir("sales")


# ------------------------------------------------------------------------ blocks


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, counting from 1
    lang: str
    tag: str  # the info string's second word, or ""
    text: str

    def __str__(self) -> str:
        info = f"{self.lang} {self.tag}".strip() or "(no info string)"
        return f"{self.doc.relative_to(ROOT)}:{self.line} ```{info}"


def documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def parse_blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc``: CommonMark fences of ``` or ~~~, also indented
    (in a list item), with the fence's indentation taken off the block's lines."""
    blocks: list[Block] = []
    fence: str | None = None
    indent, info, start, body = "", [], 0, []
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        if fence is None:
            opening = re.match(r"^(\s*)(`{3,}|~{3,})(.*)$", line)
            # A backtick fence's info string holds no backtick (else it is inline code).
            if opening and not (opening.group(2)[0] == "`" and "`" in opening.group(3)):
                indent, fence, info = opening.group(1), opening.group(2), opening.group(3).split()
                start, body = number, []
        elif re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", line):
            lang, tag = [*info, "", ""][:2]
            blocks.append(Block(doc, start, lang, tag, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line.removeprefix(indent))
    assert fence is None, f"{doc.relative_to(ROOT)}:{start}: unclosed code fence"
    return blocks


ALL_BLOCKS = [block for doc in documents() for block in parse_blocks(doc)]

JSON_DOCUMENTS = (
    "catalogue-data",
    "compose-input",
    "compose-decision",
    "execute-input",
    "execute-decision",
    "call-params",
)

RULES: dict[str, Callable[[Block], bool]] = {
    "python": lambda b: b.lang == "python" and not b.tag,
    "sh": lambda b: b.lang == "sh" and not b.tag,
    "mermaid": lambda b: b.lang == "mermaid" and not b.tag,
    "catalogue-file": lambda b: b.lang == "yaml" and b.tag in CATALOGUE_FILES,
    "catalogue-tools": lambda b: b.lang == "yaml" and b.tag == "catalogue-tools",
    "catalogue-currencies": lambda b: b.lang == "yaml" and b.tag == "currencies.yaml",
    "catalogue-retained": lambda b: b.lang == "yaml" and b.tag == "retained.yaml",
    "catalogue-fixtures": lambda b: b.lang == "yaml" and b.tag == "fixtures.yaml",
    "fixture-refused": lambda b: b.lang == "text" and b.tag == "fixture-refused",
    **{name: (lambda b, name=name: b.lang == "json" and b.tag == name) for name in JSON_DOCUMENTS},
    "catalogue-errors": lambda b: b.lang == "text" and b.tag == "catalogue-errors",
    "catalogue-error-format": lambda b: b.lang == "text" and b.tag == "catalogue-error-format",
    "contract-version-refused": lambda b: b.lang == "text" and b.tag == "contract-version-refused",
    "serve-config": lambda b: b.lang == "yaml" and b.tag == "serve-config",
    "mcp-client": lambda b: b.lang == "json" and b.tag == "mcp-client",
    "mcp-tool-result": lambda b: b.lang == "json" and b.tag == "mcp-tool-result",
    "notice": lambda b: b.lang == "json" and b.tag == "notice",
    "log-line": lambda b: b.lang == "json" and b.tag == "log-line",
    "readyz": lambda b: b.lang == "json" and b.tag == "readyz",
}


def blocks_of(rule: str) -> list[Block]:
    return [b for b in ALL_BLOCKS if RULES[rule](b)]


def ids(blocks: list[Block]) -> list[str]:
    return [f"{b.doc.name}:{b.line}" for b in blocks]


def preceding(block: Block, rule: str) -> Block:
    """The nearest block of ``rule`` above ``block`` in the same document."""
    above = [b for b in blocks_of(rule) if b.doc == block.doc and b.line < block.line]
    assert above, f"{block}: no ```{rule} block above it to check it against"
    return above[-1]


def test_every_block_has_exactly_one_rule():
    problems = []
    for block in ALL_BLOCKS:
        claimed = [name for name, matches in RULES.items() if matches(block)]
        if len(claimed) != 1:
            problems.append(f"{block}: claimed by {claimed or 'no rule'}")
    assert not problems, "every doc block needs exactly one rule in test_docs.py:\n" + "\n".join(
        problems
    )


def test_every_rule_checks_some_block():
    """A rule that matches nothing usually means a renamed info string."""
    assert [name for name in RULES if not blocks_of(name)] == []


# ------------------------------------------------------------------------ python


@pytest.mark.parametrize("block", blocks_of("python"), ids=ids(blocks_of("python")))
def test_python_block_runs(block: Block, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = compile(block.text, f"{block.doc}:{block.line}", "exec")
    exec(code, {"__name__": "__docs__"})  # noqa: S102 - our own documentation
    out = capsys.readouterr().out
    if block.doc == README and "call_tool" in block.text:  # the library example
        assert out.startswith("AVAILABLE TOOLS:")
        assert "- contact.read (v1):" in out
        assert "payment.execute" not in out
        assert "'contact_id': 'c-42'" in out


def test_the_readme_s_first_commands_are_make_demo_and_make_test():
    """A newcomer, CI and the scripts that read the README's first two commands find
    ``make demo`` and ``make test``. Some of those readers know only backtick fences,
    and take a closing fence for an opening one: the first backtick fence must open
    the block that holds the two, so the diagram above it is fenced with tildes."""
    text = README.read_text(encoding="utf-8")
    line = text[: text.index("```")].count("\n") + 1
    (block,) = [b for b in ALL_BLOCKS if b.doc == README and b.line == line]
    assert block.lang == "sh", f"{block}: the README's first backtick fence"
    words = [shlex.split(command, comments=True) for command, _ in commands(block)]
    assert words[:2] == [["make", "demo"], ["make", "test"]], str(block)


# ------------------------------------------------------------------------ mermaid

_DIAGRAMS = {
    "flowchart",
    "graph",
    "sequenceDiagram",
    "classDiagram",
    "stateDiagram",
    "stateDiagram-v2",
    "erDiagram",
    "journey",
    "gantt",
    "pie",
}


@pytest.mark.parametrize("block", blocks_of("mermaid"), ids=ids(blocks_of("mermaid")))
def test_mermaid_block_is_a_diagram_of_real_names(block: Block):
    lines = [line for line in block.text.splitlines() if line.strip()]
    assert lines, f"{block}: empty diagram"
    assert lines[0].split()[0] in _DIAGRAMS, f"{block}: no diagram keyword"
    for cls, method in re.findall(r"\b([A-Z][A-Za-z]+)\.([a-z_]+)\b", block.text):
        assert hasattr(getattr(capgate, cls, None), method), f"{block}: {cls}.{method}"
    for name in re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]*)+\b", block.text):
        assert name in capgate.__all__, f"{block}: {name} is not in capgate's public surface"


# ------------------------------------------------------------ the docs catalogue


@pytest.fixture(scope="module")
def docs_catalogue_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    files = {b.tag: b for b in blocks_of("catalogue-file")}
    tags = sorted(b.tag for b in blocks_of("catalogue-file"))
    assert tags == sorted(CATALOGUE_FILES), f"one block per catalogue file, got {tags}"
    directory = tmp_path_factory.mktemp("docs-catalogue")
    for name, block in files.items():
        (directory / name).write_text(block.text, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def docs_catalogue(docs_catalogue_dir: Path) -> Catalogue:
    return load_catalogue(docs_catalogue_dir)


@pytest.fixture(scope="module")
def docs_opa(docs_catalogue: Catalogue) -> Iterator[PolicySidecar]:
    with PolicySidecar(docs_catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
        yield sidecar


def _compose(sidecar: PolicySidecar, role: str, connections: dict[str, str]) -> ComposeDecision:
    facts = {
        "principal": {"agent": "docs-bot", "role": role, "tenant": "acme"},
        "task": {"type": "customer_quote"},
        "connections": connections,
        "environment": "production",
        "budget_class": "standard",
    }
    return sidecar.client.compose(ComposeInput.model_validate(facts), reasons=True)


def test_catalogue_blocks_form_a_catalogue_opa_answers_for(
    docs_catalogue_dir: Path, docs_catalogue: Catalogue, docs_opa: PolicySidecar, capsys
):
    assert main(["check", str(docs_catalogue_dir)]) == EXIT_OK
    assert "3 tool(s)" in capsys.readouterr().out
    compiled = compile_catalogue(docs_catalogue)
    assert docs_opa.client.catalogue_digest() == compiled["meta"]["digest"]

    task_tools = docs_catalogue.task_types["customer_quote"].tools
    everything = _compose(docs_opa, "sales", {"crm": "active", "sales_mailbox": "active"})
    assert sorted(everything.visible) == sorted(task_tools) == sorted(docs_catalogue.tools)

    support = _compose(docs_opa, "support", {"crm": "active", "sales_mailbox": "active"})
    assert support.visible == ["contact.read"]
    assert support.reasons_for("quote.prepare_send") == ["role_not_granted"]


def _beside(docs_catalogue_dir: Path, block: Block, folder: Path) -> Path:
    """The docs catalogue copied to ``folder`` with ``block`` beside it, as the
    optional file its tag names."""
    shutil.copytree(docs_catalogue_dir, folder)
    (folder / block.tag).write_text(block.text, encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "block", blocks_of("catalogue-currencies"), ids=ids(blocks_of("catalogue-currencies"))
)
def test_the_currency_table_converts_as_the_docs_say(
    block: Block, docs_catalogue_dir: Path, docs_catalogue: Catalogue, tmp_path: Path
):
    # Beside the docs catalogue the table loads, and is in the digest: a change of
    # rate is a change of catalogue.
    with_table = load_catalogue(_beside(docs_catalogue_dir, block, tmp_path / "with-table"))
    assert with_table.currencies is not None
    digests = {compile_catalogue(c)["meta"]["digest"] for c in (with_table, docs_catalogue)}
    assert len(digests) == 2
    # The contract above it, its converted value read with this table: the worked
    # figure of the docs (4,500.00 GBP is 526500 euro cents).
    [tool] = yaml.safe_load(preceding(block, "catalogue-tools").text)["tools"]
    contract = ToolContract.model_validate(tool)
    values = values_of(contract, {"amount_cents": 450_000, "currency": "GBP",
                                  "invoice_id": "inv-1", "payee_email": "a@b.example"},
                       with_table.currencies)  # fmt: skip
    assert values["amount_eur_cents"] == 526_500
    prose = block.doc.read_text(encoding="utf-8")
    assert "`450000`" in prose
    assert "`526500`" in prose


@pytest.mark.parametrize(
    "block", blocks_of("catalogue-retained"), ids=ids(blocks_of("catalogue-retained"))
)
def test_a_kept_version_loads_beside_its_successor(
    block: Block, docs_catalogue_dir: Path, docs_catalogue: Catalogue, tmp_path: Path
):
    folder = _beside(docs_catalogue_dir, block, tmp_path / "keeping")
    kept = yaml.safe_load(block.text)["retained"]
    tools_path = folder / "tools.yaml"
    document = yaml.safe_load(tools_path.read_text(encoding="utf-8"))
    for tool in document["tools"]:
        if tool["name"] in {k["name"] for k in kept}:
            tool["version"] += 1
    tools_path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    keeping = load_catalogue(folder)
    assert keeping.retained, str(block)
    for name, versions in keeping.retained.items():
        for version, contract in versions.items():
            # Exactly the contract the docs catalogue serves under that version.
            assert contract == docs_catalogue.tools[name], (name, version)
            assert keeping.tools[name].version == version + 1


@pytest.mark.parametrize(
    "block", blocks_of("catalogue-fixtures"), ids=ids(blocks_of("catalogue-fixtures"))
)
def test_the_fixtures_block_gets_its_decisions(
    block: Block, docs_catalogue_dir: Path, docs_catalogue: Catalogue, tmp_path: Path
):
    with_fixtures = load_catalogue(_beside(docs_catalogue_dir, block, tmp_path / "with-fixtures"))
    assert with_fixtures.fixtures, str(block)
    assert compile_catalogue(with_fixtures) == compile_catalogue(docs_catalogue)
    with PolicySidecar(with_fixtures, timeout=ANSWER_TIMEOUT) as sidecar:
        outcomes = check_fixtures(with_fixtures, sidecar.client, datetime.now(UTC))
    assert len(outcomes) == len(with_fixtures.fixtures)


@pytest.mark.parametrize(
    "block", blocks_of("fixture-refused"), ids=ids(blocks_of("fixture-refused"))
)
def test_a_fixture_refusal_is_real(block: Block, tmp_path: Path):
    folder = tmp_path / "lowered"
    shutil.copytree(SALES, folder)
    edit_tool(folder, "payment.execute", limits=payment_limit(100_000))
    lowered = load_catalogue(folder)
    with (
        PolicySidecar(lowered, timeout=ANSWER_TIMEOUT) as sidecar,
        pytest.raises(CatalogueError) as refused,
    ):
        check_fixtures(lowered, sidecar.client, datetime.now(UTC))
    assert refused.value.problems[0] == block.text.strip(), str(block)


@pytest.mark.parametrize(
    "block", blocks_of("catalogue-tools"), ids=ids(blocks_of("catalogue-tools"))
)
def test_catalogue_tools_blocks_are_contracts_the_catalogue_accepts(block: Block):
    tools = yaml.safe_load(block.text)["tools"]
    assert tools, str(block)
    for tool in tools:
        ToolContract.model_validate(tool)


def test_catalogue_data_block_is_what_the_compiler_writes(docs_catalogue: Catalogue):
    for block in blocks_of("catalogue-data"):
        assert json.loads(block.text) == compile_catalogue(docs_catalogue), str(block)


# ------------------------------------------------------- inputs and decisions


def _assert_reasons(shown: list[dict[str, Any]], real: list[Reason], where: str) -> None:
    assert sorted(r["code"] for r in shown) == sorted(r.code for r in real), where
    for reason in shown:
        if reason["message"] != "...":
            messages = {r.message for r in real if r.code == reason["code"]}
            assert reason["message"] in messages, f"{where}: message of {reason['code']}"


@pytest.mark.parametrize("block", blocks_of("compose-input"), ids=ids(blocks_of("compose-input")))
def test_compose_input_block_is_valid_and_composes(block: Block, docs_opa: PolicySidecar):
    facts = ComposeInput.model_validate_json(block.text)
    assert docs_opa.client.compose(facts).decision_id


@pytest.mark.parametrize("block", blocks_of("execute-input"), ids=ids(blocks_of("execute-input")))
def test_execute_input_block_is_valid_and_decides(block: Block, docs_opa: PolicySidecar):
    facts = ExecuteInput.model_validate_json(block.text)
    assert docs_opa.client.execute(facts).decision_id


@pytest.mark.parametrize(
    "block", blocks_of("compose-decision"), ids=ids(blocks_of("compose-decision"))
)
def test_compose_decision_block_is_opas_answer(block: Block, docs_opa: PolicySidecar):
    shown = json.loads(block.text)
    ComposeDecision.model_validate(shown)
    facts = ComposeInput.model_validate_json(preceding(block, "compose-input").text)
    real = docs_opa.client.compose(facts, reasons="excluded" in shown)
    assert sorted(shown["visible"]) == sorted(real.visible), str(block)
    assert sorted(shown.get("excluded", {})) == sorted(real.excluded), str(block)
    for tool, reasons in shown.get("excluded", {}).items():
        _assert_reasons(reasons, real.excluded[tool], f"{block}: {tool}")


@pytest.mark.parametrize(
    "block", blocks_of("execute-decision"), ids=ids(blocks_of("execute-decision"))
)
def test_execute_decision_block_is_opas_answer(block: Block, docs_opa: PolicySidecar):
    shown = json.loads(block.text)
    ExecuteDecision.model_validate(shown)
    facts = ExecuteInput.model_validate_json(preceding(block, "execute-input").text)
    real = docs_opa.client.execute(facts)
    assert shown["allow"] is real.allow, str(block)
    _assert_reasons(shown["reasons"], real.reasons, str(block))
    assert shown["obligations"] == [o.model_dump() for o in real.obligations], str(block)


def test_execute_example_is_allowed_once_fixed(docs_catalogue: Catalogue, docs_opa: PolicySidecar):
    """policy-interface.md: "With an unexpired approval and all three evidence names,
    the same call is allowed" with the pass_idempotency_key obligation."""
    (block,) = [b for b in blocks_of("execute-input") if b.doc.name == "policy-interface.md"]
    facts = json.loads(block.text)
    facts["approval"]["expires_at"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    facts["evidence"] = docs_catalogue.tool(facts["call"]["tool"]).required_names
    decision = docs_opa.client.execute(ExecuteInput.model_validate(facts))
    assert decision.allow, decision.reason_codes
    key = facts["call"]["operation_id"]
    assert [o.model_dump() for o in decision.obligations] == [
        {"code": "pass_idempotency_key", "params": {"key": key}}
    ]


def _assert_params_fit(params: dict[str, Any], contract: ToolContract, facts: ExecuteInput):
    validator = jsonschema.Draft202012Validator(
        contract.input_schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(params)
    assert params_digest(params) == facts.call.params_digest
    if facts.approval is not None:
        assert facts.approval.digest == facts.call.params_digest
    if contract.subject_type is not None:
        assert facts.call.subject is not None
        subject_param = contract.subject_param or f"{contract.subject_type}_id"
        assert params[subject_param] == facts.call.subject.id


@pytest.mark.parametrize("block", blocks_of("call-params"), ids=ids(blocks_of("call-params")))
def test_call_params_block_is_what_the_call_digests(block: Block, docs_catalogue: Catalogue):
    facts = ExecuteInput.model_validate_json(preceding(block, "execute-input").text)
    _assert_params_fit(json.loads(block.text), docs_catalogue.tool(facts.call.tool), facts)


# ------------------------------------------------------------ catalogue errors

Files = dict[str, str | None]  # file name -> text; None: the file is missing


def _edit_tools(edit: Callable[[list[dict[str, Any]]], None]) -> Callable[[Files], None]:
    def mistake(files: Files) -> None:
        document = yaml.safe_load(files["tools.yaml"] or "")
        edit(document["tools"])
        files["tools.yaml"] = yaml.safe_dump(document, sort_keys=False)

    return mistake


def _replace(file: str, old: str, new: str) -> Callable[[Files], None]:
    def mistake(files: Files) -> None:
        text = files[file] or ""
        assert old in text, f"{file} no longer holds {old!r}"
        files[file] = text.replace(old, new)

    return mistake


def _append(file: str, text: str) -> Callable[[Files], None]:
    def mistake(files: Files) -> None:
        files[file] = (files[file] or "") + text

    return mistake


def _remove(file: str) -> Callable[[Files], None]:
    def mistake(files: Files) -> None:
        files[file] = None

    return mistake


#: One small mistake in the docs catalogue per example line of docs/catalogue.md.
CATALOGUE_MISTAKES: dict[str, Callable[[Files], None]] = {
    "misspelt mode": _edit_tools(lambda tools: tools[0].update(mode="reed")),
    "misspelt field": _edit_tools(lambda tools: tools[1].update(aproval=tools[1].pop("approval"))),
    "misspelt role": _edit_tools(lambda tools: tools[0].update(roles=["sales", "suport"])),
    "copied tool": _edit_tools(lambda tools: tools.append(dict(tools[0]))),
    "no name": _edit_tools(lambda tools: tools[1].pop("name")),
    "no execution_action": _edit_tools(lambda tools: tools[1].pop("execution_action")),
    "misspelt evidence": _edit_tools(
        lambda tools: tools[1]["requires"].__setitem__(2, "communication_permision")
    ),
    "reviewer approves nothing": _replace(
        "roles.yaml", "approves: [exact_content_and_recipient]\n", "approves: []\n"
    ),
    "misspelt task tool": _replace("task_types.yaml", "quote.prepare_send]", "quote.prepare_snd]"),
    "misspelt cost class": _replace("budget_classes.yaml", "medium\n", "mediun\n"),
    "duplicate key": _append("roles.yaml", "  sales:\n    description: Sells.\n"),
    "missing file": _remove("roles.yaml"),
}


@pytest.fixture(scope="module")
def mistake_problems(
    docs_catalogue_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[str]]:
    """What load_catalogue reports for each mistake, loading ``catalogues/acme`` by a
    relative path as the doc's "file not found in catalogues/acme" shows."""
    problems: dict[str, list[str]] = {}
    for name, mistake in CATALOGUE_MISTAKES.items():
        base = tmp_path_factory.mktemp("mistake")
        folder = base / "catalogues" / "acme"
        folder.mkdir(parents=True)
        files: Files = {f: (docs_catalogue_dir / f).read_text() for f in CATALOGUE_FILES}
        mistake(files)
        for file, text in files.items():
            if text is not None:
                (folder / file).write_text(text, encoding="utf-8")
        with contextlib.chdir(base), pytest.raises(CatalogueError) as caught:
            load_catalogue(Path("catalogues", "acme"))
        problems[name] = caught.value.problems
    return problems


def test_catalogue_error_examples_are_real(mistake_problems: dict[str, list[str]]):
    used = set()
    for block in blocks_of("catalogue-errors"):
        for line in filter(None, block.text.splitlines()):
            shown = line[:-3] if line.endswith("...") else line
            found = [
                name
                for name, problems in mistake_problems.items()
                if any(p.startswith(shown) if shown != line else p == line for p in problems)
            ]
            assert found, f"{block}: no mistake in CATALOGUE_MISTAKES produces\n  {line}"
            used.update(found)
    assert used == set(CATALOGUE_MISTAKES), "mistakes no example line shows"
    # "a missing roles.yaml is reported once, not once for every role every tool names"
    assert len(mistake_problems["missing file"]) == 1


def test_catalogue_error_format_matches_real_problems(mistake_problems: dict[str, list[str]]):
    with_field = [p for ps in mistake_problems.values() for p in ps if ": field '" in p]
    assert with_field
    for block in blocks_of("catalogue-error-format"):
        (shape,) = filter(None, block.text.splitlines())
        pattern = re.sub(r"<[^>]+>", ".+", re.escape(shape))
        for problem in with_field:
            assert re.fullmatch(pattern, problem), f"{block}: {problem}"


@pytest.mark.parametrize(
    "block", blocks_of("contract-version-refused"), ids=ids(blocks_of("contract-version-refused"))
)
def test_a_contract_version_refusal_is_real(block: Block, tmp_path: Path):
    (line,) = filter(None, block.text.splitlines())
    tool = re.match(r"tools\.yaml: tool '([^']+)'", line)
    assert tool, f"{block}: names no tool"
    sales = load_catalogue(demo_catalogue_dir("sales"))
    contract = sales.tools[tool.group(1)]
    others = [role for role in sorted(sales.roles) if role not in contract.roles]
    changed = Catalogue.model_validate(
        {
            **dict(sales),
            "tools": {
                **sales.tools,
                contract.name: contract.model_copy(update={"roles": [*contract.roles, others[0]]}),
            },
        }
    )
    store = open_store(str(tmp_path / "state.db"))
    try:
        pin_contracts(store, sales)
        with pytest.raises(CatalogueError) as refused:
            pin_contracts(store, changed)
    finally:
        store.close()
    (problem,) = refused.value.problems
    when = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
    assert re.sub(when, "<time>", problem) == re.sub(when, "<time>", line), block


# ------------------------------------------------------------ capgate serve


@pytest.mark.parametrize("block", blocks_of("serve-config"), ids=ids(blocks_of("serve-config")))
def test_serve_config_block_is_accepted(block: Block):
    config = parse_config(block.text, str(block))
    assert config.adapters()


@pytest.mark.parametrize("block", blocks_of("log-line"), ids=ids(blocks_of("log-line")))
def test_log_line_block_is_what_a_decision_logs(block: Block):
    shown = json.loads(block.text)
    lines: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record)

    keep = Keep()
    decisions = logging.getLogger("capgate.decisions")
    decisions.addHandler(keep)
    level = decisions.level
    decisions.setLevel(logging.INFO)
    try:
        log_decision(
            DecisionEvent(
                kind=shown["question"], agent=shown["agent"], allow=shown["allow"],
                tool=shown.get("tool"), reason_codes=tuple(shown["reason_codes"]),
                decision_id=shown.get("decision_id"), status=shown.get("status"),
                stage=shown.get("stage"), revision=shown.get("revision"),
            )
        )  # fmt: skip
    finally:
        decisions.removeHandler(keep)
        decisions.setLevel(level)
    [record] = lines
    written = json.loads(JsonLines().format(record))
    for varying in ("time", "trace_id", "span_id"):
        shown.pop(varying, None)
        written.pop(varying, None)
    assert written == shown


@pytest.mark.parametrize("block", blocks_of("notice"), ids=ids(blocks_of("notice")))
def test_notice_block_is_what_the_notifier_writes(block: Block):
    shown = json.loads(block.text)
    at = datetime.strptime(shown["occurred_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    row = LedgerRow(
        seq=shown["ledger_seq"], at=at, prev_hash="sha256:" + "0" * 64,
        hash="sha256:" + shown["id"].removeprefix("evt_") + "0" * 32,
        kind="dispatch", tenant=shown["tenant"], principal=shown["by"], tool=shown["tool"],
        operation_id=shown["operation_id"], proposal_id=shown["proposal_id"],
        decision_id=shown["decision_id"], outcome=shown.get("outcome", "blocked"),
        reason_codes=shown["reason_codes"],
    )  # fmt: skip
    proposal = ProposalRecord(
        id=shown["proposal_id"], tenant=shown["tenant"], task_id="task-1",
        proposer=Principal(agent="sales-bot", role="sales", tenant=shown["tenant"]),
        environment="production", task={"type": "customer_quote", "id": "task-1"},
        tool=shown["tool"], contract_version=shown["contract_version"],
        execution_action=shown["tool"], params={"body": "never in a notice"},
        params_digest=shown["params_digest"], operation_id=shown["operation_id"],
        decision_id=None, status=ProposalStatus.BLOCKED, created_at=at, updated_at=at,
    )  # fmt: skip
    inbox = shown["inbox_url"].removesuffix(f"/proposals/{shown['proposal_id']}")
    settings = NoticeSettings.model_validate(
        {"inbox_url": inbox, "tenants": {shown["tenant"]: {"url": inbox, "secret_env": "X"}}}
    )
    assert event_id(row) == shown["id"]
    assert json.loads(notice_body(row, shown["type"], proposal, settings)) == shown


@pytest.mark.parametrize("block", blocks_of("mcp-client"), ids=ids(blocks_of("mcp-client")))
def test_mcp_client_block_fits_capgate_serve(block: Block):
    config = parse_config(preceding(block, "serve-config").text)
    parser = argparse.ArgumentParser(prog="capgate", exit_on_error=False)
    serve_command.register(parser.add_subparsers(dest="command"))
    servers = json.loads(block.text)["mcpServers"]
    assert servers, str(block)
    for name, server in servers.items():
        where = f"{block}: {name}"
        if "command" in server:
            assert set(server) <= {"command", "args", "env"}, where
            assert Path(server["command"]).name == "capgate", where
            args = parser.parse_args(server["args"])
            assert args.command == "serve", where
            assert args.http is None, where
        else:
            assert set(server) <= {"type", "url", "headers"}, where
            url = urlsplit(server["url"])
            assert (url.scheme, url.path) == ("http", MCP_PATH), where
            parse_listen_address(url.netloc)
            scheme, _, token = server["headers"]["Authorization"].partition(" ")
            assert scheme == "Bearer", where
            assert config.token_binding(token) is not None, f"{where}: no binding holds the token"


class _NoPolicy:
    def compose(self, facts: Any) -> Any:
        raise AssertionError("not asked")

    execute = compose


def _serve_results() -> list[dict[str, Any]]:
    """What capgate serve answers for a denial of ``contact.read`` and invalid arguments
    to it (fitted to the tool as tools/list shows it), and for a hidden tool."""
    catalogue = load_catalogue(SALES)
    dispatcher = Dispatcher(catalogue, _NoPolicy(), ToolRegistry())
    with pytest.raises(InvalidInput) as invalid:
        dispatcher.prepare("contact.read", {"contact_id": 42})
    denial = CapabilityViolation("contact.read", [Reason(code="subject_out_of_scope", message="-")])
    read = tool_view(catalogue.tools["contact.read"])
    answers = [
        tool_result(error_answer(denial), read),
        tool_result(unknown_tool_answer(), None),
        tool_result(error_answer(invalid.value), read),
    ]
    dumped = [a.model_dump(by_alias=True, mode="json", exclude_none=True) for a in answers]
    return [{k: v for k, v in answer.items() if k != "resultType"} for answer in dumped]


@pytest.mark.parametrize(
    "block", blocks_of("mcp-tool-result"), ids=ids(blocks_of("mcp-tool-result"))
)
def test_mcp_tool_result_block_is_a_real_answer(block: Block):
    assert json.loads(block.text) in _serve_results(), str(block)


def _ready_answer(sidecar: PolicySidecar, folder: Path) -> dict[str, Any]:
    store = open_store(str(folder / "state.db"))
    try:
        running = cast(Worker, SimpleNamespace(running=True))
        readiness = Readiness(
            {
                "opa": sidecar.readiness,
                "store": lambda: store_check(store),
                "worker": lambda: worker_check(running),
            },
            timeout=ANSWER_TIMEOUT,  # an answer that must come, not a pace
        )
        return readiness.check().to_json()
    finally:
        store.close()


@pytest.mark.parametrize("block", blocks_of("readyz"), ids=ids(blocks_of("readyz")))
def test_readyz_block_is_a_real_answer(
    block: Block, sales_sidecar: PolicySidecar, tmp_path: Path
) -> None:
    shown = json.loads(block.text)
    real = _ready_answer(sales_sidecar, tmp_path)
    revision = real["checks"]["opa"]["bundle_revision"]
    assert revision.startswith(shown["checks"]["opa"]["bundle_revision"].removesuffix("..."))
    shown["checks"]["opa"]["bundle_revision"] = revision
    assert shown == real, str(block)


# ------------------------------------------------------------------------ shell


@dataclass
class Background:
    proc: subprocess.Popen[bytes]
    address: str
    log: Path


class ShellSession:
    """A scratch working folder that sees the checkout, and the servers it started."""

    def __init__(self) -> None:
        # Short: a unix socket path (sun_path) holds about 100 bytes.
        self.cwd = Path(tempfile.mkdtemp(prefix="capgate-docs-", dir="/tmp"))
        for entry in ROOT.iterdir():
            if entry.name not in {".git", ".capgate", "build"}:
                (self.cwd / entry.name).symlink_to(entry)
        self.logs = Path(tempfile.mkdtemp(prefix="capgate-docs-logs-", dir="/tmp"))
        self.servers: list[Background] = []
        self.env = {**os.environ, "PWD": str(self.cwd)}
        for inherited in (OPA_URL_ENV, "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):  # e.g. `make test`
            self.env.pop(inherited, None)

    def expand(self, word: str) -> str:
        return word.replace("${PWD}", str(self.cwd)).replace("$PWD", str(self.cwd))

    def run(self, command: str, where: str) -> None:
        words = shlex.split(command, comments=True)
        assignments = {}
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            key, _, value = words.pop(0).partition("=")
            assignments[key] = self.expand(value)
        program = words[0] if words else ""
        if program == "make" and not assignments:
            self._check_make_targets(words[1:], where)
        elif program == ".tools/bin/opa" and words[1:2] == ["run"] and "--server" in words:
            self._start_server(command, words, where)
        elif program == "mkdir" or program.startswith(".venv/bin/"):
            self._run(command, assignments, where)
        else:
            pytest.fail(f"{where}: no rule in test_docs.py runs this command:\n  {command}")

    def _check_make_targets(self, targets: list[str], where: str) -> None:
        assert targets, f"{where}: make without a target"
        for target in targets:
            assert not target.startswith("-"), f"{where}: make options are not supported"
            done = subprocess.run(
                ["make", "-n", target], cwd=self.cwd, env=self.env, capture_output=True, check=False
            )
            assert done.returncode == 0, f"{where}: make -n {target}:\n{done.stderr.decode()}"

    def _start_server(self, command: str, words: list[str], where: str) -> None:
        addresses = [words[i + 1] for i, w in enumerate(words[:-1]) if w in {"--addr", "-a"}]
        assert len(addresses) == 1, f"{where}: the server needs one --addr"
        address = self.expand(addresses[0])
        log = self.logs / f"server-{len(self.servers)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.servers.append(Background(proc, address, log))
        assert wait_healthy(address, proc, log), f"{where}: the server exited:\n{log.read_text()}"

    def _run(self, command: str, assignments: dict[str, str], where: str) -> None:
        status = re.search(r"\s#.*\bexit status (\d+)\b", command)
        expected = int(status.group(1)) if status else 0
        server = None
        if OPA_URL_ENV in assignments:
            url = assignments[OPA_URL_ENV]
            server = next((s for s in self.servers if s.address == url), None)
            assert server, f"{where}: {OPA_URL_ENV}={url} names no server this document started"
        decisions_before = _decision_count(server.log) if server else 0
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            timeout=HANG_SECONDS,  # the command must end: a hang bound
            check=False,
        )
        output = f"{done.stdout.decode()}{done.stderr.decode()}"
        assert done.returncode == expected, (
            f"{where}: exit status {done.returncode}, expected {expected}:\n  {command}\n{output}"
        )
        if server:
            deadline = time.monotonic() + INNER_HANG_SECONDS
            while _decision_count(server.log) <= decisions_before:
                assert time.monotonic() < deadline, f"{where}: the server logged no decision"
                time.sleep(0.05)

    def close(self) -> None:
        for server in self.servers:
            if server.proc.poll() is None:
                server.proc.terminate()
                try:
                    server.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.proc.kill()
            server.proc.wait()
        shutil.rmtree(self.cwd, ignore_errors=True)
        shutil.rmtree(self.logs, ignore_errors=True)


def _decision_count(log: Path) -> int:
    return log.read_text(errors="replace").count('"msg":"Decision Log"')


def commands(block: Block) -> Iterator[tuple[str, int]]:
    """Each command of an sh block with its line number (continuations joined)."""
    pending, first = "", 0
    for number, line in enumerate(block.text.splitlines(), block.line + 1):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        first = first if pending else number
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        yield pending + line, first
        pending = ""
    assert not pending, f"{block}: a continuation line ends the block"


SH_DOCS = sorted({b.doc for b in blocks_of("sh")})


@pytest.mark.parametrize("doc", SH_DOCS, ids=[d.name for d in SH_DOCS])
def test_sh_blocks_run(doc: Path):
    session = ShellSession()
    try:
        for block in (b for b in blocks_of("sh") if b.doc == doc):
            for command, number in commands(block):
                session.run(command, f"{doc.relative_to(ROOT)}:{number}")
    finally:
        session.close()


# ---------------------------------------------------------------- docs/examples


def _params_comment(path: Path) -> dict[str, Any] | None:
    found = re.search(r"^#\s*params:\s*(\{.*\})\s*$", path.read_text(), re.M)
    return yaml.safe_load(found.group(1)) if found else None


def _check_compose_example(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ComposeInput.model_validate_json(path.read_text())
    assert main(["eval", "compose", str(path), "--catalogue", str(SALES)]) == EXIT_OK
    assert "visible: contact.read, quote.propose" in capsys.readouterr().out


def _check_execute_example(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = ExecuteInput.model_validate(yaml.safe_load(path.read_text()))
    params = _params_comment(path)
    assert params is not None, f"{path.name}: no '# params: {{...}}' comment for its digest"
    _assert_params_fit(params, load_catalogue(SALES).tool(facts.call.tool), facts)
    assert main(["eval", "execute", str(path), "--catalogue", str(SALES)]) == EXIT_DENIED
    assert "role_not_granted" in capsys.readouterr().out


def _check_over_limit_example(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = ExecuteInput.model_validate(yaml.safe_load(path.read_text()))
    params = _params_comment(path)
    assert params is not None, f"{path.name}: no '# params: {{...}}' comment for its digest"
    catalogue = load_catalogue(SALES)
    contract = catalogue.tool(facts.call.tool)
    _assert_params_fit(params, contract, facts)
    # What the dispatcher sends, converted by the demo's currency table.
    assert facts.call.values == values_of(contract, params, catalogue.currencies)
    argv = ["explain", "execute", str(path), "--catalogue", str(SALES)]
    assert main(argv) == EXIT_DENIED
    assert "allow: false (value_over_limit)" in capsys.readouterr().out


#: How each file in docs/examples/ is checked (against the sales demo catalogue).
EXAMPLE_FILES: dict[str, Callable[[Path, pytest.CaptureFixture[str]], None]] = {
    "compose.json": _check_compose_example,
    "execute.yaml": _check_execute_example,
    "payment-over-limit.yaml": _check_over_limit_example,
}


@pytest.mark.parametrize("path", sorted(EXAMPLES.iterdir()), ids=lambda p: p.name)
def test_example_file(path: Path, capsys):
    assert path.name in EXAMPLE_FILES, f"docs/examples/{path.name}: no check in EXAMPLE_FILES"
    EXAMPLE_FILES[path.name](path, capsys)


# ------------------------------------------------------- names the prose gives


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


@pytest.mark.parametrize("doc", documents(), ids=lambda d: d.name)
def test_paths_and_python_names_in_prose_exist(doc: Path):
    """Table paths (first column) exist; ``gateway.x``/``adapters.x`` names resolve.

    ``capgate.x`` is checked only when ``capgate/x`` exists, since Rego packages and
    logger names (``capgate.visibility``, ``capgate.dispatch``) share the prefix.
    """
    text = doc.read_text(encoding="utf-8")
    for cell in re.findall(r"^\|\s*(`[^|]*)\|", text, re.M):
        for path in re.findall(r"`([^`\s]+/[^`\s]*)`", cell):
            assert (ROOT / path).exists(), f"{doc.name}: table names missing path {path}"
    for dotted in re.findall(r"`((?:gateway|adapters|capgate)\.[A-Za-z_][\w.]*)", text):
        head = dotted.split(".")[1]
        if dotted.startswith("capgate.") and not (
            (ROOT / "capgate" / head).is_dir() or (ROOT / "capgate" / f"{head}.py").is_file()
        ):
            continue
        assert _resolves(dotted.rstrip(".")), f"{doc.name}: `{dotted}` does not resolve"
