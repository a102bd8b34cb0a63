"""The state commands of ``capgate``, against a real SQLite store and a real OPA.

Tenants and connections are set up with the command line itself; proposals are
made through the library, as an agent's service makes them (``Gateway.call`` with
the demo's SalesDesk tools); reviews go through the real review policy. Every
error path checks that nothing was partly written: the ledger, the proposals, the
reviews, the tenants, their budgets and connections are exactly as before.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from capgate.adapters.fronts.people import current_os_user
from capgate.cli.commands.common import STORE_ENV, redact_url
from capgate.cli.main import EXIT_DENIED, EXIT_ERROR, EXIT_OK, main
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.errors import CapabilityViolation
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.outcomes import OutcomeStatus
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state import open_store
from capgate.gateway.state.records import ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import HANG_SECONDS
from tests.integration.lifecycle_support import (
    FINANCE,
    PAY_TASK,
    PAYMENT,
    record_quote_evidence,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SALES = str(demo_catalogue_dir("sales"))
CATALOGUE = ["--catalogue", SALES]
TENANTS = ("acme", "globex")

QUOTE_TASK = {
    "type": "customer_quote",
    "id": "task-quote-17",
    "linked_resources": [
        {"type": "contact", "id": "c-42"},
        {"type": "opportunity", "id": "opp-17"},
    ],
}
EMAIL: dict[str, Any] = {
    "opportunity_id": "opp-17",
    "recipient": "ada@example.test",
    "subject": "Your quote",
    "body": "Dear Ada,\nplease find our quote attached.",
}
SECRETS = {
    ("acme", "sales_mailbox"): "cli-test-secret-5e1d",
    ("acme", "crm"): "cli-test-crm-77",
    ("acme", "bank"): "cli-test-bank-31",
}
_CONFIGS = Path(tempfile.mkdtemp(prefix="capgate-cli-operators-"))
atexit.register(shutil.rmtree, _CONFIGS, True)


def as_operator(
    operator_id: str, role: str, tenant: str, *, os_user: str | None = None
) -> list[str]:
    """``--config`` of a service configuration binding the OS user running the tests
    (or ``os_user``) to this operator: the command line reviews as whom the file says,
    never as a name on the command line."""
    path = _CONFIGS / f"{operator_id}-{role}-{tenant}-{os_user or 'me'}.yaml".replace("/", "_")
    user = os_user if os_user is not None else current_os_user()
    operator = {"os_user": user, "id": operator_id, "role": role, "tenant": tenant}
    path.write_text(
        json.dumps({"tools": "capgate.demo.tools.sales_desk:SalesDesk", "operators": [operator]})
    )
    path.chmod(0o600)
    return ["--config", str(path)]


MANAGER = as_operator("maria", "sales_manager", "acme")
MARK = as_operator("mark", "sales_manager", "acme")
SELF = as_operator("sales-bot", "sales_manager", "acme")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """argparse's own refusal (a missing or conflicting option): exit 2, usage on stderr."""
    with pytest.raises(SystemExit) as caught:
        main(list(argv))
    assert caught.value.code == EXIT_ERROR
    return capsys.readouterr().err


# -- the store and the world around it ----------------------------------------------------


@pytest.fixture
def url(tmp_path: Path) -> str:
    return str(tmp_path / "state" / "gateway.db")


@pytest.fixture
def seeded(url: str, capsys: pytest.CaptureFixture[str]) -> str:
    """A store with tenants acme (three connections) and globex, made with the CLI."""
    s = ["--store", url]
    for argv in (
        ["tenants", "add", "acme", "--budget-class", "unlimited", "--budget-limit", "100", *s],
        ["connections", "add", "acme", "crm", "--account", "acme@crm.example", *s],
        ["connections", "add", "acme", "sales_mailbox", "--account", "sales@acme.example", *s],
        ["connections", "add", "acme", "bank", "--account", "treasury@bank.example", *s],
        ["tenants", "add", "globex", "--budget-class", "standard", *s],
    ):
        code, _, err = cli(capsys, *argv)
        assert code == EXIT_OK, err
    return url


@dataclass
class World:
    url: str
    store: Store
    gateway: Gateway
    desk: SalesDesk
    opa: str  # the module's OPA, for --opa

    @property
    def store_option(self) -> list[str]:
        return ["--store", self.url]

    @property
    def review(self) -> list[str]:
        """The options every review command here takes: catalogue, OPA, store."""
        return [*CATALOGUE, "--opa", self.opa, "--store", self.url]

    def request(self, agent: str = "sales-bot") -> AgentRequest:
        return AgentRequest.model_validate(
            {
                "principal": {"agent": agent, "role": "sales", "tenant": "acme"},
                "task": QUOTE_TASK,
                "environment": "production",
            }
        )

    def propose(self, **changes: Any) -> ProposalRecord:
        proposal = self.gateway.call(self.request(), "quote.prepare_send", {**EMAIL, **changes})
        assert isinstance(proposal, ProposalRecord)
        return proposal

    def proposal(self, proposal_id: str) -> ProposalRecord:
        with self.store.transaction(read_only=True) as tx:
            found = tx.get_proposal(proposal_id)
        assert found is not None
        return found

    def snapshot(self) -> dict[str, Any]:
        """Everything a command could write."""
        ledger = [row.hash for row in self.store.ledger()]
        with self.store.transaction(read_only=True) as tx:
            tenants = {
                name: (tx.get_tenant(name), tx.budget(name), tx.connections(name))
                for name in TENANTS
            }
            proposals = {p.id: (p, tx.reviews(p.id)) for p in tx.list_proposals()}
        return {"ledger": ledger, "tenants": tenants, "proposals": proposals}


