"""The command line, the demo, and the external-OPA path, each against a real OPA."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from capgate.cli.main import EXIT_DENIED, EXIT_ERROR, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.demo.scenes import run_demo
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from tests.hang import ANSWER_TIMEOUT
from tests.integration.opa_servers import external_opa, free_port

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs" / "examples"
SALES = str(demo_catalogue_dir("sales"))


def test_demo_runs_every_scene_and_holds_every_expectation():
    out = io.StringIO()
    assert run_demo(out) == 0
    trace = out.getvalue()
    assert "FAIL" not in trace
    assert "demo finished: every expectation held" in trace
    denial = next(line for line in trace.splitlines() if "sales-bot" in line and "payment" in line)
    assert "DENY" in denial
    assert "role_not_granted" in denial
    assert "decision_id=" in denial
    assert "decision_id=-" not in denial  # a real OPA decision id, not a placeholder


def test_cli_eval_compose_prints_visible_and_reasons(capsys):
    code = main(["eval", "compose", str(DOCS / "compose.json"), "--catalogue", SALES])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert "visible: contact.read, quote.propose" in out
    assert "excluded: payment.execute" in out
    assert "role_not_granted" in out


def test_cli_eval_execute_deny_exits_3_with_reasons(capsys):
    code = main(["eval", "execute", str(DOCS / "execute.yaml"), "--catalogue", SALES, "--json"])
    decision = json.loads(capsys.readouterr().out)
    assert code == EXIT_DENIED
    assert decision["allow"] is False
    codes = {r["code"] for r in decision["reasons"]}
    assert codes == {
        "role_not_granted",
        "budget_class_exceeded",
        "approval_required",
        "proposal_not_approved",
    }
    assert decision["decision_id"]


def test_cli_eval_rejects_bad_input_naming_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"principal": {"agent": "a", "role": "r"}}))
    code = main(["eval", "compose", str(bad), "--catalogue", SALES])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert "input_invalid" in err
    assert "principal.tenant" in err


def test_cli_check_and_bundle(tmp_path, capsys):
    assert main(["check", SALES]) == EXIT_OK
    assert "7 tool(s)" in capsys.readouterr().out
    assert main(["bundle", SALES, str(tmp_path / "b")]) == EXIT_OK
    assert (tmp_path / "b" / ".manifest").is_file()


def test_external_opa_serves_the_bundle_the_cli_wrote(
    tmp_path, sales_catalogue: Catalogue, monkeypatch
):
    assert main(["bundle", SALES, str(tmp_path / "bundle")]) == EXIT_OK
    with external_opa(tmp_path / "bundle", tmp_path / "opa.log") as server:
        monkeypatch.setenv(OPA_URL_ENV, server.address)
        with PolicySidecar(sales_catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
            assert not sidecar.embedded
            assert sidecar.client.catalogue_digest() == sidecar.expected_digest


def test_external_opa_with_another_catalogue_is_refused(tmp_path, oracle_catalogue: Catalogue):
    assert main(["bundle", SALES, str(tmp_path / "bundle")]) == EXIT_OK
    with (
        external_opa(tmp_path / "bundle", tmp_path / "opa.log") as server,
        pytest.raises(PolicyUnavailable, match="catalogue"),
    ):
        PolicySidecar(oracle_catalogue, opa_url=server.address, timeout=ANSWER_TIMEOUT)


def test_unreachable_external_opa_fails_closed(sales_catalogue: Catalogue):
    with pytest.raises(PolicyUnavailable):
        PolicySidecar(sales_catalogue, opa_url=f"http://127.0.0.1:{free_port()}")


def test_cli_bad_opa_address_is_an_error_not_a_traceback(capsys):
    code = main(
        [
            "eval",
            "compose",
            str(DOCS / "compose.json"),
            "--catalogue",
            SALES,
            "--opa",
            "http://localhost:8181",
        ]
    )
    assert code == EXIT_ERROR
    assert "loopback IP literal" in capsys.readouterr().err


# -- version, help, doctor ---------------------------------------------------------


def test_version_prints_the_distribution_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"capgate {version('capgate')}"


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        ([], ["0", "2", "130"]),
        (["eval"], ["0", "2", "3", "130"]),
        (["demo"], ["0", "1", "2", "130"]),
        (["doctor"], ["0", "2", "130"]),
        (["check"], ["0", "2", "130"]),
        (["bundle"], ["0", "2", "130"]),
    ],
)
def test_every_help_lists_its_exit_codes(command, codes, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    section = out[out.index("exit status") :]
    listed = [line.split()[0] for line in section.splitlines()[1:] if line.strip()]
    assert listed == codes


def test_doctor_reports_what_is_in_use_and_checks_it(capsys):
    assert main(["doctor", "--catalogue", SALES, "--json"]) == EXIT_OK
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert all(c["ok"] for c in checks.values())
    repo = Path(__file__).resolve().parents[2]
    assert checks["opa binary"]["facts"]["version"] == "1.22.4"
    assert checks["policies"]["facts"]["path"] == str(repo / "policies")
    assert checks["catalogue"]["facts"]["digest"].startswith("sha256:")
    assert checks["opa address"]["facts"]["embedded"] is True
    assert checks["opa address"]["facts"]["address"].startswith("unix://")


def test_doctor_names_each_failure_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CAPGATE_OPA_BIN", str(tmp_path / "no-opa"))
    assert main(["doctor", "--catalogue", str(tmp_path)]) == EXIT_ERROR
    out = capsys.readouterr().out
    failed = [line.split()[1:3] for line in out.splitlines() if line.startswith("FAIL")]
    assert failed == [["opa", "binary"], ["catalogue", str(tmp_path) + ":"]]
    assert "CAPGATE_OPA_BIN" in out


def test_doctor_checks_an_external_opa_against_the_catalogue(tmp_path, capsys):
    assert main(["bundle", SALES, str(tmp_path / "bundle")]) == EXIT_OK
    capsys.readouterr()
    with external_opa(tmp_path / "bundle", tmp_path / "opa.log") as server:
        assert main(["doctor", "--catalogue", SALES, "--opa", server.address]) == EXIT_OK
        assert f"external, {server.address}" in capsys.readouterr().out
        oracle = str(demo_catalogue_dir("oracle-grove"))
        assert main(["doctor", "--catalogue", oracle, "--opa", server.address]) == EXIT_ERROR
        assert "FAIL opa address" in capsys.readouterr().out


# -- eval applies the dispatcher's checks, and real OPA answers pass them ---------------


def test_cli_eval_execute_allow_from_real_opa_passes_the_dispatchers_checks(tmp_path, capsys):
    from datetime import UTC, datetime, timedelta

    from capgate.gateway.digest import params_digest

    params = {
        "invoice_id": "inv-9",
        "amount_cents": 120_000,
        "currency": "EUR",
        "beneficiary": "DE44500105175407324931",
    }
    digest = params_digest(params)
    document = {
        "principal": {"agent": "bot", "role": "finance", "tenant": "acme"},
        "task": {
            "type": "invoice_payment",
            "linked_resources": [{"type": "invoice", "id": "inv-9"}],
        },
        "connections": {"bank": "active"},
        "environment": "production",
        "budget_class": "unlimited",
        "call": {
            "tool": "payment.execute",
            "version": 1,
            "operation_id": "pay-inv-9",
            "subject": {"type": "invoice", "id": "inv-9"},
            "params_digest": digest,
        },
        "approval": {
            "kind": "exact_content_and_recipient",
            "tool": "payment.execute",
            "operation_id": "pay-inv-9",
            "tenant": "acme",
            "digest": digest,
            "expires_at": (datetime.now(UTC) + timedelta(minutes=10)).isoformat(),
            "approved_by": "carl",
            "used": False,
        },
        "stage": "dispatch",
        "proposal": {"id": "prop-9", "status": "approved"},
        "budget": {"remaining": None, "cost": 20},
        # The invoice's approval is about the invoice paid (#21).
        "evidence_about": [
            {
                "name": "invoice_approved",
                "subject": {"type": "invoice", "id": "inv-9"},
                "expires_at": None,
            }
        ],
    }
    path = tmp_path / "allowed.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    assert main(["eval", "execute", str(path), "--catalogue", SALES]) == EXIT_OK
    out = capsys.readouterr().out
    assert "allow: true" in out
    assert 'obligation: pass_idempotency_key {"key": "pay-inv-9"}' in out
