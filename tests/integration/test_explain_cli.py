"""``capgate explain compose|execute`` against a real OPA: the table, the JSON, the
agreement with ``capgate eval``, and the refusal of an explanation that disagrees."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from capgate.cli.commands.common import EXIT_DENIED, EXIT_ERROR, EXIT_OK
from capgate.cli.main import main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.model.facts import ComposeInput
from capgate.gateway.opa.bundle import write_bundle
from capgate.gateway.opa.policies import POLICIES_ENV, default_policies_dir
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.policy.timeouts import DEFAULT_TIMEOUT, whole_catalogue_timeout
from tests.integration.large_catalogue import write_large_catalogue
from tests.integration.opa_servers import external_opa

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SALES = str(demo_catalogue_dir("sales"))
COMPOSE_CHECKS = ["role", "task", "connection", "environment", "budget", "quarantine"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args, "--catalogue", SALES])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cells(line: str) -> list[str]:
    """A table row's cells: columns are two or more spaces apart."""
    return re.split(r"\s{2,}", line.strip())


def as_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code, out, err = run(capsys, *args, "--json")
    assert code in {EXIT_OK, EXIT_DENIED}, err
    return code, json.loads(out)


def test_explain_compose_prints_every_tool_check_by_check(capsys):
    code, out, _ = run(capsys, "explain", "compose", str(EXAMPLES / "compose.json"))

    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0].startswith("catalogue: sha256:")
    assert lines[2].split() == ["tool", "verdict", "check", "result", "reason", "facts", "read"]
    payment = next(i for i, line in enumerate(lines) if line.startswith("payment.execute "))
    rows = [cells(line) for line in lines[payment : payment + 6]]
    assert rows[0] == [
        "payment.execute",
        "hidden",
        "role",
        "FAIL",
        "role_not_granted",
        'role="sales"',
    ]
    assert [row[-4] for row in rows] == COMPOSE_CHECKS
    assert rows[4][-3:] == [
        "FAIL",
        "budget_class_exceeded",
        'budget_class="standard", cost_class="high"',
    ]
    assert rows[1][-3:-1] == ["pass", "-"]
    assert lines[-1] == "visible: 2 of 7 tool(s): contact.read, quote.propose"


def test_explain_compose_json_is_the_entrypoints_answer_and_agrees_with_eval(capsys):
    code, explained = as_json(capsys, "explain", "compose", str(EXAMPLES / "compose.json"))
    assert code == EXIT_OK
    assert set(explained) >= {"catalogue_digest", "tools"}
    assert set(explained["tools"]) == {
        "contact.read",
        "contact.verify_email",
        "consent.check",
        "quote.propose",
        "quote.prepare_send",
        "payment.execute",
        "invoice.check_approval",
    }
    for tool in explained["tools"].values():
        assert [check["check"] for check in tool["checks"]] == COMPOSE_CHECKS
        assert tool["visible"] == all(check["pass"] for check in tool["checks"])
        for check in tool["checks"]:
            assert (check["code"] is None) == check["pass"]

    code, decided = as_json(capsys, "eval", "compose", str(EXAMPLES / "compose.json"))
    assert sorted(decided["visible"]) == sorted(
        name for name, tool in explained["tools"].items() if tool["visible"]
    )
    for name, reasons in decided["excluded"].items():
        failing = {c["code"] for c in explained["tools"][name]["checks"] if not c["pass"]}
        assert {reason["code"] for reason in reasons} == failing


def test_explain_compose_one_tool(capsys):
    code, out, _ = run(
        capsys, "explain", "compose", str(EXAMPLES / "compose.json"), "--tool", "payment.execute"
    )
    assert code == EXIT_OK
    tools = [line.split()[0] for line in out.splitlines()[3:-1] if not line.startswith(" ")]
    assert tools == ["payment.execute"]
    code, explained = as_json(
        capsys, "explain", "compose", str(EXAMPLES / "compose.json"), "--tool", "quote.propose"
    )
    assert list(explained["tools"]) == ["quote.propose"]
    assert explained["tools"]["quote.propose"]["visible"] is True


def test_explain_execute_denied_exits_3_with_the_failing_checks(capsys):
    code, out, _ = run(capsys, "explain", "execute", str(EXAMPLES / "execute.yaml"))

    assert code == EXIT_DENIED
    assert "call: tool payment.execute, stage dispatch, operation pay-001" in out
    assert "contract: version 1\n" in out
    rows = {cells(line)[0]: cells(line) for line in out.splitlines()[5:-1]}
    assert rows["role"][1:3] == ["FAIL", "role_not_granted"]
    assert rows["proposal"][1:3] == ["FAIL", "proposal_not_approved"]
    assert rows["version"][1:3] == ["pass", "-"]
    assert out.splitlines()[-1] == (
        "allow: false (approval_required, budget_class_exceeded, proposal_not_approved, "
        "role_not_granted)"
    )


def test_explain_execute_json_agrees_with_eval(capsys):
    code, explained = as_json(capsys, "explain", "execute", str(EXAMPLES / "execute.yaml"))
    assert code == EXIT_DENIED
    assert explained["allow"] is False
    failing = {check["code"] for check in explained["checks"] if not check["pass"]}

    code, decided = as_json(capsys, "eval", "execute", str(EXAMPLES / "execute.yaml"))
    assert code == EXIT_DENIED
    assert {reason["code"] for reason in decided["reasons"]} == failing
    assert explained["catalogue_digest"] == decided["catalogue_digest"]