@pytest.fixture
def world(seeded: str, sales_catalogue: Catalogue, sales_sidecar: PolicySidecar) -> Iterator[World]:
    desk = SalesDesk()
    store = open_store(seeded)
    with store.transaction() as tx:  # what the task's earlier calls would have recorded
        record_quote_evidence(tx, "task-quote-17", source="test")
    gateway = Gateway(
        sales_catalogue,
        sales_sidecar.client,
        ToolRegistry(desk.tools()),
        store,
        credentials=StaticCredentials(SECRETS),
    )
    try:
        yield World(seeded, store, gateway, desk, sales_sidecar.client.address)
    finally:
        store.close()


# -- help -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        (["tenants"], ["0", "2", "130"]),
        (["tenants", "add"], ["0", "2", "130"]),
        (["tenants", "list"], ["0", "2", "130"]),
        (["connections"], ["0", "2", "130"]),
        (["connections", "list"], ["0", "2", "130"]),
        (["connections", "add"], ["0", "2", "130"]),
        (["connections", "variable"], ["0", "2", "130"]),
        (["connections", "revoke"], ["0", "2", "130"]),
        (["connections", "restore"], ["0", "2", "130"]),
        (["budget"], ["0", "2", "130"]),
        (["budget", "show"], ["0", "2", "130"]),
        (["budget", "set"], ["0", "2", "130"]),
        (["proposals"], ["0", "2", "3", "130"]),
        (["proposals", "list"], ["0", "2", "130"]),
        (["proposals", "show"], ["0", "2", "130"]),
        (["proposals", "approve"], ["0", "2", "3", "130"]),
        (["proposals", "reject"], ["0", "2", "3", "130"]),
        (["ledger"], ["0", "1", "2", "130"]),
        (["ledger", "show"], ["0", "2", "130"]),
        (["ledger", "verify"], ["0", "1", "2", "130"]),
    ],
)
def test_every_state_command_lists_its_exit_codes(command, codes, capsys):
    with pytest.raises(SystemExit) as caught:
        main([*command, "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    section = out[out.index("exit status") :]
    assert [line.split()[0] for line in section.splitlines()[1:] if line.strip()] == codes
    if command[-1] == "variable":  # a name, worked out without a store
        assert "--store" not in out
    elif command[-1] != "proposals" and len(command) == 2:
        assert "--store URL" in out
        assert f"${STORE_ENV}" in out


def test_the_proposals_help_says_dispatch_is_the_workers(capsys):
    with pytest.raises(SystemExit):
        main(["proposals", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Dispatch is not a command" in out
    assert "an execution worker (capgate serve runs one; capgate worker runs one alone)" in out


# -- the store address ----------------------------------------------------------------------


def test_the_store_comes_from_the_option_or_the_environment(seeded, capsys, monkeypatch):
    monkeypatch.delenv(STORE_ENV, raising=False)
    code, out, err = cli(capsys, "tenants", "list")
    assert code == EXIT_ERROR
    assert out == ""
    assert err.startswith("capgate: error [input_invalid]: no store given")
    assert "--store" in err
    assert f"${STORE_ENV}" in err

    monkeypatch.setenv(STORE_ENV, seeded)
    code, out, _ = cli(capsys, "tenants", "list")
    assert code == EXIT_OK
    assert out.splitlines()[0].split()[:3] == ["TENANT", "BUDGET", "CLASS"]
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["acme", "globex"]


@pytest.mark.parametrize(
    ("address", "code"),
    [
        ("mysql://ops:hunter2@db.example/state", "store_url_invalid"),
        ("postgresql:/ops:hunter2@db.example/state", "store_url_invalid"),
        (":memory:", "store_url_invalid"),
        ("sqlite://relative/path.db", "store_url_invalid"),
        ("{tmp}/missing/state.db", "store_not_found"),
        ("{tmp}/not-a-database.db", "store_error"),
        ("postgresql://ops:hunter2@127.0.0.1:1/state?connect_timeout=2", "store_error"),
    ],
)
def test_a_bad_store_address_is_an_error_that_creates_nothing(address, code, tmp_path, capsys):
    (tmp_path / "not-a-database.db").write_text("this is not SQLite\n" * 100)
    before = sorted(tmp_path.rglob("*"))
    store = address.format(tmp=tmp_path)
    for argv in (["tenants", "list"], ["ledger", "verify"], ["proposals", "list"]):
        status, out, err = cli(capsys, *argv, "--store", store)
        assert status == EXIT_ERROR, err
        assert out == ""
        assert err.startswith(f"capgate: error [{code}]: ")
        assert "hunter2" not in err
    assert sorted(tmp_path.rglob("*")) == before


def test_redact_url_cuts_every_form_of_password():
    assert redact_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert redact_url("postgresql://u:p:w@h/db") == "postgresql://u:***@h/db"
    assert redact_url("postgres:u:pw@h/db") == "postgres:u:***@h/db"
    assert (
        redact_url("postgresql:///db?host=/s&password=pw")
        == "postgresql:///db?host=/s&password=***"
    )
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_url("/var/lib/capgate/state.db") == "/var/lib/capgate/state.db"


def test_tenants_add_creates_the_store_and_records_who_did_it(url, capsys):
    add = ["tenants", "add", "acme", "--budget-class", "standard", "--budget-limit", "40"]
    code, out, err = cli(capsys, *add, *CATALOGUE, "--by", "ops", "--store", url)
    assert code == EXIT_OK, err
    assert out == "tenant acme added: budget class standard, limit 40 (by ops)\n"
    assert Path(url).is_file()
    assert oct(Path(url).stat().st_mode & 0o777) == "0o600"

    code, out, _ = cli(capsys, "tenants", "list", "--json", "--store", url)
    assert code == EXIT_OK
    (acme,) = json.loads(out)
    assert acme["tenant"] == "acme"
    assert acme["budget"] == {
        "tenant": "acme",
        "task_id": None,
        "limit": 40,
        "reserved": 0,
        "spent": 0,
        "remaining": 40,
    }
    assert acme["connections"] == {}

    code, out, _ = cli(capsys, "ledger", "show", "--json", "--store", url)
    (row,) = json.loads(out)
    assert (row["kind"], row["tenant"], row["principal"], row["outcome"]) == (
        "tenant",
        "acme",
        "ops",
        "added",
    )


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [
        (["acme", "--budget-class", "standard"], "duplicate_record", "'acme' exists already"),
        (["new one", "--budget-class", "standard"], "input_invalid", "TENANT: 'new one'"),
        (["beta", "--budget-class", "gold!"], "input_invalid", "--budget-class: 'gold!'"),
        (
            ["beta", "--budget-class", "standard", "--budget-limit", "-5"],
            "input_invalid",
            "--budget-limit: '-5'",
        ),
        (
            ["beta", "--budget-class", "standard", "--budget-limit", "ten"],
            "input_invalid",
            "--budget-limit: 'ten'",
        ),
        (
            ["beta", "--budget-class", "standard", "--budget-limit", str(2**62 + 1)],
            "input_invalid",
            "--budget-limit",
        ),
        (
            ["beta", "--budget-class", "gold", *CATALOGUE],
            "input_invalid",
            "'gold' is not a budget class of catalogue",
        ),
        (["beta", "--budget-class", "standard", "--by", " ops"], "input_invalid", "--by: ' ops'"),
    ],
)
def test_tenants_add_refuses_bad_input_and_writes_nothing(world, argv, code, names, capsys):
    before = world.snapshot()
    status, out, err = cli(capsys, "tenants", "add", *argv, *world.store_option)
    assert status == EXIT_ERROR
    assert out == ""
    assert err.startswith(f"capgate: error [{code}]: ")
    assert names in err
    assert world.snapshot() == before


def test_a_refused_tenants_add_on_a_new_path_creates_no_file(tmp_path, capsys):
    path = tmp_path / "fresh" / "state.db"
    status, _, err = cli(
        capsys, "tenants", "add", "bad name", "--budget-class", "standard", "--store", str(path)
    )
    assert status == EXIT_ERROR, err
    assert not path.parent.exists()


# -- connections --------------------------------------------------------------------------


def test_connections_add_and_list(seeded, capsys):
    code, out, _ = cli(capsys, "connections", "list", "acme", "--store", seeded)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0].split() == ["ALIAS", "STATUS", "ACCOUNT", "UPDATED"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["bank", "active", "treasury@bank.example"],
        ["crm", "active", "acme@crm.example"],
        ["sales_mailbox", "active", "sales@acme.example"],
    ]
    code, out, _ = cli(capsys, "connections", "list", "globex", "--json", "--store", seeded)
    assert (code, json.loads(out)) == (EXIT_OK, [])


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [
        (["add", "nobody", "crm", "--account", "a@b.example"], "unknown_tenant", "'nobody'"),
        (
            ["add", "acme", "crm", "--account", "other@crm.example"],
            "duplicate_record",
            "has a connection 'crm' already (status active)",
        ),
        (
            ["add", "acme", "mail box", "--account", "a@b.example"],
            "input_invalid",
            "ALIAS: 'mail box'",
        ),
        (["add", "acme", "mail", "--account", "a@b.example\x1b[2K"], "input_invalid", "--account"),
        (["list", "nobody"], "unknown_tenant", "'nobody'"),
        (
            ["revoke", "acme", "fax", "--by", "ops", *CATALOGUE],
            "unknown_connection",
            "tenant 'acme' has no connection 'fax'",
        ),
        (
            ["revoke", "nobody", "crm", "--by", "ops", *CATALOGUE],
            "unknown_tenant",
            "'nobody'",
        ),
        (["restore", "acme", "crm", "--by", "", *CATALOGUE], "input_invalid", "--by"),
        (
            ["revoke", "acme", "crm", "--by", "ops", "--catalogue", "/nonexistent"],
            "catalogue_invalid",
            "/nonexistent",
        ),
    ],
)
def test_connection_commands_refuse_bad_input_and_write_nothing(world, argv, code, names, capsys):
    before = world.snapshot()
    status, out, err = cli(capsys, "connections", *argv, *world.store_option)
    assert status == EXIT_ERROR
    assert out == ""
    assert err.startswith(f"capgate: error [{code}]: ")
    assert names in err
    assert world.snapshot() == before


def test_revoke_and_restore_need_the_catalogue_and_who_did_it(world, capsys):
    before = world.snapshot()
    err = usage_error(
        capsys, "connections", "revoke", "acme", "crm", "--by", "ops", *world.store_option
    )
    assert "--catalogue" in err
    err = usage_error(
        capsys, "connections", "restore", "acme", "crm", *CATALOGUE, *world.store_option
    )
    assert "--by" in err
    assert world.snapshot() == before


def test_revoke_blocks_the_queued_proposals_that_act_through_it(world, capsys):
    email = world.propose()
    approved = world.propose(subject="Following up")
    assert cli(capsys, "proposals", "approve", approved.id, *MANAGER, *world.review)[0] == EXIT_OK
    quote = world.gateway.call(
        world.request(),
        "quote.propose",
        {"opportunity_id": "opp-17", "amount_cents": 1200, "currency": "EUR"},
    )
    assert isinstance(quote, ProposalRecord)  # through the crm connection: not blocked

    mailbox = ["acme", "sales_mailbox", "--by", "ops", *CATALOGUE, *world.store_option]
    code, out, err = cli(capsys, "connections", "revoke", *mailbox)
    assert code == EXIT_OK, err
    assert out.splitlines()[0] == (
        "connection acme/sales_mailbox (sales@acme.example): active -> revoked (by ops)"
    )
    assert f"blocked proposal {email.id} (quote.prepare_send): connection_revoked" in out
    assert f"blocked proposal {approved.id} (quote.prepare_send): connection_revoked" in out
    for proposal in (email, approved):
        blocked = world.proposal(proposal.id)
        assert (blocked.status, blocked.reason_codes) == (
            ProposalStatus.BLOCKED,
            ["connection_revoked"],
        )
    assert world.proposal(quote.id).status is ProposalStatus.PENDING
    row = world.store.ledger(tenant="acme")[-1]
    assert (row.kind, row.principal, row.outcome) == ("connection", "ops", "revoked")
    assert row.detail == {
        "alias": "sales_mailbox",
        "account": "sales@acme.example",
        "blocked": [email.id, approved.id],
    }
    with pytest.raises(CapabilityViolation) as denied:
        world.gateway.dispatch(approved.id)
    assert "proposal_not_approved" in denied.value.reason_codes
    assert world.desk.mailbox == {}

    code, out, _ = cli(capsys, "connections", "restore", *mailbox, "--json")
    restored = json.loads(out)
    assert code == EXIT_OK
    assert restored["connection"]["status"] == "active"
    assert restored["previous_status"] == "revoked"
    assert world.proposal(approved.id).status is ProposalStatus.BLOCKED  # stays blocked
    secrets = set(SECRETS.values())
    assert not any(s in row.model_dump_json() for row in world.store.ledger() for s in secrets)


# -- budgets ----------------------------------------------------------------------------------


def test_budget_set_and_show_for_a_tenant_and_a_task(seeded, capsys):
    s = ["--store", seeded]
    code, out, _ = cli(capsys, "budget", "set", "acme", "40", "--by", "ops", *s)
    assert code == EXIT_OK
    assert out.splitlines() == [
        "budget of tenant acme: limit 100 -> 40 (by ops)",
        "  tenant budget: limit 40, reserved 0, spent 0, remaining 40",
    ]
    code, out, _ = cli(capsys, "budget", "set", "acme", "5", "--task", "task-1", *s)
    assert code == EXIT_OK
    assert "budget of task task-1 of tenant acme: limit unlimited -> 5" in out
    code, out, _ = cli(capsys, "budget", "show", "acme", "--task", "task-1", "--json", *s)
    shown = json.loads(out)
    assert (shown["task_id"], shown["limit"], shown["remaining"], shown["applies"]) == (
        "task-1",
        5,
        5,
        "task",
    )
    code, out, _ = cli(capsys, "budget", "show", "acme", "--task", "task-2", *s)
    assert "task task-2 has no limit of its own: the tenant's budget applies" in out
    assert "tenant budget: limit 40," in out
    code, out, _ = cli(capsys, "budget", "set", "acme", "--unlimited", "--task", "task-1", *s)
    assert "the task has no limit of its own now" in out
    code, out, _ = cli(capsys, "budget", "set", "acme", "--unlimited", *s)
    assert out.startswith("budget of tenant acme: limit 40 -> unlimited")
    code, out, _ = cli(capsys, "budget", "show", "acme", *s)
    assert "limit unlimited, reserved 0, spent 0, remaining unlimited" in out
    rows = [
        r
        for r in json.loads(cli(capsys, "ledger", "show", "--json", *s)[1])
        if r["kind"] == "budget"
    ]
    assert [(r["detail"]["task"], r["detail"]["limit"]) for r in rows] == [
        (None, 40),
        ("task-1", 5),
        ("task-1", None),
        (None, None),
    ]


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [
        (["set", "acme", "lots"], "input_invalid", "LIMIT: 'lots'"),
        (["set", "acme", "-1"], "input_invalid", "LIMIT: '-1'"),
        (["set", "acme", str(2**62 + 1)], "input_invalid", "LIMIT"),
        (["set", "acme", "5", "--unlimited"], "input_invalid", "not both or neither"),
        (["set", "acme"], "input_invalid", "not both or neither"),
        (["set", "nobody", "5"], "unknown_tenant", "'nobody'"),
        (["set", "acme", "5", "--task", "task one"], "input_invalid", "--task: 'task one'"),
        (["show", "nobody"], "unknown_tenant", "'nobody'"),
        (["show", "acme", "--task", "x" * 200], "input_invalid", "--task"),
    ],
)
def test_budget_commands_refuse_bad_input_and_write_nothing(world, argv, code, names, capsys):
    before = world.snapshot()
    status, out, err = cli(capsys, "budget", *argv, *world.store_option)
    assert status == EXIT_ERROR
    assert out == ""
    assert err.startswith(f"capgate: error [{code}]: ")
    assert names in err
    assert world.snapshot() == before


