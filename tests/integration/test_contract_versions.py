"""Contract versions pinned to their content, on both backends (schema 10, #21).

The first start that serves a contract version pins its content digest; a later
start with other content under the same number is refused (``catalogue_invalid``,
naming the tool, the field and the version to give it), and pins nothing, not even
the other tools' new versions. A new version is pinned beside the old; rewording a
description needs none; a changed schema, limit or role does. ``capgate worker``
refuses to start on such a catalogue before OPA is started.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from capgate.cli.main import EXIT_ERROR
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.catalogue.compile import contract_digest
from capgate.gateway.errors import CatalogueError
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.service.versions import pin_contracts
from capgate.gateway.state.store import SCHEMA_VERSION, Store
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.catalogue_edits import edit_tool
from tests.integration.mcp_server_support import run_worker
from tests.integration.store_support import FakeClock

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock


def edited(tmp_path: Path, name: str, **changes: Any) -> Catalogue:
    """The sales catalogue with fields of tool ``name`` changed."""
    return load_catalogue(edited_folder(tmp_path, name, **changes))


def edited_folder(tmp_path: Path, name: str, **changes: Any) -> Path:
    """:func:`edited`'s catalogue folder, one of its own in ``tmp_path``."""
    folder = tmp_path / f"sales-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(demo_catalogue_dir("sales"), folder)
    edit_tool(folder, name, **changes)
    return folder


def pins(store: Store) -> dict[tuple[str, int], str]:
    with store.transaction(read_only=True) as tx:
        return {(p.tool, p.version): p.digest for p in tx.contract_pins()}


def pin_rows(store: Store) -> list[tuple[str | None, int | None]]:
    return [(r.tool, r.contract_version) for r in store.ledger() if r.kind == "contract_pin"]


def test_the_first_start_pins_every_version_and_a_second_changes_nothing(
    store: Store, clock: FakeClock
):
    assert store.schema_version() == SCHEMA_VERSION == 10
    sales = load_catalogue(demo_catalogue_dir("sales"))
    made = pin_contracts(store, sales)
    assert sorted(p.tool for p in made) == sorted(sales.tools)
    assert pins(store) == {(name, c.version): contract_digest(c) for name, c in sales.tools.items()}
    assert all(p.pinned_at == clock.now for p in made)
    assert len(pin_rows(store)) == len(sales.tools)
    assert pin_contracts(store, sales) == []
    assert len(pin_rows(store)) == len(sales.tools)


def test_a_changed_contract_under_its_old_version_is_refused_and_pins_nothing(
    store: Store, tmp_path: Path
):
    sales = load_catalogue(demo_catalogue_dir("sales"))
    pin_contracts(store, sales)
    before = pins(store)
    payment = sales.tools["payment.execute"]
    # payment.execute lets another role in, still as version 1; and a new tool
    # version beside it, which must not be pinned by a refused start either.
    changed = edited(tmp_path, "payment.execute", roles=[*payment.roles, "sales"])
    changed.tools["contact.read"] = changed.tools["contact.read"].model_copy(update={"version": 2})
    with pytest.raises(CatalogueError) as refused:
        pin_contracts(store, changed)
    (problem,) = refused.value.problems
    assert problem.startswith("tools.yaml: tool 'payment.execute': field 'version': version 1 ")
    assert "give it version 2" in problem
    assert pins(store) == before
    assert len(pin_rows(store)) == len(sales.tools)


def test_a_new_version_is_pinned_beside_the_old_and_the_bump_counts_from_the_newest(
    store: Store, tmp_path: Path
):
    pin_contracts(store, load_catalogue(demo_catalogue_dir("sales")))
    schema = {"type": "object", "properties": {"contact_id": {"type": "string"}},
              "required": ["contact_id"], "additionalProperties": True}  # fmt: skip
    second = edited(tmp_path, "contact.read", version=2, input_schema=schema)
    made = pin_contracts(store, second)
    assert [(p.tool, p.version) for p in made] == [("contact.read", 2)]
    assert {("contact.read", 1), ("contact.read", 2)} <= set(pins(store))
    # Version 1 again, changed: the version to give it is 3, after the newest.
    again = edited(tmp_path, "contact.read", input_schema=schema)
    with pytest.raises(CatalogueError, match="give it version 3"):
        pin_contracts(store, again)


def test_a_reworded_description_needs_no_new_version(store: Store, tmp_path: Path):
    pin_contracts(store, load_catalogue(demo_catalogue_dir("sales")))
    reworded = edited(tmp_path, "contact.read", description="Read a CRM contact, worded anew.")
    assert pin_contracts(store, reworded) == []


def test_the_worker_refuses_to_start_on_a_changed_contract(
    store: Store, store_url: str, tmp_path: Path
):
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
    pin_contracts(store, load_catalogue(demo_catalogue_dir("sales")))
    quote = load_catalogue(demo_catalogue_dir("sales")).tools["quote.prepare_send"]
    folder = edited_folder(tmp_path, quote.name, roles=[*quote.roles, "finance"])
    done = run_worker(folder, store_url, tmp_path)
    assert done.returncode == EXIT_ERROR, done.stderr
    assert "tool 'quote.prepare_send': field 'version': version 1" in done.stderr
    assert "give it version 2" in done.stderr