def test_explain_execute_of_an_allowed_call_exits_0(capsys, tmp_path):
    document = json.loads((EXAMPLES / "compose.json").read_text(encoding="utf-8"))
    facts = document.get("input", document)
    call = {
        **facts,
        "call": {
            "tool": "contact.read",
            "version": 1,
            "operation_id": "op-1",
            "subject": {"type": "contact", "id": "c-42"},
            "params_digest": "sha256:" + "0" * 64,
        },
        "budget": {"remaining": None, "cost": 0},
    }
    call["task"] = {**facts["task"], "linked_resources": [{"type": "contact", "id": "c-42"}]}
    path = tmp_path / "call.json"
    path.write_text(json.dumps(call), encoding="utf-8")

    code, out, err = run(capsys, "explain", "execute", str(path))

    assert code == EXIT_OK, out + err
    assert out.splitlines()[-1] == "allow: true"
    assert "FAIL" not in out


def test_bad_input_or_tool_is_an_error(capsys, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("principal: [\n", encoding="utf-8")
    code, _, err = run(capsys, "explain", "compose", str(broken))
    assert code == EXIT_ERROR
    assert err.startswith("capgate: error [input_invalid]:")
    code, _, err = run(
        capsys, "explain", "compose", str(EXAMPLES / "compose.json"), "--tool", "no.such.tool"
    )
    assert code == EXIT_ERROR
    assert "the catalogue has no tool" in err


def test_an_explanation_that_disagrees_with_the_decision_is_refused(capsys, tmp_path, monkeypatch):
    # Policies whose compose decision shows a tool that every explanation hides.
    policies = tmp_path / "policies"
    shutil.copytree(default_policies_dir(), policies)
    compose = policies / "capgate" / "compose" / "compose.rego"
    text = compose.read_text(encoding="utf-8")
    assert text.count('"visible": visibility.visible_tools,') == 1
    compose.write_text(
        text.replace(
            '"visible": visibility.visible_tools,',
            '"visible": visibility.visible_tools | {"payment.execute"},',
        ),
        encoding="utf-8",
    )
    monkeypatch.setenv(POLICIES_ENV, str(policies))

    code, out, err = run(capsys, "explain", "compose", str(EXAMPLES / "compose.json"))

    assert code == EXIT_ERROR
    assert out == ""
    assert "disagree about which tools are visible" in err


def test_explain_compose_of_a_1000_tool_catalogue_agrees_with_eval(capsys, tmp_path):
    catalogue = tmp_path / "catalogue"
    write_large_catalogue(catalogue)
    facts = {
        "principal": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
        "task": {"type": "customer_quote", "id": "t-1"},
        "connections": {"crm": "active", "sales_mailbox": "revoked"},
        "environment": "production",
        "budget_class": "standard",
    }
    path = tmp_path / "compose.json"
    path.write_text(json.dumps(facts), encoding="utf-8")

    args = ["compose", str(path), "--catalogue", str(catalogue), "--json"]
    assert main(["explain", *args]) == EXIT_OK
    explained = json.loads(capsys.readouterr().out)
    assert main(["eval", *args]) == EXIT_OK
    decided = json.loads(capsys.readouterr().out)

    assert len(explained["tools"]) == 1000
    visible = sorted(name for name, tool in explained["tools"].items() if tool["visible"])
    assert visible == sorted(decided["visible"])
    # sales tools on crm (n % 3 == 0): 334 of them, all free and listed.
    assert len(visible) == 334


def test_the_sidecar_allows_explaining_1000_tools_time_for_every_tool(tmp_path):
    catalogue = tmp_path / "catalogue"
    write_large_catalogue(catalogue)
    facts = ComposeInput.model_validate(json.loads((EXAMPLES / "compose.json").read_text()))

    with PolicySidecar(load_catalogue(catalogue)) as sidecar:
        client = sidecar.client
        explained = client.explain_compose(facts)

    assert len(explained.tools) == 1000
    assert client.timeout == DEFAULT_TIMEOUT  # what compose and execute wait
    assert client.catalogue_size == 1000
    assert client.catalogue_timeout == whole_catalogue_timeout(DEFAULT_TIMEOUT, 1000)


def test_explain_asks_an_external_opa_when_given_one(capsys, tmp_path):
    bundle = write_bundle(load_catalogue(Path(SALES)), tmp_path / "bundle")
    with external_opa(bundle, tmp_path / "opa.log") as server:
        code, out, err = run(
            capsys, "explain", "compose", str(EXAMPLES / "compose.json"), "--opa", server.address
        )
        assert code == EXIT_OK, err
        assert out.splitlines()[-1] == "visible: 2 of 7 tool(s): contact.read, quote.propose"
        code, _, err = run(
            capsys, "explain", "execute", str(EXAMPLES / "execute.yaml"), "--opa", server.address
        )
        assert code == EXIT_DENIED, err
    # OPA logged both explanations and both decisions it was asked for.
    log = (tmp_path / "opa.log").read_text(encoding="utf-8")
    for path in ("capgate/explain/compose", "capgate/explain/execute"):
        assert path in log