# -- proposals: list and show -----------------------------------------------------------------


def test_proposals_list_filters_by_tenant_and_status(world, capsys):
    first, second = world.propose(), world.propose(subject="Second")
    s = [*world.store_option]
    code, out, _ = cli(capsys, "proposals", "list", *s)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0].split() == [
        "PROPOSAL",
        "STATUS",
        "TENANT",
        "TOOL",
        "PROPOSER",
        "CREATED",
        "REASONS",
    ]
    assert [line.split()[:5] for line in lines[1:]] == [
        [first.id, "pending", "acme", "quote.prepare_send", "sales-bot/sales"],
        [second.id, "pending", "acme", "quote.prepare_send", "sales-bot/sales"],
    ]
    cli(capsys, "proposals", "reject", second.id, *MANAGER, *world.review)
    code, out, _ = cli(capsys, "proposals", "list", "--status", "pending", "--json", *s)
    assert [p["id"] for p in json.loads(out)] == [first.id]
    code, out, _ = cli(capsys, "proposals", "list", "--tenant", "globex", *s)
    assert out == "(no proposals)\n"
    code, out, err = cli(capsys, "proposals", "list", "--tenant", "nobody", *s)
    assert (code, out) == (EXIT_ERROR, "")
    assert err.startswith("capgate: error [unknown_tenant]: unknown tenant 'nobody'")
    assert "invalid choice" in usage_error(capsys, "proposals", "list", "--status", "sent", *s)


