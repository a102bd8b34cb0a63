"""A catalogue's representative calls (``fixtures.yaml``), against a real OPA (#21).

The demo's fixtures get their decisions; a contract change that changes one
(a limit lowered under the payment a fixture says is allowed) is refused before the
catalogue is served, naming the fixture, what it must get and what it got, and
``capgate worker`` does not start on it, pinning nothing. At load, a fixture must
name a tool the catalogue has, say what a denial's reasons are, and have a name of
its own; before serving, it must be a call its tool's contract takes. ``capgate diff`` shows every
fixture's decision at both sides and which ones the head no longer decides as they
expect (``tests/integration/test_diff.py``).
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from capgate.cli.main import EXIT_ERROR, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import CatalogueError
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.fixtures import FixtureCalls, check_fixtures
from capgate.gateway.state import open_store
from tests.hang import ANSWER_TIMEOUT
from tests.integration.catalogue_edits import edit_tool, payment_limit
from tests.integration.mcp_server_support import run_worker

pytestmark = pytest.mark.integration

SALES = demo_catalogue_dir("sales")


def copied(folder: Path, *, limit: int | None = None, fixtures: Any = None) -> Path:
    """The demo catalogue in ``folder``: its payment limit set to ``limit`` cents, its
    fixtures replaced by ``fixtures`` (a list), when given."""
    shutil.copytree(SALES, folder)
    if limit is not None:
        edit_tool(folder, "payment.execute", limits=payment_limit(limit))
    if fixtures is not None:
        text = yaml.safe_dump({"fixtures": fixtures}, sort_keys=False)
        (folder / "fixtures.yaml").write_text(text, encoding="utf-8")
    return folder


def demo_fixture(name_part: str) -> dict[str, Any]:
    document = yaml.safe_load((SALES / "fixtures.yaml").read_text(encoding="utf-8"))
    (fixture,) = [f for f in document["fixtures"] if name_part in f["name"]]
    return dict(fixture)


def test_the_demos_fixtures_get_their_decisions():
    catalogue = load_catalogue(SALES)
    assert len(catalogue.fixtures) >= 5
    with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
        outcomes = check_fixtures(catalogue, sidecar.client, datetime.now(UTC))
    assert [o.allow for o in outcomes] == [f.expect == "allow" for f in catalogue.fixtures]
    assert ("value_over_limit",) in [o.codes for o in outcomes]


def test_a_change_that_changes_a_fixtures_decision_is_refused(tmp_path: Path):
    lowered = load_catalogue(copied(tmp_path / "lowered", limit=100_000))
    with (
        PolicySidecar(lowered, timeout=ANSWER_TIMEOUT) as sidecar,
        pytest.raises(CatalogueError) as refused,
    ):
        check_fixtures(lowered, sidecar.client, datetime.now(UTC))
    # The payment within the old limit, and the one over the quorum threshold (now over
    # the limit too): every fixture that changed, each once.
    problem, quorum = refused.value.problems
    assert "dispatches only with two approvers" in quorum
    assert quorum.endswith("denied (approval_quorum_not_met, value_over_limit)")
    assert problem.startswith(
        "fixtures.yaml: fixture 'a finance agent proposes paying an approved invoice within "
        "its limit' (fixtures[0]): "
    )
    assert problem.endswith("must be allowed, but the policy has it denied (value_over_limit)")


def test_the_worker_does_not_start_on_a_failing_fixture_and_pins_nothing(tmp_path: Path):
    folder = copied(tmp_path / "lowered", limit=100_000)
    store = str(tmp_path / "state.db")
    opened = open_store(store)
    with opened.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
    opened.close()
    done = run_worker(folder, store, tmp_path)
    assert done.returncode == EXIT_ERROR, done.stderr
    assert "must be allowed, but the policy has it denied (value_over_limit)" in done.stderr
    with open_store(store) as reopened, reopened.transaction(read_only=True) as tx:
        assert tx.contract_pins() == []  # a start that fails pins nothing


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tool": "payment.refund"}, "field 'tool': unknown tool 'payment.refund'"),
        ({"expect": "deny", "reasons": []}, "name the reason codes the denial must give"),
        ({"reasons": ["value_over_limit"]}, "an allowed call gives no reasons"),
        ({"stage": "later"}, "field 'stage'"),
        ({"principal": {"agent": "a b", "role": "finance", "tenant": "acme"}}, "principal.agent"),
    ],
)
def test_a_fixture_must_be_a_call_its_contract_takes(tmp_path: Path, change, says):
    fixture = {**demo_fixture("within its limit"), **change}
    with pytest.raises(CatalogueError) as refused:
        load_catalogue(copied(tmp_path / "bad", fixtures=[fixture]))
    assert any(p.startswith("fixtures.yaml: fixture ") and says in p
               for p in refused.value.problems), refused.value.problems  # fmt: skip


def test_a_fixture_its_contract_does_not_take_is_refused_before_serving(tmp_path: Path):
    fixture = {**demo_fixture("within its limit"), "params": {"invoice_id": "inv-9"}}
    catalogue = load_catalogue(copied(tmp_path / "bad", fixtures=[fixture]))
    with (
        PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar,
        pytest.raises(CatalogueError) as refused,
    ):
        check_fixtures(catalogue, sidecar.client, datetime.now(UTC))
    (problem,) = refused.value.problems
    assert "field 'params': not a call its tool takes: tool 'payment.execute': parameter" in (
        problem
    )


def test_two_fixtures_of_one_name_are_refused(tmp_path: Path):
    fixture = demo_fixture("within its limit")
    with pytest.raises(CatalogueError, match="given to more than one fixture"):
        load_catalogue(copied(tmp_path / "twice", fixtures=[fixture, fixture]))


def test_a_fixture_is_asked_as_the_gateway_would_ask_its_call():
    catalogue = load_catalogue(SALES)
    fixture = next(f for f in catalogue.fixtures if f.stage is not None)
    facts = FixtureCalls(catalogue).input(fixture, datetime.now(UTC))
    payment = catalogue.tools["payment.execute"]
    # Prepared by the dispatcher: the declared values converted, the subject read.
    assert facts.call.values["amount_eur_cents"] == 300_000
    assert facts.call.subject is not None
    assert facts.call.subject.id == "inv-9"
    assert facts.call.version == payment.version
    assert facts.approval is not None
    assert facts.approval.digest == facts.call.params_digest
    assert [a.by for a in facts.approval.approvers] == ["carl"]
    assert facts.connections == {"bank": "active"}


def test_doctor_asks_the_fixtures_as_serve_would(tmp_path: Path, capsys):
    assert main(["doctor", "--catalogue", str(SALES), "--json"]) == EXIT_OK
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    assert checks["fixtures"]["ok"] is True
    assert checks["fixtures"]["facts"]["fixtures"] == len(load_catalogue(SALES).fixtures)
    lowered = copied(tmp_path / "lowered", limit=100_000)
    assert main(["doctor", "--catalogue", str(lowered)]) == EXIT_ERROR
    out = capsys.readouterr().out
    assert "FAIL fixtures     2 of 5 fixture(s) do not get their decision" in out
    assert "denied (value_over_limit)" in out
