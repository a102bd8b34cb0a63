"""Task links the gateway owns, in the store, on both backends (schema version 9, #21).

Linking a resource to a task is a recorded act: one row per task and resource, with
who linked it and when, and a ``task_link`` ledger row in the same transaction.
Linking again keeps the first link and is recorded as ``already_linked``; two
linking at once make one link; unlinking removes it (``unlinked``, or
``not_linked`` when there was none). A task type with ``links: recorded`` works on
the recorded links only, against a real OPA: a request may narrow them and never
widen them, and a link removed after an approval blocks the dispatch. A tenant's
links are its own: the same task id in another tenant has none of them. Bad input
is refused naming the field, before anything is written; an unknown tenant writes
nothing. The command line
(``capgate tasks links|link|unlink``) goes through the same calls.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from capgate.cli.main import EXIT_ERROR, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.errors import CapabilityViolation, InvalidInput, UnknownTenant
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ResourceRef
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.links import link_resource, task_links, unlink_resource
from capgate.gateway.state import open_store
from capgate.gateway.state.migrations import MIGRATIONS
from capgate.gateway.state.open import backend_for
from capgate.gateway.state.sql import SqlStore
from capgate.gateway.state.sql.links import MAX_LINKS
from capgate.gateway.state.store import SCHEMA_VERSION, Store
from tests.hang import ANSWER_TIMEOUT
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.lifecycle_support import (
    CONTROLLER,
    FINANCE,
    PAY_TASK,
    PAYMENT,
    TENANT,
    agent_request,
    make_gateway,
    seed,
)
from tests.integration.store_support import FakeClock, raw_query

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

INV_9 = ResourceRef(type="invoice", id="inv-9")
REPO = ResourceRef(type="repository", id="acme/billing")


def _tenants(store: Store) -> None:
    with store.transaction() as tx:
        for tenant in ("acme", "globex"):
            tx.put_tenant(tenant, budget_class="standard", budget_limit=None)


def _link_rows(store: Store) -> list[tuple[Any, ...]]:
    return [
        (r.tenant, r.principal, r.outcome, r.detail["task_id"], r.detail["resource"]["id"])
        for r in store.ledger()
        if r.kind == "task_link"
    ]


def test_a_link_is_recorded_once_with_who_and_when(store: Store, clock: FakeClock):
    assert store.schema_version() == SCHEMA_VERSION >= 9
    _tenants(store)
    link, made = link_resource(store, "acme", "task-pay-9", INV_9, by="maria")
    assert made is True
    assert (link.resource, link.linked_by, link.linked_at) == (INV_9, "maria", clock.now)
    first = clock.now
    clock.now = first.replace(minute=first.minute + 1)
    again, made = link_resource(store, "acme", "task-pay-9", {"type": "invoice", "id": "inv-9"},
                                by="omar")  # fmt: skip
    assert made is False
    assert (again.linked_by, again.linked_at) == ("maria", first)  # the first link stands
    link_resource(store, "acme", "task-pay-9", REPO, by="omar")
    assert [(x.resource, x.linked_by) for x in task_links(store, "acme", "task-pay-9")] == [
        (INV_9, "maria"),
        (REPO, "omar"),
    ]
    assert _link_rows(store) == [
        ("acme", "maria", "linked", "task-pay-9", "inv-9"),
        ("acme", "omar", "already_linked", "task-pay-9", "inv-9"),
        ("acme", "omar", "linked", "task-pay-9", "acme/billing"),
    ]
    assert store.verify_ledger().ok


def test_unlinking_removes_the_link_and_is_recorded(store: Store):
    _tenants(store)
    link_resource(store, "acme", "t-1", INV_9, by="maria")
    removed = unlink_resource(store, "acme", "t-1", INV_9, by="omar")
    assert removed is not None
    assert removed.linked_by == "maria"
    assert task_links(store, "acme", "t-1") == []
    assert unlink_resource(store, "acme", "t-1", INV_9, by="omar") is None
    assert [row[2] for row in _link_rows(store)] == ["linked", "unlinked", "not_linked"]


def test_a_tenants_links_are_its_own(store: Store):
    _tenants(store)
    link_resource(store, "acme", "task-1", INV_9, by="maria")
    assert task_links(store, "globex", "task-1") == []
    # Unlinking in another tenant removes nothing of acme's.
    assert unlink_resource(store, "globex", "task-1", INV_9, by="gina") is None
    assert [x.resource for x in task_links(store, "acme", "task-1")] == [INV_9]


def test_two_linking_at_once_make_one_link(store: Store):
    _tenants(store)
    start = threading.Barrier(2)

    def link(by: str) -> bool:
        start.wait(timeout=600)
        return link_resource(store, "acme", "t-1", INV_9, by=by)[1]

    with ThreadPoolExecutor(max_workers=2) as pool:
        made = sorted(pool.map(link, ["maria", "omar"]))
    assert made == [False, True]
    assert len(task_links(store, "acme", "t-1")) == 1
    assert sorted(row[2] for row in _link_rows(store)) == ["already_linked", "linked"]


@pytest.mark.parametrize(
    ("tenant", "task", "resource", "names"),
    [
        ("acme corp", "t-1", INV_9, "tenant: 'acme corp'"),
        ("acme", "", INV_9, "task: ''"),
        ("acme", "t-1", {"type": "invoice"}, "resource: id"),
        ("acme", "t-1", {"type": "in voice", "id": "inv-9"}, "resource: type"),
        ("acme", "t-1", "invoice:inv-9", "resource: resource"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    store: Store, store_url: str, tenant: Any, task: Any, resource: Any, names: str
):
    _tenants(store)
    with pytest.raises(InvalidInput, match=names):
        link_resource(store, tenant, task, resource, by="maria")
    assert raw_query(store_url, "SELECT task_id FROM task_links") == []
    assert _link_rows(store) == []


def test_an_unknown_tenant_writes_nothing(store: Store, store_url: str):
    with pytest.raises(UnknownTenant):
        link_resource(store, "initech", "t-1", INV_9, by="maria")
    with pytest.raises(UnknownTenant):
        unlink_resource(store, "initech", "t-1", INV_9, by="maria")
    assert raw_query(store_url, "SELECT task_id FROM task_links") == []
    assert _link_rows(store) == []


def test_a_task_has_at_most_max_links(store: Store):
    _tenants(store)
    with store.transaction() as tx:
        for n in range(MAX_LINKS):
            tx.link_resource("acme", "t-1", ResourceRef(type="doc", id=f"d-{n}"), by="bulk")
    with pytest.raises(InvalidInput, match=f"{MAX_LINKS} links already"):
        link_resource(store, "acme", "t-1", INV_9, by="maria")
    assert len(task_links(store, "acme", "t-1")) == MAX_LINKS
    assert _link_rows(store) == []  # the refused link left no ledger row either


def test_a_version_8_store_is_upgraded_with_no_links(store_url: str, clock: FakeClock):
    eighth = SqlStore(backend_for(store_url), migrations=list(MIGRATIONS[:8]), clock=clock)
    assert eighth.schema_version() == 8
    with eighth.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
    eighth.close()
    upgraded = open_store(store_url, clock=clock)
    try:
        assert upgraded.schema_version() == SCHEMA_VERSION
        assert task_links(upgraded, "acme", "t-1") == []
        link_resource(upgraded, "acme", "t-1", INV_9, by="maria")
        assert len(task_links(upgraded, "acme", "t-1")) == 1
    finally:
        upgraded.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_command_line_links_lists_and_unlinks(store: Store, store_url: str, capsys):
    _tenants(store)
    where = ["--store", store_url]
    code, out, err = cli(capsys, "tasks", "link", "acme", "task-pay-9", "invoice:inv-9",
                         "--by", "maria", *where)  # fmt: skip
    assert (code, out) == (EXIT_OK, "linked invoice:inv-9 to task acme/task-pay-9 (by maria)\n"), (
        err
    )
    code, out, _ = cli(capsys, "tasks", "link", "acme", "task-pay-9", "invoice:inv-9",
                       "--by", "omar", *where)  # fmt: skip
    assert code == EXIT_OK
    assert "was linked to task acme/task-pay-9 already, by maria" in out
    assert "nothing changed" in out
    code, out, _ = cli(capsys, "tasks", "links", "acme", "task-pay-9", "--json", *where)
    [listed] = json.loads(out)
    assert (listed["resource"], listed["linked_by"]) == (
        {"type": "invoice", "id": "inv-9"},
        "maria",
    )
    code, out, _ = cli(capsys, "tasks", "links", "acme", "task-pay-9", *where)
    assert "invoice:inv-9" in out
    assert "maria" in out
    code, out, _ = cli(capsys, "tasks", "unlink", "acme", "task-pay-9", "invoice:inv-9",
                       "--by", "omar", "--json", *where)  # fmt: skip
    assert json.loads(out)["unlinked"]["linked_by"] == "maria"
    code, out, _ = cli(capsys, "tasks", "links", "acme", "task-pay-9", *where)
    assert "has no links" in out

    # Bad input names the argument; nothing is written.
    before = len(store.ledger())
    code, out, err = cli(capsys, "tasks", "link", "acme", "t-1", "inv-9", *where)
    assert (code, out) == (EXIT_ERROR, "")
    assert "resource 'inv-9' is not TYPE:ID" in err
    code, _, err = cli(capsys, "tasks", "link", "initech", "t-1", "invoice:inv-9", *where)
    assert code == EXIT_ERROR
    assert "initech" in err
    assert len(store.ledger()) == before


# -- a task type whose links are the store's, against a real OPA ---------------------------


@pytest.fixture(scope="module")
def recorded_catalogue(tmp_path_factory: pytest.TempPathFactory) -> Catalogue:
    """The sales catalogue in which invoice payments work on the recorded links."""
    folder = tmp_path_factory.mktemp("recorded") / "sales"
    shutil.copytree(demo_catalogue_dir("sales"), folder)
    path = folder / "task_types.yaml"
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["task_types"]["invoice_payment"]["links"] = "recorded"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return load_catalogue(folder)


@pytest.fixture(scope="module")
def recorded_sidecar(recorded_catalogue: Catalogue) -> Iterator[PolicySidecar]:
    with PolicySidecar(recorded_catalogue, timeout=ANSWER_TIMEOUT) as running:
        yield running


@pytest.fixture
def payments(
    recorded_catalogue: Catalogue, recorded_sidecar: PolicySidecar, store_url: str
) -> Iterator[tuple[Gateway, SalesDesk]]:
    opened = open_store(store_url)
    try:
        seed(opened)
        desk = SalesDesk()
        yield make_gateway(recorded_catalogue, recorded_sidecar.client, opened, desk.tools()), desk
    finally:
        opened.close()


def _check(gateway: Gateway, task: dict[str, Any], invoice: str) -> Any:
    return gateway.call(agent_request(FINANCE, task), "invoice.check_approval",
                        {"invoice_id": invoice})  # fmt: skip


def test_a_recorded_task_works_on_what_was_linked_and_nothing_else(payments):
    gateway, desk = payments
    # The request names inv-9, as every finance request of the demo does: without a
    # recorded link that names nothing the task may work on.
    with pytest.raises(CapabilityViolation) as unlinked:
        _check(gateway, PAY_TASK, "inv-9")
    assert "subject_out_of_scope" in unlinked.value.reason_codes

    gateway.link_resource(TENANT, "task-pay-9", INV_9, by="controller-carl")
    assert _check(gateway, PAY_TASK, "inv-9").ok
    # A request cannot widen the links: naming inv-10 does not make it linked.
    wider = {**PAY_TASK, "linked_resources": [{"type": "invoice", "id": "inv-10"}]}
    with pytest.raises(CapabilityViolation) as widened:
        _check(gateway, wider, "inv-10")
    assert "subject_out_of_scope" in widened.value.reason_codes
    # It may narrow them: with inv-10 linked too, a request naming inv-9 alone
    # cannot touch inv-10; one naming none works on every link.
    gateway.link_resource(TENANT, "task-pay-9", {"type": "invoice", "id": "inv-10"}, by="carl")
    with pytest.raises(CapabilityViolation):
        _check(gateway, PAY_TASK, "inv-10")
    everything = {key: value for key, value in PAY_TASK.items() if key != "linked_resources"}
    before = len(desk.entered)
    _check(gateway, everything, "inv-10")  # allowed: the books say inv-10 is not approved
    assert desk.entered[before:] == ["invoice.check_approval"]


def test_an_invoice_unlinked_after_the_approval_is_not_paid(payments):
    gateway, desk = payments
    gateway.link_resource(TENANT, "task-pay-9", INV_9, by="carl")
    request = agent_request(FINANCE, PAY_TASK)
    gateway.call(request, "invoice.check_approval", {"invoice_id": "inv-9"})
    proposal = gateway.call(request, "payment.execute", PAYMENT)
    gateway.review(proposal.id, CONTROLLER, "approved")
    # The facts of the dispatch are the store's at that moment: the link is gone.
    gateway.unlink_resource(TENANT, "task-pay-9", INV_9, by="carl")
    with pytest.raises(CapabilityViolation) as blocked:
        gateway.dispatch(proposal.id)
    assert "subject_out_of_scope" in blocked.value.reason_codes
    assert not desk.payments


def test_links_as_the_source_change_the_catalogue_digest(recorded_catalogue: Catalogue):
    sales = load_catalogue(demo_catalogue_dir("sales"))
    ours = compile_catalogue(recorded_catalogue)
    assert ours["task_types"]["invoice_payment"]["links"] == "recorded"
    assert "links" not in compile_catalogue(sales)["task_types"]["invoice_payment"]
    assert ours["meta"]["digest"] != compile_catalogue(sales)["meta"]["digest"]