def test_proposals_show_prints_the_exact_content_and_recipient(world, capsys):
    proposal = world.propose()
    code, out, _ = cli(capsys, "proposals", "show", proposal.id, *world.store_option)
    assert code == EXIT_OK
    assert out.splitlines()[0] == f"proposal {proposal.id}"
    fields = dict(
        (line.split(":", 1)[0].strip(), line.split(":", 1)[1].strip())
        for line in out.splitlines()[1:14]
    )
    assert fields["status"] == "pending"
    assert fields["reasons"] == "(none)"
    assert fields["proposer"] == "sales-bot (role sales, tenant acme)"
    assert fields["task"] == "task-quote-17 (customer_quote)"
    assert fields["tool"] == "quote.prepare_send v1, dispatched as quote.dispatch_reviewed"
    assert fields["operation"] == proposal.operation_id
    assert fields["decision"] == proposal.decision_id
    assert fields["digest"] == f"{proposal.params_digest} (matches the parameters below)"
    for name, value in EMAIL.items():  # every parameter, exactly, as JSON
        assert f"    {name}: {json.dumps(value)}\n" in out
    assert '"Dear Ada,\\nplease find our quote attached."' in out
    assert "  reviews: (none)" in out

    code, out, _ = cli(capsys, "proposals", "show", proposal.id, "--json", *world.store_option)
    shown = json.loads(out)
    assert shown["proposal"]["params"] == EMAIL
    assert shown["proposal"]["params_digest"] == proposal.params_digest
    assert shown["digest_matches_params"] is True
    assert (shown["reviews"], shown["operation"]) == ([], None)


