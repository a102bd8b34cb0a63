"""Versions kept for the work in flight: a bumped contract leaves proposals on theirs.

Against a real OPA and both stores (#21). A payment is proposed and approved under
version 1 of ``payment.execute``; then the catalogue moves to version 2, whose limit
the payment is over. With version 1 kept in ``retained.yaml`` the approved proposal
dispatches under version 1 (its limit, its schemas; the outcome and the ledger say
version 1), while every new proposal is made and decided under version 2. Without
it, the same proposal is blocked as ``version_mismatch``. A kept copy that is not
what was served as version 1 is refused at start, and a kept version must be older
than today's, of a reviewed tool the catalogue has. ``Gateway.migrate`` and
``capgate proposals migrate`` move a proposal to today's version explicitly: proposed
again under today's contract (a call it refuses changes nothing), the old one blocked
as ``proposal_migrated`` with its approvals, the new one pending a review of its
own, recorded, and only within the operator's own tenant.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from capgate.adapters.fronts.people import current_os_user
from capgate.cli.main import EXIT_DENIED, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.errors import (
    CapabilityViolation,
    CatalogueError,
    InvalidInput,
    UnknownProposal,
)
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import Reviewer
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.versions import pin_contracts
from capgate.gateway.state.records import ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from tests.hang import ANSWER_TIMEOUT
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.catalogue_edits import edit_tool, payment_limit
from tests.integration.lifecycle_support import (
    CONTROLLER,
    FINANCE,
    PAY_TASK,
    PAYMENT,
    agent_request,
    make_gateway,
    proposal_of,
    seed,
)

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

SALES = demo_catalogue_dir("sales")


def payment_v1() -> dict[str, Any]:
    document = yaml.safe_load((SALES / "tools.yaml").read_text(encoding="utf-8"))
    (payment,) = [t for t in document["tools"] if t["name"] == "payment.execute"]
    return dict(payment)


def bumped(folder: Path, *, keep: list[dict[str, Any]] | None) -> Path:
    """The demo catalogue in ``folder`` with payment.execute at version 2, its limit
    at 1,000.00 EUR (the demo payment is 1,200.00), keeping ``keep``."""
    shutil.copytree(SALES, folder)
    edit_tool(folder, "payment.execute", version=2, limits=payment_limit(100_000))
    if keep is not None:
        retained = {"retained": keep}
        (folder / "retained.yaml").write_text(yaml.safe_dump(retained), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def catalogues(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Catalogue]:
    root = tmp_path_factory.mktemp("versions")
    return {
        "v1": load_catalogue(SALES),
        "v2 keeping v1": load_catalogue(bumped(root / "keeping", keep=[payment_v1()])),
        "v2": load_catalogue(bumped(root / "dropping", keep=None)),
    }


@pytest.fixture(scope="module")
def sidecars(catalogues: dict[str, Catalogue]) -> Iterator[dict[str, PolicySidecar]]:
    with contextlib.ExitStack() as stack:
        yield {
            name: stack.enter_context(PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT))
            for name, catalogue in catalogues.items()
        }


def gateway(
    name: str, catalogues: dict[str, Catalogue], sidecars: dict[str, PolicySidecar], store: Store
) -> tuple[Gateway, SalesDesk]:
    pin_contracts(store, catalogues[name])  # as every start does
    desk = SalesDesk()
    return make_gateway(catalogues[name], sidecars[name].client, store, desk.tools()), desk


def approved_payment(gateway: Gateway) -> ProposalRecord:
    request = agent_request(FINANCE, PAY_TASK)
    gateway.call(request, "invoice.check_approval", {"invoice_id": "inv-9"})
    proposal = gateway.call(request, "payment.execute", PAYMENT)
    assert isinstance(proposal, ProposalRecord)
    gateway.review(proposal.id, CONTROLLER, "approved")
    return proposal


def test_an_approved_proposal_dispatches_under_its_kept_version(catalogues, sidecars, store):
    seed(store, budget_limit=None)
    old, _ = gateway("v1", catalogues, sidecars, store)
    proposal = approved_payment(old)
    assert proposal.contract_version == 1

    new, desk = gateway("v2 keeping v1", catalogues, sidecars, store)
    outcome = new.dispatch(proposal.id)
    assert outcome.ok, outcome
    assert outcome.version == 1
    assert [p["amount_cents"] for p in desk.payments.values()] == [PAYMENT["amount_cents"]]
    rows = [r for r in store.ledger() if r.operation_id == proposal.operation_id]
    assert [(r.kind, r.contract_version) for r in rows] == [
        ("proposal", 1), ("review", 1), ("dispatch", 1), ("intent", 1), ("outcome", 1)
    ]  # fmt: skip

    # New work is today's: proposed under version 2, and over its limit.
    request = agent_request(FINANCE, {**PAY_TASK, "id": "task-pay-10"})
    new.call(request, "invoice.check_approval", {"invoice_id": "inv-9"})
    with pytest.raises(CapabilityViolation) as over:
        new.call(request, "payment.execute", PAYMENT)
    assert over.value.reason_codes == ["value_over_limit"]
    smaller = new.call(request, "payment.execute", {**PAYMENT, "amount_cents": 90_000})
    assert isinstance(smaller, ProposalRecord)
    assert smaller.contract_version == 2


def test_a_proposal_whose_version_is_not_kept_is_blocked(catalogues, sidecars, store):
    seed(store, budget_limit=None)
    old, _ = gateway("v1", catalogues, sidecars, store)
    proposal = approved_payment(old)
    new, desk = gateway("v2", catalogues, sidecars, store)
    with pytest.raises(CapabilityViolation) as blocked:
        new.dispatch(proposal.id)
    assert "version_mismatch" in blocked.value.reason_codes
    assert proposal_of(store, proposal.id).status is ProposalStatus.BLOCKED
    assert desk.payments == {}


def test_a_kept_copy_that_is_not_what_was_served_is_refused(catalogues, store, tmp_path: Path):
    pin_contracts(store, catalogues["v1"])
    altered = {**payment_v1(), "roles": ["finance", "sales"]}
    with pytest.raises(CatalogueError) as refused:
        pin_contracts(store, load_catalogue(bumped(tmp_path / "altered", keep=[altered])))
    (problem,) = refused.value.problems
    assert problem.startswith("retained.yaml: tool 'payment.execute' version 1: ")
    assert "keep that one exactly, or none" in problem


@pytest.mark.parametrize(
    ("kept", "says"),
    [
        ({"version": 2}, "a kept version is older than the catalogue's, version 2"),
        ({"version": 3}, "a kept version is older than the catalogue's, version 2"),
        ({"name": "payment.refund"}, "tools.yaml has no tool 'payment.refund'"),
        ({"roles": ["finance", "nobody"]}, "field 'roles[1]': unknown role 'nobody'"),
    ],
)
def test_a_kept_version_must_be_an_older_one_of_a_reviewed_tool(
    tmp_path: Path, kept: dict[str, Any], says: str
):
    with pytest.raises(CatalogueError) as refused:
        load_catalogue(bumped(tmp_path / "bad", keep=[{**payment_v1(), **kept}]))
    assert any(p.startswith("retained.yaml: ") and says in p for p in refused.value.problems), (
        refused.value.problems
    )


def test_a_direct_tool_has_no_kept_versions(tmp_path: Path):
    document = yaml.safe_load((SALES / "tools.yaml").read_text(encoding="utf-8"))
    (read,) = [t for t in document["tools"] if t["name"] == "contact.read"]
    folder = bumped(tmp_path / "direct", keep=[read])
    edit_tool(folder, "contact.read", version=2)
    with pytest.raises(CatalogueError, match="only a reviewed tool's versions are kept"):
        load_catalogue(folder)


def test_keeping_versions_is_in_the_digest_and_keeping_none_changes_nothing(catalogues):
    kept = compile_catalogue(catalogues["v2 keeping v1"])
    plain = compile_catalogue(catalogues["v2"])
    assert kept["retained"]["payment.execute"]["1"]["version"] == 1
    assert "retained" not in plain
    assert "retained" not in compile_catalogue(catalogues["v1"])
    assert kept["meta"]["digest"] != plain["meta"]["digest"]


def test_explain_says_which_version_decided(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    # The documented payment dispatch, made under version 1.
    example = str(Path(__file__).resolve().parents[2] / "docs" / "examples" / "execute.yaml")
    keeping = bumped(tmp_path / "keeping", keep=[payment_v1()])
    main(["explain", "execute", example, "--catalogue", str(keeping)])
    out = capsys.readouterr().out
    assert "contract: version 1, kept for the work proposed under it (retained.yaml)\n" in out
    assert "version_mismatch" not in out
    main(["explain", "execute", example, "--catalogue", str(bumped(tmp_path / "v2", keep=None))])
    out = capsys.readouterr().out
    assert "contract: version 2\n" in out
    assert "version_mismatch" in out


# -- moving proposals to today's version ---------------------------------------------------

OPERATOR = Reviewer(id="olga", role="controller", tenant="acme", kind="operator",
                    authenticated_by="os-user:olga")  # fmt: skip


def test_migrating_proposes_again_under_todays_version_and_voids_the_approval(
    catalogues, sidecars, store
):
    seed(store, budget_limit=None)
    old, _ = gateway("v1", catalogues, sidecars, store)
    small = {**PAYMENT, "amount_cents": 90_000}
    request = agent_request(FINANCE, PAY_TASK)
    old.call(request, "invoice.check_approval", {"invoice_id": "inv-9"})
    within = old.call(request, "payment.execute", small)
    over = approved_payment(old)  # 1,200.00: over version 2's limit
    assert isinstance(within, ProposalRecord)
    old.review(within.id, CONTROLLER, "approved")

    new, desk = gateway("v2 keeping v1", catalogues, sidecars, store)
    # Today's policy refuses the larger payment: nothing changes, the refusal is recorded.
    with pytest.raises(CapabilityViolation) as refused:
        new.migrate(over.id, by=OPERATOR)
    assert refused.value.reason_codes == ["value_over_limit"]
    assert proposal_of(store, over.id).status is ProposalStatus.APPROVED

    moved = new.migrate(within.id, by=OPERATOR)
    assert (moved.contract_version, moved.status) == (2, ProposalStatus.PENDING)
    assert moved.params == within.params
    assert moved.operation_id != within.operation_id
    assert moved.proposer == within.proposer
    gone = proposal_of(store, within.id)
    assert (gone.status, gone.reason_codes) == (ProposalStatus.BLOCKED, ["proposal_migrated"])
    (row,) = [r for r in store.ledger() if r.kind == "migration"]
    assert (row.principal, row.proposal_id, row.contract_version) == (
        "olga/controller", within.id, 1
    )  # fmt: skip
    assert (row.detail["to"], row.detail["to_version"]) == (moved.id, 2)
    assert row.detail["authenticated_by"] == "os-user:olga"

    # The approval stayed with the old proposal: the new one needs its own.
    with pytest.raises(CapabilityViolation) as early:
        new.dispatch(moved.id)
    assert "approval_required" in early.value.reason_codes
    new.review(moved.id, CONTROLLER, "approved")
    outcome = new.dispatch(moved.id)
    assert (outcome.ok, outcome.version) == (True, 2)
    with pytest.raises(CapabilityViolation) as blocked:
        new.dispatch(within.id)
    assert "proposal_not_approved" in blocked.value.reason_codes
    assert [p["amount_cents"] for p in desk.payments.values()] == [90_000]

    # Nothing to migrate twice, and nothing of another tenant's.
    with pytest.raises(InvalidInput, match="only a pending or approved proposal"):
        new.migrate(within.id, by=OPERATOR)
    today = new.call(request, "payment.execute", {**small, "amount_cents": 80_000})
    assert isinstance(today, ProposalRecord)
    with pytest.raises(InvalidInput, match="already, the catalogue's"):
        new.migrate(today.id, by=OPERATOR)
    stranger = OPERATOR.model_copy(update={"tenant": "globex"})
    with pytest.raises(UnknownProposal):
        new.migrate(over.id, by=stranger)


def _operator_config(folder: Path, tenant: str = "acme") -> str:
    path = folder / f"operator-{tenant}.yaml"
    operator = {"os_user": current_os_user(), "id": "olga", "role": "controller",
                "tenant": tenant}  # fmt: skip
    path.write_text(json.dumps({"tools": "capgate.demo.tools.sales_desk:SalesDesk",
                                "operators": [operator]}), encoding="utf-8")  # fmt: skip
    path.chmod(0o600)
    return str(path)


def test_the_command_line_migrates_a_tools_proposals(
    catalogues, sidecars, store, store_url: str, tmp_path: Path, capsys
):
    seed(store, budget_limit=None)
    old, _ = gateway("v1", catalogues, sidecars, store)
    over = approved_payment(old)
    request = agent_request(FINANCE, PAY_TASK)
    within = old.call(request, "payment.execute", {**PAYMENT, "amount_cents": 90_000})
    keeping = bumped(tmp_path / "keeping", keep=[payment_v1()])
    base = ["proposals", "migrate", "--catalogue", str(keeping), "--store", store_url,
            "--config", _operator_config(tmp_path)]  # fmt: skip
    assert main([*base, "--tool", "payment.execute", "--json"]) == EXIT_DENIED
    said = json.loads(capsys.readouterr().out)
    results = {r["proposal"]: r for r in said["results"]}
    assert said["by"] == "olga"
    assert results[over.id]["migrated"] is False
    assert [r["code"] for r in results[over.id]["reasons"]] == ["value_over_limit"]
    assert results[within.id]["migrated"] is True
    assert results[within.id]["version"] == 2
    # Done: nothing is left under version 1 that today's policy would take.
    assert main([*base, within.id]) == EXIT_DENIED
    assert "only a pending or approved proposal is migrated" in capsys.readouterr().out
    # Another tenant's operator sees no proposals to move, and cannot name one.
    globex = [*base[:-1], _operator_config(tmp_path, "globex")]
    assert main([*globex, "--tool", "payment.execute"]) == EXIT_OK
    assert "nothing to migrate" in capsys.readouterr().out
    assert main([*globex, over.id]) == EXIT_DENIED
    assert "unknown_proposal" in capsys.readouterr().out
    assert proposal_of(store, over.id).status is ProposalStatus.APPROVED