def test_proposals_show_escapes_what_a_terminal_would_act_on(world, capsys):
    hidden = {"subject": "Quote\x1b[2K\x1b[1A", "body": "Pay \u202eDE44 5001\u202c now\x9b31m"}
    proposal = world.propose(**hidden)
    code, out, _ = cli(capsys, "proposals", "show", proposal.id, *world.store_option)
    assert code == EXIT_OK
    assert not any(ch in out for ch in "\x1b\u202e\u202c\x9b")
    assert '    subject: "Quote\\u001b[2K\\u001b[1A"' in out
    assert '    body: "Pay \\u202eDE44 5001\\u202c now\\u009b31m"' in out
    code, out, _ = cli(capsys, "proposals", "show", proposal.id, "--json", *world.store_option)
    assert out.isascii()
    assert json.loads(out)["proposal"]["params"]["body"] == hidden["body"]


def test_proposals_show_says_when_the_stored_content_was_altered(world, capsys):
    proposal = world.propose()
    with sqlite3.connect(world.url) as db:  # someone edits the database behind capgate
        db.execute(
            "UPDATE proposals SET params = ? WHERE id = ?",
            (json.dumps({**EMAIL, "recipient": "eve@example.test"}), proposal.id),
        )
    db.close()
    code, out, _ = cli(capsys, "proposals", "show", proposal.id, *world.store_option)
    assert code == EXIT_OK
    assert "(DOES NOT MATCH the parameters below: the store was altered)" in out
    assert '    recipient: "eve@example.test"' in out


@pytest.mark.parametrize(
    ("proposal_id", "code", "names"),
    [
        ("prop-nope", "unknown_proposal", "unknown proposal 'prop-nope'"),
        ("bad id", "input_invalid", "PROPOSAL: 'bad id'"),
        ("-", "input_invalid", "PROPOSAL: '-'"),
    ],
)
def test_proposals_show_of_an_unknown_or_malformed_id(world, proposal_id, code, names, capsys):
    status, out, err = cli(capsys, "proposals", "show", proposal_id, *world.store_option)
    assert (status, out) == (EXIT_ERROR, "")
    assert err.startswith(f"capgate: error [{code}]: ")
    assert names in err


# -- proposals: approve and reject ------------------------------------------------------------


def test_an_approval_from_the_cli_is_dispatched_once_by_the_service(world, capsys):
    proposal = world.propose()
    # The embedded OPA this time (no --opa): what an operator's machine does.
    approve = ["proposals", "approve", proposal.id, *MANAGER, "--ttl", "1h"]
    code, out, err = cli(capsys, *approve, *CATALOGUE, *world.store_option)
    assert code == EXIT_OK, err
    lines = out.splitlines()
    assert lines[0].startswith(f"approved {proposal.id} (quote.prepare_send): review rev-")
    assert lines[1] == (
        f"  reviewer:  maria (operator, os-user:{current_os_user()}; role sales_manager, "
        "tenant acme)"
    )
    assert lines[3] == (
        f"  binds:     digest {proposal.params_digest}, operation {proposal.operation_id}, "
        "tenant acme"
    )
    assert "  next:      an execution worker dispatches it (capgate serve's, or capgate" in out
    assert world.proposal(proposal.id).status is ProposalStatus.APPROVED
    with world.store.transaction(read_only=True) as tx:
        (review,) = tx.reviews(proposal.id)
    assert (review.reviewer.id, review.reviewer.role, review.consumed_at) == (
        "maria",
        "sales_manager",
        None,
    )
    # Recorded as the operator the configuration binds to this OS user, and how.
    assert (review.reviewer.kind, review.reviewer.authenticated_by) == (
        "operator",
        f"os-user:{current_os_user()}",
    )
    (row,) = [r for r in world.store.ledger() if r.kind == "review"]
    assert (row.principal, row.outcome) == ("maria/sales_manager", "approved")
    assert row.detail["reviewer"] == "maria"
    assert row.detail["reviewer_kind"] == "operator"
    assert row.detail["authenticated_by"] == f"os-user:{current_os_user()}"
    assert 3590 < (review.expires_at - review.created_at).total_seconds() <= 3600
    _, out, _ = cli(capsys, "proposals", "show", proposal.id, *world.store_option)
    assert f"    {review.id}: approved by maria" in out
    assert "(not used yet)" in out

    sent = world.gateway.dispatch(proposal.id)  # the service's step
    assert sent.status is OutcomeStatus.SUCCESS
    assert len(world.desk.mailbox) == 1

    _, out, _ = cli(capsys, "proposals", "show", proposal.id, *world.store_option)
    assert "  status:      dispatched" in out
    assert "used at " in out
    assert f'  outcome:     success, receipt "{sent.provider_receipt}" (1 attempt(s)' in out

    # The used approval cannot be had again: the proposal is no longer pending.
    before = world.snapshot()
    code, out, _ = cli(capsys, "proposals", "approve", proposal.id, *MARK, *world.review)
    assert code == EXIT_DENIED
    assert "  - proposal_not_pending: " in out
    _assert_only_a_refusal_was_added(world, before, "proposal_not_pending")

    code, out, _ = cli(
        capsys, "ledger", "show", "--operation", proposal.operation_id, *world.store_option
    )
    chain = [tuple(line.split()[2:4]) for line in out.splitlines()]
    expected = iter(chain)  # in this order (other rows may come between)
    for step in [
        ("proposal", "pending"),
        ("review", "approved"),
        ("dispatch", "dispatched"),
        ("intent", "running"),
        ("outcome", "success"),
        ("review", "refused"),
    ]:
        assert step in expected, (step, chain)
    assert all(f"op={proposal.operation_id}" in line for line in out.splitlines())
    assert any(f"decision={review.decision_id}" in line for line in out.splitlines())
    assert len(world.desk.mailbox) == 1


def test_an_approval_short_of_the_quorum_says_so_and_queues_nothing(world, capsys):
    finance = AgentRequest.model_validate(
        {"principal": FINANCE.model_dump(), "task": PAY_TASK, "environment": "production"}
    )
    world.gateway.call(finance, "invoice.check_approval", {"invoice_id": "inv-9"})
    proposal = world.gateway.call(
        finance, "payment.execute", {**PAYMENT, "amount_cents": 300_000}
    )  # 3,000.00 EUR: two controllers
    assert isinstance(proposal, ProposalRecord)
    carl = as_operator("carl", "controller", "acme")
    code, out, err = cli(capsys, "proposals", "approve", proposal.id, *carl, *world.review)
    assert code == EXIT_OK, err
    assert "  quorum:    1 of the 2 distinct reviewers it needs has approved" in out
    assert "  next:      it stays pending until they have; then it is dispatched" in out
    assert "an execution worker dispatches it" not in out
    assert world.proposal(proposal.id).status is ProposalStatus.PENDING
    with world.store.transaction(read_only=True) as tx:
        assert tx.get_dispatch(proposal.id) is None

    # The same person again, as JSON: still one of two.
    code, out, _ = cli(capsys, "proposals", "approve", proposal.id, *carl, "--json", *world.review)
    assert (code, json.loads(out)["quorum"]) == (EXIT_OK, {"approvals": 1, "approvals_required": 2})
    dana = as_operator("dana", "controller", "acme")
    code, out, _ = cli(capsys, "proposals", "approve", proposal.id, *dana, "--json", *world.review)
    assert code == EXIT_OK
    assert "quorum" not in json.loads(out)
    assert world.proposal(proposal.id).status is ProposalStatus.APPROVED


def test_a_rejection_is_final(world, capsys):
    proposal = world.propose()
    code, out, _ = cli(
        capsys, "proposals", "reject", proposal.id, *MANAGER, "--json", *world.review
    )
    assert code == EXIT_OK
    answer = json.loads(out)
    assert answer["allow"] is True
    assert answer["review"]["verdict"] == "rejected"
    assert world.proposal(proposal.id).status is ProposalStatus.REJECTED
    with pytest.raises(CapabilityViolation) as denied:
        world.gateway.dispatch(proposal.id)
    assert "proposal_not_approved" in denied.value.reason_codes
    assert world.desk.mailbox == {}


def test_a_comment_is_kept_with_the_verdict_and_shown(world, capsys):
    approved, rejected = world.propose(), world.propose(subject="Another quote")
    words = "Checked with Ada.\n\tSend it today."
    code, out, err = cli(
        capsys, "proposals", "approve", approved.id, *MANAGER, "--comment", f" {words} ",
        *world.review,
    )  # fmt: skip
    assert code == EXIT_OK, err
    assert "  comment:   Checked with Ada.\n" in out
    assert "             \\tSend it today.\n" in out  # each line shown, terminal-safe
    code, out, err = cli(
        capsys, "proposals", "reject", rejected.id, *MANAGER, "--comment", "wrong recipient",
        "--json", *world.review,
    )  # fmt: skip
    assert code == EXIT_OK, err
    assert json.loads(out)["review"]["comment"] == "wrong recipient"
    with world.store.transaction(read_only=True) as tx:
        assert [r.comment for r in tx.reviews(approved.id)] == [words]
        assert [r.comment for r in tx.reviews(rejected.id)] == ["wrong recipient"]
    _, out, _ = cli(capsys, "proposals", "show", approved.id, *world.store_option)
    assert "      comment: Checked with Ada.\n" in out
    _, out, _ = cli(capsys, "proposals", "show", approved.id, "--json", *world.store_option)
    assert [r["comment"] for r in json.loads(out)["reviews"]] == [words]
    rows = [r for r in world.store.ledger() if r.kind == "review"]
    assert [(r.proposal_id, r.detail["commented"]) for r in rows] == [
        (approved.id, True),
        (rejected.id, True),
    ]
    assert not any("Ada" in json.dumps(r.model_dump(mode="json")) for r in rows)
    # Without --comment, there is none.
    plain = world.propose(subject="A third quote")
    assert cli(capsys, "proposals", "approve", plain.id, *MANAGER, *world.review)[0] == EXIT_OK
    with world.store.transaction(read_only=True) as tx:
        assert [r.comment for r in tx.reviews(plain.id)] == [None]
    assert world.store.ledger()[-1].detail["commented"] is False


def _assert_only_a_refusal_was_added(world: World, before: dict[str, Any], code: str) -> None:
    after = world.snapshot()
    assert after["proposals"] == before["proposals"]  # status, reviews: unchanged
    assert after["tenants"] == before["tenants"]
    assert after["ledger"][: len(before["ledger"])] == before["ledger"]
    (row,) = world.store.ledger()[len(before["ledger"]) :]  # the refusal, and only it
    assert (row.kind, row.outcome) == ("review", "refused")
    assert code in row.reason_codes
    assert row.decision_id


@pytest.mark.parametrize(
    ("reviewer", "code"),
    [
        (("sales-bot", "sales_manager", "acme"), "self_review"),
        # the proposer's name in other letters is the same identity
        (("Sales-Bot", "sales_manager", "acme"), "self_review"),
        (("sam", "sales", "acme"), "reviewer_not_permitted"),
        (("carl", "controller", "acme"), "reviewer_not_permitted"),
        (("gina", "sales_manager", "globex"), "tenant_mismatch"),
        (("olga", "owner", "acme"), "reviewer_not_permitted"),
    ],
)
@pytest.mark.parametrize("verdict", ["approve", "reject"])
def test_the_review_policy_refuses_with_exit_3_and_writes_only_the_refusal(
    world, reviewer, code, verdict, capsys
):
    proposal = world.propose()
    before = world.snapshot()
    operator, role, tenant = reviewer
    status, out, err = cli(
        capsys, "proposals", verdict, proposal.id, *as_operator(*reviewer), *world.review
    )
    assert status == EXIT_DENIED, err
    assert out.splitlines()[0].startswith(
        f"refused: {operator} (operator, os-user:{current_os_user()}; role {role}, "
        f"tenant {tenant}) may not "
    )
    assert out.splitlines()[1].startswith("decision_id: ")
    assert f"  - {code}: " in out
    _assert_only_a_refusal_was_added(world, before, code)


def test_a_refusal_in_json(world, capsys):
    proposal = world.propose()
    status, out, _ = cli(
        capsys, "proposals", "approve", proposal.id, *SELF, "--json", *world.review
    )
    assert status == EXIT_DENIED
    answer = json.loads(out)
    assert (answer["allow"], answer["proposal"], answer["verdict"]) == (
        False,
        proposal.id,
        "approved",
    )
    assert [r["code"] for r in answer["reasons"]] == ["self_review"]
    assert answer["decision_id"]


def test_an_approval_expires_and_is_not_given_twice(world, capsys):
    proposal = world.propose()
    assert (
        cli(capsys, "proposals", "approve", proposal.id, *MANAGER, "--ttl", "1s", *world.review)[0]
        == EXIT_OK
    )
    before = world.snapshot()
    status, out, _ = cli(capsys, "proposals", "approve", proposal.id, *MARK, *world.review)
    assert status == EXIT_DENIED
    assert "proposal_not_pending" in out
    _assert_only_a_refusal_was_added(world, before, "proposal_not_pending")

    time.sleep(1.2)
    _, out, _ = cli(capsys, "proposals", "show", proposal.id, *world.store_option)
    assert "(expired)" in out
    with pytest.raises(CapabilityViolation) as denied:  # OPA's clock decides, at dispatch
        world.gateway.dispatch(proposal.id)
    assert "approval_expired" in denied.value.reason_codes
    _, out, _ = cli(capsys, "proposals", "show", proposal.id, *world.store_option)
    assert "  status:      blocked" in out
    assert "  reasons:     approval_expired" in out
    assert world.desk.mailbox == {}


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [
        (["prop-nope", *MANAGER], "unknown_proposal", "unknown proposal 'prop-nope'"),
        (["prop nope", *MANAGER], "input_invalid", "PROPOSAL: 'prop nope'"),
        (
            ["{id}", *as_operator("maria", "sales_manager", "nobody")],
            "unknown_tenant",
            "unknown tenant 'nobody'",
        ),
        (
            ["{id}", *as_operator("maria!", "sales_manager", "acme")],
            "serve_config_invalid",
            "operators.0.id",
        ),
        (
            ["{id}", *as_operator("maria", "", "acme")],
            "serve_config_invalid",
            "operators.0.role",
        ),
        # no operator for the OS user running the command: nobody to review as
        (
            ["{id}", *as_operator("maria", "sales_manager", "acme", os_user="someone-else")],
            "authentication_failed",
            "no operator is configured for OS user",
        ),
        (["{id}"], "serve_config_invalid", "--config: name the service's configuration"),
        (["{id}", *MANAGER, "--ttl", "0s"], "input_invalid", "--ttl: '0s' is not between"),
        (["{id}", *MANAGER, "--ttl", "31d"], "input_invalid", "--ttl: '31d' is not between"),
        (["{id}", *MANAGER, "--ttl", "forever"], "input_invalid", "--ttl: 'forever'"),
        (["{id}", *MANAGER, "--ttl", ""], "input_invalid", "--ttl: ''"),
        (
            ["{id}", *MANAGER, "--comment", "x" * 2001],
            "input_invalid",
            "comment: must be at most 2000 characters",
        ),
        (
            ["{id}", *MANAGER, "--comment", "bell \x07"],
            "input_invalid",
            "comment: must have no control characters but newline and tab",
        ),
    ],
)
def test_review_input_errors_exit_2_and_write_nothing(
    world, argv, code, names, capsys, monkeypatch
):
    monkeypatch.delenv("CAPGATE_CONFIG", raising=False)
    proposal = world.propose()
    before = world.snapshot()
    argv = [a.format(id=proposal.id) for a in argv]
    status, out, err = cli(capsys, "proposals", "approve", *argv, *world.review)
    assert (status, out) == (EXIT_ERROR, ""), err
    assert err.startswith(f"capgate: error [{code}]: ")
    assert names in err
    assert world.snapshot() == before


def test_review_with_a_bad_catalogue_or_opa_exits_2_and_writes_nothing(world, tmp_path, capsys):
    proposal = world.propose()
    before = world.snapshot()
    status, out, err = cli(
        capsys,
        "proposals",
        "approve",
        proposal.id,
        *MANAGER,
        "--catalogue",
        str(tmp_path),
        *world.store_option,
    )
    assert (status, out) == (EXIT_ERROR, "")
    assert err.startswith("capgate: error [catalogue_invalid]: ")
    status, out, err = cli(
        capsys,
        "proposals",
        "approve",
        proposal.id,
        *MANAGER,
        *CATALOGUE,
        "--opa",
        "http://example.com:8181",
        *world.store_option,
    )
    assert (status, out) == (EXIT_ERROR, "")
    assert "loopback IP literal" in err
    assert "--ttl" in usage_error(
        capsys,
        "proposals",
        "reject",
        proposal.id,
        *MANAGER,
        "--ttl",
        "1h",
        *CATALOGUE,
        *world.store_option,
    )
    assert world.snapshot() == before


# -- the ledger ---------------------------------------------------------------------------------


def test_ledger_show_filters(world, capsys):
    proposal = world.propose()
    s = [*world.store_option]
    _, out, _ = cli(capsys, "ledger", "show", "--json", *s)
    rows = json.loads(out)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    _, out, _ = cli(capsys, "ledger", "show", "--proposal", proposal.id, "--json", *s)
    assert [r["kind"] for r in json.loads(out)] == ["proposal"]
    _, out, _ = cli(capsys, "ledger", "show", "--tenant", "globex", *s)
    assert [line.split()[2:4] for line in out.splitlines()] == [["tenant", "added"]]
    _, out, _ = cli(capsys, "ledger", "show", "--after", "2", "--limit", "2", "--json", *s)
    assert [r["seq"] for r in json.loads(out)] == [3, 4]
    _, out, _ = cli(capsys, "ledger", "show", "--after", str(len(rows)), *s)
    assert out == "(no ledger rows)\n"


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [
        (["--operation", "op 1"], "input_invalid", "--operation: 'op 1'"),
        (["--operation", "op-never"], "unknown_operation", "no row for operation 'op-never'"),
        (["--proposal", "prop-nope"], "unknown_proposal", "unknown proposal 'prop-nope'"),
        (["--tenant", "nobody"], "unknown_tenant", "unknown tenant 'nobody'"),
        (["--limit", "many"], "input_invalid", "--limit: 'many'"),
        (["--after", "-1"], "input_invalid", "--after: '-1'"),
    ],
)
def test_ledger_show_refuses_what_names_nothing(world, argv, code, names, capsys):
    status, out, err = cli(capsys, "ledger", "show", *argv, *world.store_option)
    assert (status, out) == (EXIT_ERROR, "")
    assert err.startswith(f"capgate: error [{code}]: ")
    assert names in err


def test_ledger_show_takes_one_filter(world, capsys):
    err = usage_error(
        capsys, "ledger", "show", "--tenant", "acme", "--operation", "op-1", *world.store_option
    )
    assert "not allowed with argument" in err


def test_ledger_verify_names_the_first_row_that_does_not_fit(world, capsys):
    world.propose()
    code, out, _ = cli(capsys, "ledger", "verify", *world.store_option)
    assert code == EXIT_OK
    count = len(world.store.ledger())
    assert f": ok, {count} row(s), the hash chain is whole" in out.splitlines()[0]
    assert out.splitlines()[1] == f"  last hash: {world.store.ledger()[-1].hash}"

    with sqlite3.connect(world.url) as db:  # a row changed behind capgate's back
        db.execute("UPDATE ledger SET outcome = 'approved' WHERE seq = 3")
    db.close()
    code, out, _ = cli(capsys, "ledger", "verify", *world.store_option)
    assert code == 1
    assert out.splitlines()[0].endswith(": BROKEN at row 3")
    assert "row 3: hash does not match" in out
    code, out, _ = cli(capsys, "ledger", "verify", "--json", *world.store_option)
    report = json.loads(out)
    assert (code, report["ok"], report["first_bad_seq"]) == (1, False, 3)


# -- the installed program ------------------------------------------------------------------------


def test_the_installed_command_runs_the_state_commands(world):
    proposal = world.propose()
    env = {**os.environ, STORE_ENV: world.url}

    def capgate(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(REPO / ".venv" / "bin" / "capgate"), *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,  # the command must exit: a hang bound
            check=False,
        )

    shown = capgate("proposals", "show", proposal.id)
    assert shown.returncode == EXIT_OK, shown.stderr
    assert '    recipient: "ada@example.test"' in shown.stdout
    approved = capgate(
        "proposals", "approve", proposal.id, *MANAGER, *CATALOGUE, "--opa", world.opa
    )
    assert approved.returncode == EXIT_OK, approved.stderr
    assert world.proposal(proposal.id).status is ProposalStatus.APPROVED
    missing = capgate("proposals", "show", "prop-nope")
    assert missing.returncode == EXIT_ERROR
    assert missing.stdout == ""
    assert missing.stderr == "capgate: error [unknown_proposal]: unknown proposal 'prop-nope'\n"
    verified = capgate("ledger", "verify")
    assert verified.returncode == EXIT_OK
    assert "the hash chain is whole" in verified.stdout
