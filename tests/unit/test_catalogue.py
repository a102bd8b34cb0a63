"""Loading, checking and compiling catalogues (no OPA needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from capgate.demo import demo_catalogue_dir, demo_catalogue_names
from capgate.gateway import catalogue as catalogue_module
from capgate.gateway.catalogue import catalogue_digest, compile_catalogue, load_catalogue
from capgate.gateway.errors import CatalogueError
from capgate.gateway.model import contracts
from capgate.gateway.model.contracts import (
    BudgetClassSpec,
    Catalogue,
    CostClass,
    Mode,
    ProducedEvidence,
    RequiredEvidence,
    RoleSpec,
    TaskLinks,
    TaskTypeSpec,
    ToolContract,
)

# ----------------------------------------------------------------------- helpers


@pytest.fixture
def sales_dir(tmp_path: Path) -> Path:
    """A writable copy of the sales demo catalogue."""
    target = tmp_path / "sales"
    shutil.copytree(demo_catalogue_dir("sales"), target)
    return target


def read(directory: Path, file: str) -> Any:
    return yaml.safe_load((directory / file).read_text(encoding="utf-8"))


def write(directory: Path, file: str, data: Any) -> None:
    (directory / file).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def tool_entry(directory: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parsed tools.yaml and the entry of tool ``name`` in it, for editing."""
    data = read(directory, "tools.yaml")
    entry = next(t for t in data["tools"] if t["name"] == name)
    return data, entry


def problems_of(directory: Path) -> list[str]:
    with pytest.raises(CatalogueError) as caught:
        load_catalogue(directory)
    assert caught.value.code == "catalogue_invalid"
    return caught.value.problems


def only_problem(directory: Path) -> str:
    problems = problems_of(directory)
    assert len(problems) == 1, problems
    return problems[0]


def minimal_tool(**overrides: Any) -> ToolContract:
    fields: dict[str, Any] = {
        "name": "t.read",
        "version": 1,
        "description": "Read a thing.",
        "mode": "read",
        "roles": ["r"],
        "connection_alias": None,
        "subject_type": None,
        "recovery": "retry_safe",
        "idempotency": "idempotent",
        "cost_class": "free",
        "environments": ["production"],
    }
    fields.update(overrides)
    return ToolContract.model_validate(fields)


# ---------------------------------------------------------------- public surface


def test_public_surface_is_pinned() -> None:
    assert sorted(catalogue_module.__all__) == [
        "CATALOGUE_FILES",
        "catalogue_digest",
        "compile_catalogue",
        "load_catalogue",
        "undeclared_names",
    ]
    assert sorted(contracts.__all__) == [
        "ApprovalKind",
        "BudgetClassSpec",
        "Catalogue",
        "CostClass",
        "CurrencyTable",
        "DEFAULT_COST_UNITS",
        "Derivation",
        "Idempotency",
        "LimitSpec",
        "Mode",
        "ProducedEvidence",
        "QuorumRule",
        "RequiredEvidence",
        "RoleSpec",
        "TaskLinks",
        "TaskTypeSpec",
        "ToolContract",
        "UpstreamRef",
        "ValueSpec",
        "ValueType",
    ]


# ------------------------------------------------------------------ demo catalogues


def test_demo_catalogue_names() -> None:
    assert demo_catalogue_names() == ["oracle-grove", "sales"]


def test_unknown_demo_catalogue_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown demo catalogue '\.\./sales'"):
        demo_catalogue_dir("../sales")


def test_oracle_grove_loads() -> None:
    cat = load_catalogue(demo_catalogue_dir("oracle-grove"))
    oracle = cat.tool("oracle")
    assert oracle.mode is Mode.READ
    assert oracle.roles == ["fortune-teller"]
    assert oracle.connection_alias is None
    assert oracle.subject_type is None
    assert oracle.cost_class is CostClass.FREE
    assert oracle.recovery == "retry_safe"
    assert oracle.input_schema["required"] == ["seed"]
    assert set(oracle.output_schema["properties"]) == {"omen", "seed"}
    assert set(cat.roles) == {"fortune-teller", "scene-whisperer"}
    assert cat.task_types["scene"].tools == ["oracle"]
    assert cat.budget_classes["standard"].max_cost_class is CostClass.MEDIUM
    assert cat.tools_for_role("scene-whisperer") == []


def test_sales_loads() -> None:
    cat = load_catalogue(demo_catalogue_dir("sales"))
    assert set(cat.tools) == {
        "contact.read",
        "contact.verify_email",
        "consent.check",
        "quote.propose",
        "quote.prepare_send",
        "payment.execute",
        "invoice.check_approval",
    }
    assert set(cat.roles) == {"sales", "support", "finance", "sales_manager", "controller"}
    # The sales task lists the payment tool: only the role check hides it.
    assert "payment.execute" in cat.task_types["customer_quote"].tools
    assert cat.tool("payment.execute").roles == ["finance"]
    assert [t.name for t in cat.tools_for_role("sales")] == [
        "consent.check",
        "contact.read",
        "contact.verify_email",
        "quote.prepare_send",
        "quote.propose",
    ]
    send = cat.tool("quote.prepare_send")
    assert send.execution_action == "quote.dispatch_reviewed"
    assert send.dispatch_action == "quote.dispatch_reviewed"
    assert send.requires == [
        RequiredEvidence(name="current_quote_revision"),
        RequiredEvidence(name="verified_recipient", about="recipient_digest"),
        RequiredEvidence(name="communication_permission"),
    ]
    assert send.needs_review
    assert send.reviewers == ["sales_manager"]
    assert send.receipt_field == "message_id"
    # Every evidence a tool requires is produced by some tool of the catalogue.
    # verified_recipient is about the address verified, for a day; the others are
    # about the call's subject (the default) and never expire.
    assert cat.tool("contact.verify_email").produces == [
        ProducedEvidence(name="verified_recipient", about="address_digest", ttl_seconds=86400)
    ]
    assert cat.tool("consent.check").produces == [ProducedEvidence(name="communication_permission")]
    assert cat.tool("quote.propose").produced_names == ["current_quote_revision"]
    assert cat.tool("invoice.check_approval").produced_names == ["invoice_approved"]
    assert cat.tool("payment.execute").requires == [
        RequiredEvidence(name="invoice_approved", about="subject")
    ]
    # The payment writes directly, but only after a controller reviewed it.
    payment = cat.tool("payment.execute")
    assert payment.mode is Mode.WRITE
    assert payment.needs_review
    assert payment.reviewers == ["controller"]
    assert payment.dispatch_action == "payment.execute"
    assert not cat.tool("contact.read").needs_review
    assert cat.roles["sales_manager"].approves == ["exact_content_and_recipient"]
    assert cat.roles["sales"].approves == []
    assert [t.name for t in cat.task_tools("invoice_payment")] == [
        "contact.read",
        "invoice.check_approval",
        "payment.execute",
    ]
    assert cat.runnable_names() == set(cat.tools) | {
        "quote.record_reviewed",
        "quote.dispatch_reviewed",
    }
    assert cat.budget_classes["unlimited"].admits(CostClass.HIGH)
    assert not cat.budget_classes["standard"].admits(CostClass.HIGH)


def test_sales_schemas_accept_a_realistic_payment() -> None:
    from jsonschema import Draft202012Validator

    schema = load_catalogue(demo_catalogue_dir("sales")).tool("payment.execute").input_schema
    validator = Draft202012Validator(schema)
    good = {
        "invoice_id": "inv-7",
        "amount_cents": 125000,
        "currency": "EUR",
        "beneficiary": "DE89370400440532013000",
    }
    assert validator.is_valid(good)
    assert not validator.is_valid({**good, "amount_cents": "1250.00"})
    assert not validator.is_valid({**good, "currency": "euro"})


def test_catalogue_lookups_name_the_missing_entry() -> None:
    cat = load_catalogue(demo_catalogue_dir("sales"))
    with pytest.raises(KeyError, match="unknown tool 'nope'"):
        cat.tool("nope")
    with pytest.raises(KeyError, match="unknown task type 'nope'"):
        cat.task_tools("nope")


# ---------------------------------------------------------------------- compiling


def test_compiled_tool_matches_the_policy_interface() -> None:
    document = compile_catalogue(load_catalogue(demo_catalogue_dir("sales")))
    assert document["tools"]["quote.prepare_send"] == {
        "name": "quote.prepare_send",
        "version": 1,
        "mode": "propose_write",
        "roles": {"sales": True},
        "connection_alias": "sales_mailbox",
        "subject_type": "opportunity",
        "requires": ["current_quote_revision", "verified_recipient", "communication_permission"],
        "requires_about": {
            "verified_recipient": {"about": "recipient_digest", "type": "email_digest"}
        },
        "approval": "exact_content_and_recipient",
        "execution_action": "quote.dispatch_reviewed",
        "recovery": "reconcile_provider_receipt",
        "idempotency": "idempotent_with_key",
        "cost_class": "low",
        "cost": 1,
        "environments": {"development": True, "staging": True, "production": True},
        "produces": [],
        "reviewers": {"sales_manager": True},
        "values": {"recipient_digest": {"type": "string"}, "recipient_domain": {"type": "string"}},
        "limits": [],
        "cost_value": None,
        "quorum": [],
    }
    assert document["tools"]["payment.execute"]["limits"] == [
        {"value": "amount_eur_cents", "max": 500000, "roles": {"finance": True}}
    ]
    assert document["tools"]["contact.read"]["execution_action"] is None
    assert document["tools"]["contact.read"]["reviewers"] == {}
    assert document["tools"]["contact.verify_email"]["produces"] == ["verified_recipient"]
    assert document["tools"]["payment.execute"]["requires_about"] == {
        "invoice_approved": {"about": "subject", "type": "invoice"}
    }
    # cost: the contract's own, else its cost class's default units.
    assert {name: tool["cost"] for name, tool in document["tools"].items()} == {
        "contact.read": 0,
        "contact.verify_email": 0,
        "consent.check": 0,
        "quote.propose": 1,
        "quote.prepare_send": 1,
        "payment.execute": 20,
        "invoice.check_approval": 0,
    }


def test_compiled_document_is_keyed_by_name() -> None:
    document = compile_catalogue(load_catalogue(demo_catalogue_dir("sales")))
    keys = {"tools", "task_types", "budget_classes", "roles", "index", "meta", "currencies"}
    assert set(document) == keys
    assert document["currencies"]["base"] == "EUR"  # the demo's currencies.yaml
    assert set(document["tools"]) == {
        "contact.read",
        "contact.verify_email",
        "consent.check",
        "quote.propose",
        "quote.prepare_send",
        "payment.execute",
        "invoice.check_approval",
    }
    assert document["roles"] == {
        "controller": {"approves": {"exact_content_and_recipient": True}},
        "finance": {"approves": {}},
        "sales": {"approves": {}},
        "sales_manager": {"approves": {"exact_content_and_recipient": True}},
        "support": {"approves": {}},
    }
    assert document["task_types"]["invoice_payment"] == {
        "tools": {"contact.read": True, "invoice.check_approval": True, "payment.execute": True}
    }
    assert document["budget_classes"] == {
        "standard": {"admits": {"free": True, "low": True, "medium": True}},
        "unlimited": {"admits": {"free": True, "low": True, "medium": True, "high": True}},
    }
    assert document["meta"]["tool_count"] == 7
    assert document["meta"]["digest"].startswith("sha256:")
    assert len(document["meta"]["digest"]) == len("sha256:") + 64


def test_index_holds_the_tools_that_pass_each_check_by_value() -> None:
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    index = compile_catalogue(catalogue)["index"]
    assert set(index) == {
        "by_role",
        "by_task_type",
        "by_connection",
        "no_connection",
        "by_environment",
        "by_cost_class",
    }
    # Every entry is {name: true}, and holds exactly the tools whose contract says so.
    for name, tool in catalogue.tools.items():
        for role in catalogue.roles:
            assert (name in index["by_role"].get(role, {})) == (role in tool.roles)
        for task, spec in catalogue.task_types.items():
            assert (name in index["by_task_type"][task]) == (name in spec.tools)
        assert (name in index["no_connection"]) == (tool.connection_alias is None)
        for alias, names in index["by_connection"].items():
            assert (name in names) == (tool.connection_alias == alias)
        for environment, names in index["by_environment"].items():
            assert (name in names) == (environment in tool.environments)
        assert name in index["by_cost_class"][tool.cost_class.value]
    entries = [
        *index["by_role"].values(),
        *index["by_task_type"].values(),
        *index["by_connection"].values(),
        index["no_connection"],
        *index["by_environment"].values(),
        *index["by_cost_class"].values(),
    ]
    assert all(set(entry.values()) <= {True} for entry in entries)
    assert index["by_role"]["finance"] == {"payment.execute": True, "invoice.check_approval": True}


def test_index_leaves_out_undeclared_roles_and_unknown_task_tools() -> None:
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    index = compile_catalogue(catalogue)["index"]
    assert set(index["by_role"]) <= set(catalogue.roles)
    for names in index["by_task_type"].values():
        assert set(names) <= set(catalogue.tools)


def test_compiled_document_holds_no_prose_or_schemas() -> None:
    document = compile_catalogue(load_catalogue(demo_catalogue_dir("sales")))
    text = json.dumps(document)
    for absent in ("description", "input_schema", "output_schema", "Pay an approved"):
        assert absent not in text


def test_compiled_document_is_plain_json() -> None:
    document = compile_catalogue(load_catalogue(demo_catalogue_dir("oracle-grove")))
    assert json.loads(json.dumps(document)) == document
    assert type(document["tools"]["oracle"]["mode"]) is str  # not a StrEnum member


def test_digest_covers_the_document_without_meta() -> None:
    document = compile_catalogue(load_catalogue(demo_catalogue_dir("sales")))
    assert catalogue_digest(document) == document["meta"]["digest"]
    reordered = {key: document[key] for key in reversed(list(document))}
    assert catalogue_digest(reordered) == document["meta"]["digest"]


def test_digest_is_stable_across_loads() -> None:
    first = compile_catalogue(load_catalogue(demo_catalogue_dir("sales")))
    second = compile_catalogue(load_catalogue(demo_catalogue_dir("sales")))
    assert first == second


def test_digest_changes_when_a_tool_changes(sales_dir: Path) -> None:
    before = compile_catalogue(load_catalogue(sales_dir))["meta"]["digest"]
    data, entry = tool_entry(sales_dir, "payment.execute")
    entry["roles"] = ["finance", "sales"]
    write(sales_dir, "tools.yaml", data)
    after = compile_catalogue(load_catalogue(sales_dir))["meta"]["digest"]
    assert after != before


def test_digest_ignores_descriptions(sales_dir: Path) -> None:
    before = compile_catalogue(load_catalogue(sales_dir))["meta"]["digest"]
    data, entry = tool_entry(sales_dir, "payment.execute")
    entry["description"] = "Reworded for the prompt."
    write(sales_dir, "tools.yaml", data)
    assert compile_catalogue(load_catalogue(sales_dir))["meta"]["digest"] == before


# ------------------------------------------------------------------- file problems


def test_missing_directory(tmp_path: Path) -> None:
    assert "catalogue directory not found" in only_problem(tmp_path / "absent")


def test_missing_file(sales_dir: Path) -> None:
    (sales_dir / "roles.yaml").unlink()
    problem = only_problem(sales_dir)
    assert problem.startswith("roles.yaml: file not found")
    # roles.yaml is unreadable, so the tools' roles are not all reported unknown.


def test_yaml_syntax_error_names_the_line(sales_dir: Path) -> None:
    (sales_dir / "task_types.yaml").write_text(
        "task_types:\n  scene:\n    description: x\n    tools: [oracle\n", encoding="utf-8"
    )
    problem = only_problem(sales_dir)
    assert problem.startswith("task_types.yaml: invalid YAML at line ")


def test_duplicate_yaml_key_is_an_error(sales_dir: Path) -> None:
    (sales_dir / "roles.yaml").write_text(
        "roles:\n"
        "  sales:\n    description: one\n"
        "  support:\n    description: two\n"
        "  finance:\n    description: three\n"
        "  sales:\n    description: again\n",
        encoding="utf-8",
    )
    problem = only_problem(sales_dir)
    assert problem.startswith("roles.yaml: invalid YAML at line 8")
    assert "duplicate key 'sales' (first given on line 2)" in problem


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    directory = tmp_path / "merged"
    shutil.copytree(demo_catalogue_dir("oracle-grove"), directory)
    (directory / "budget_classes.yaml").write_text(
        "budget_classes:\n"
        "  standard: &d\n    description: shared\n    max_cost_class: low\n"
        "  big:\n    <<: *d\n    max_cost_class: high\n",
        encoding="utf-8",
    )
    cat = load_catalogue(directory)
    assert cat.budget_classes["big"].max_cost_class is CostClass.HIGH


def test_empty_file(sales_dir: Path) -> None:
    (sales_dir / "budget_classes.yaml").write_text("# nothing yet\n", encoding="utf-8")
    assert only_problem(sales_dir) == (
        "budget_classes.yaml: the file is empty; "
        "expected a mapping with the single key 'budget_classes'"
    )


def test_top_level_must_be_a_mapping(sales_dir: Path) -> None:
    write(sales_dir, "tools.yaml", [{"name": "contact.read"}])
    problems = problems_of(sales_dir)
    assert (
        "tools.yaml: top level: expected a mapping with the single key 'tools', got a list"
        in problems
    )
    # tools.yaml is unusable, so the task types' tool references are not checked.
    assert not any(p.startswith("task_types.yaml") for p in problems)


def test_top_level_key_missing_and_unknown(sales_dir: Path) -> None:
    write(sales_dir, "roles.yaml", {"role": read(sales_dir, "roles.yaml")["roles"]})
    assert problems_of(sales_dir) == [
        "roles.yaml: top level: unknown key 'role'; only 'roles' is allowed",
        "roles.yaml: top level: missing key 'roles'",
    ]


def test_section_of_the_wrong_shape(sales_dir: Path) -> None:
    write(sales_dir, "tools.yaml", {"tools": {"contact.read": {}}})
    write(sales_dir, "budget_classes.yaml", {"budget_classes": ["standard"]})
    problems = problems_of(sales_dir)
    assert "tools.yaml: 'tools': expected a list of tool contracts, got a mapping" in problems
    assert (
        "budget_classes.yaml: 'budget_classes': expected a mapping of budget class name "
        "to its fields, got a list" in problems
    )


# ------------------------------------------------------------------ entry problems


def test_wrong_enum_value_names_file_tool_and_field(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "quote.propose")
    entry["mode"] = "propose"
    write(sales_dir, "tools.yaml", data)
    assert only_problem(sales_dir) == (
        "tools.yaml: tool 'quote.propose': field 'mode': "
        "Input should be 'read', 'propose_write' or 'write'"
    )


def test_unknown_field(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "payment.execute")
    entry["aproval"] = entry.pop("approval")
    write(sales_dir, "tools.yaml", data)
    problem = only_problem(sales_dir)
    assert problem.startswith(
        "tools.yaml: tool 'payment.execute': field 'aproval': unknown field; "
        "the allowed fields are name, version,"
    )


def test_wrong_types(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "contact.read")
    entry["version"] = "1"
    entry["roles"] = "sales"
    entry["environments"] = []
    write(sales_dir, "tools.yaml", data)
    problems = problems_of(sales_dir)
    assert problems == [
        "tools.yaml: tool 'contact.read': field 'version': Input should be a valid integer",
        "tools.yaml: tool 'contact.read': field 'roles': Input should be a valid list",
        "tools.yaml: tool 'contact.read': field 'environments': "
        "List should have at least 1 item after validation, not 0",
    ]


def test_nested_field_path(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "contact.read")
    entry["requires"] = ["consent", "not a name"]
    write(sales_dir, "tools.yaml", data)
    assert only_problem(sales_dir).startswith(
        "tools.yaml: tool 'contact.read': field 'requires[1].name': String should match pattern"
    )


def test_missing_name_uses_the_list_index(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "quote.propose")
    del entry["name"]
    write(sales_dir, "tools.yaml", data)
    problems = problems_of(sales_dir)
    assert "tools.yaml: tools[3]: field 'name': Field required" in problems
    # The nameless entry cannot satisfy the task type that lists quote.propose.
    assert (
        "task_types.yaml: task type 'customer_quote': field 'tools[3]': "
        "unknown tool 'quote.propose' (not defined in tools.yaml)" in problems
    )


def test_entry_that_is_not_a_mapping(sales_dir: Path) -> None:
    data = read(sales_dir, "tools.yaml")
    data["tools"].append("oracle")
    write(sales_dir, "tools.yaml", data)
    assert (
        only_problem(sales_dir)
        == "tools.yaml: tools[7]: expected a mapping of fields, got a string"
    )


def test_duplicate_tool_name_names_both_indexes(sales_dir: Path) -> None:
    data = read(sales_dir, "tools.yaml")
    data["tools"].append(dict(data["tools"][0]))
    write(sales_dir, "tools.yaml", data)
    assert only_problem(sales_dir) == (
        "tools.yaml: tool 'contact.read': the name is defined more than once, "
        "at tools[0] and tools[7]"
    )


def test_duplicate_tool_entries_are_told_apart(sales_dir: Path) -> None:
    data = read(sales_dir, "tools.yaml")
    copy = dict(data["tools"][0])
    copy["mode"] = "delete"
    data["tools"].append(copy)
    write(sales_dir, "tools.yaml", data)
    assert "tools.yaml: tool 'contact.read' (tools[7]): field 'mode': " in "\n".join(
        problems_of(sales_dir)
    )


def test_unknown_role(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "payment.execute")
    entry["roles"] = ["finance", "finanse"]
    write(sales_dir, "tools.yaml", data)
    assert only_problem(sales_dir) == (
        "tools.yaml: tool 'payment.execute': field 'roles[1]': unknown role 'finanse' "
        "(roles.yaml defines: controller, finance, sales, sales_manager, support)"
    )


def test_unknown_role_is_reported_with_other_field_problems(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "payment.execute")
    entry["roles"] = ["treasurer"]
    entry["cost_class"] = "huge"
    write(sales_dir, "tools.yaml", data)
    problems = problems_of(sales_dir)
    assert len(problems) == 2
    assert any("field 'cost_class'" in p for p in problems)
    assert any("field 'roles[0]': unknown role 'treasurer'" in p for p in problems)


def test_task_type_with_unknown_tool(sales_dir: Path) -> None:
    data = read(sales_dir, "task_types.yaml")
    data["task_types"]["customer_quote"]["tools"][1] = "quote.sendd"
    write(sales_dir, "task_types.yaml", data)
    assert only_problem(sales_dir) == (
        "task_types.yaml: task type 'customer_quote': field 'tools[1]': "
        "unknown tool 'quote.sendd' (not defined in tools.yaml)"
    )


def test_budget_class_with_unknown_cost_class(sales_dir: Path) -> None:
    data = read(sales_dir, "budget_classes.yaml")
    data["budget_classes"]["standard"]["max_cost_class"] = "cheap"
    write(sales_dir, "budget_classes.yaml", data)
    assert only_problem(sales_dir) == (
        "budget_classes.yaml: budget class 'standard': field 'max_cost_class': "
        "Input should be 'free', 'low', 'medium' or 'high'"
    )


def test_malformed_and_non_string_entry_names(sales_dir: Path) -> None:
    (sales_dir / "budget_classes.yaml").write_text(
        "budget_classes:\n"
        "  standard: {description: ok, max_cost_class: medium}\n"
        "  big spender: {description: x, max_cost_class: high}\n"
        "  1: {description: x, max_cost_class: high}\n",
        encoding="utf-8",
    )
    problems = problems_of(sales_dir)
    assert problems[0].startswith(
        "budget_classes.yaml: budget class 'big spender': the name is malformed"
    )
    assert problems[1] == (
        "budget_classes.yaml: budget class 1: the name must be a string, got an integer"
    )


def test_role_without_fields(sales_dir: Path) -> None:
    (sales_dir / "roles.yaml").write_text(
        "roles:\n  sales:\n  support: {description: s}\n  finance: {description: f}\n",
        encoding="utf-8",
    )
    assert only_problem(sales_dir) == (
        "roles.yaml: role 'sales': expected a mapping of fields, got nothing (null)"
    )


def test_proposal_must_name_its_execution_action(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "quote.propose")
    del entry["execution_action"]
    write(sales_dir, "tools.yaml", data)
    assert only_problem(sales_dir).startswith(
        "tools.yaml: tool 'quote.propose': field 'execution_action': "
        "a propose_write tool must name the reviewed action"
    )


# ------------------------------------------------- review and evidence cross-checks


def _edit_tools_and_roles(directory: Path, edit: Any) -> None:
    tools = read(directory, "tools.yaml")
    roles = read(directory, "roles.yaml")
    edit({t["name"]: t for t in tools["tools"]}, roles["roles"])
    write(directory, "tools.yaml", tools)
    write(directory, "roles.yaml", roles)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        pytest.param(
            lambda tools, roles: tools["payment.execute"].pop("reviewers"),
            "tools.yaml: tool 'payment.execute': a tool whose calls are reviewed must name "
            "the roles that may review them (reviewers)",
            id="reviewed_tool_without_reviewers",
        ),
        pytest.param(
            lambda tools, roles: tools["contact.read"].update(reviewers=["controller"]),
            "tools.yaml: tool 'contact.read': reviewers: this tool's calls are never reviewed",
            id="reviewers_on_an_unreviewed_tool",
        ),
        pytest.param(
            lambda tools, roles: tools["payment.execute"].update(reviewers=["cfo"]),
            "tools.yaml: tool 'payment.execute': field 'reviewers[0]': unknown role 'cfo'",
            id="unknown_reviewer_role",
        ),
        pytest.param(
            # finance may call the payment tool, but approves nothing: a caller's own
            # role must not make it a reviewer.
            lambda tools, roles: tools["payment.execute"].update(reviewers=["finance"]),
            "tools.yaml: tool 'payment.execute': field 'reviewers[0]': role 'finance' does "
            "not approve 'exact_content_and_recipient' (add it to the role's approves)",
            id="reviewer_role_that_approves_nothing",
        ),
        pytest.param(
            lambda tools, roles: tools["payment.execute"].update(requires=["invoice_aproved"]),
            "tools.yaml: tool 'payment.execute': field 'requires[0]': no tool produces "
            "evidence 'invoice_aproved' (list it in some tool's produces)",
            id="required_evidence_nothing_produces",
        ),
        pytest.param(
            lambda tools, roles: tools["invoice.check_approval"].update(produces=[]),
            "tools.yaml: tool 'payment.execute': field 'requires[0]': no tool produces "
            "evidence 'invoice_approved' (list it in some tool's produces)",
            id="the_only_producer_stops_producing",
        ),
        pytest.param(
            lambda tools, roles: tools["quote.propose"].update(approval="none"),
            "tools.yaml: tool 'quote.propose': a propose_write tool must name the approval "
            "its proposals need (approval: exact_content_and_recipient)",
            id="proposal_without_approval",
        ),
        pytest.param(
            lambda tools, roles: tools["contact.read"].update(receipt_field="receipt"),
            "tools.yaml: tool 'contact.read': a read tool has no provider receipt (receipt_field)",
            id="receipt_field_on_a_read_tool",
        ),
        pytest.param(
            lambda tools, roles: roles["controller"].update(approves=["none"]),
            "roles.yaml: role 'controller': field 'approves': 'none' is not an approval "
            "a reviewer can give",
            id="role_approving_none",
        ),
        pytest.param(
            lambda tools, roles: tools["contact.read"].update(cost=-1),
            "tools.yaml: tool 'contact.read': field 'cost': "
            "Input should be greater than or equal to 0",
            id="negative_cost",
        ),
        pytest.param(
            lambda tools, roles: tools["contact.read"].update(cost=True),
            "tools.yaml: tool 'contact.read': field 'cost': Input should be a valid integer",
            id="boolean_cost",
        ),
        pytest.param(
            lambda tools, roles: tools["contact.read"].update(cost=2.0),
            "tools.yaml: tool 'contact.read': field 'cost': Input should be a valid integer",
            id="float_cost",
        ),
    ],
)
def test_review_and_evidence_problems_are_named(sales_dir: Path, edit: Any, problem: str) -> None:
    _edit_tools_and_roles(sales_dir, edit)
    assert only_problem(sales_dir) == problem


def test_an_execution_action_that_is_an_agent_facing_tool_is_one_problem(
    sales_dir: Path,
) -> None:
    # Dispatching a reviewed quote must never run a tool agents may call directly.
    # The cross-check's message must also stay one problem, naming its tool.
    _edit_tools_and_roles(
        sales_dir,
        lambda tools, roles: tools["quote.propose"].update(execution_action="contact.read"),
    )
    assert only_problem(sales_dir) == (
        "tools.yaml: tool 'quote.propose': field 'execution_action': 'contact.read' is an "
        "agent-facing tool; an execution action is run only for a reviewed proposal"
    )


def test_a_reviewer_must_hold_the_tools_approval_kind_in_every_listed_role(
    sales_dir: Path,
) -> None:
    def edit(tools: dict[str, Any], roles: dict[str, Any]) -> None:
        tools["payment.execute"]["reviewers"] = ["controller", "support", "auditor"]

    _edit_tools_and_roles(sales_dir, edit)
    assert problems_of(sales_dir) == [
        "tools.yaml: tool 'payment.execute': field 'reviewers[1]': role 'support' does not "
        "approve 'exact_content_and_recipient' (add it to the role's approves)",
        "tools.yaml: tool 'payment.execute': field 'reviewers[2]': unknown role 'auditor'",
    ]


def test_cost_units_default_to_the_cost_class_and_may_be_set(sales_dir: Path) -> None:
    assert contracts.DEFAULT_COST_UNITS == {
        CostClass.FREE: 0,
        CostClass.LOW: 1,
        CostClass.MEDIUM: 5,
        CostClass.HIGH: 20,
    }
    _edit_tools_and_roles(sales_dir, lambda tools, roles: tools["quote.propose"].update(cost=7))
    cat = load_catalogue(sales_dir)
    assert cat.tool("quote.propose").cost_units == 7
    assert cat.tool("payment.execute").cost_units == 20  # high, no cost of its own
    assert compile_catalogue(cat)["tools"]["quote.propose"]["cost"] == 7


def test_review_needed_by_mode_or_by_approval() -> None:
    assert not minimal_tool().needs_review
    assert not minimal_tool(mode="write").needs_review
    approved_write = minimal_tool(
        mode="write", approval="exact_content_and_recipient", reviewers=["r"]
    )
    assert approved_write.needs_review
    assert approved_write.dispatch_action == "t.read"  # a write runs itself once reviewed
    proposal = minimal_tool(
        mode="propose_write",
        approval="exact_content_and_recipient",
        execution_action="t.apply",
        reviewers=["r"],
    )
    assert proposal.needs_review
    assert proposal.dispatch_action == "t.apply"


def test_invalid_json_schema(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "contact.read")
    entry["input_schema"]["properties"]["contact_id"]["type"] = "strin"
    write(sales_dir, "tools.yaml", data)
    problem = only_problem(sales_dir)
    assert problem.startswith(
        "tools.yaml: tool 'contact.read': field 'input_schema': "
        "schema path properties/contact_id/type: not a valid JSON Schema:"
    )


def test_schema_must_be_plain_json(sales_dir: Path) -> None:
    data, entry = tool_entry(sales_dir, "contact.read")
    entry["output_schema"]["examples"] = ["2024-01-01"]
    write(sales_dir, "tools.yaml", data)
    text = (sales_dir / "tools.yaml").read_text(encoding="utf-8")
    (sales_dir / "tools.yaml").write_text(text.replace("'2024-01-01'", "2024-01-01"), "utf-8")
    assert only_problem(sales_dir) == (
        "tools.yaml: tool 'contact.read': field 'output_schema': schema: not plain JSON: "
        "field 'examples/0' holds a date, which JSON has no type for"
    )


def test_every_problem_is_reported_at_once(sales_dir: Path) -> None:
    data, propose = tool_entry(sales_dir, "quote.propose")
    propose["mode"] = "propose"
    data["tools"][0]["roles"] = ["sales", "marketing"]
    write(sales_dir, "tools.yaml", data)
    write(sales_dir, "roles.yaml", {"roles": {**read(sales_dir, "roles.yaml")["roles"], "x": 3}})
    task_types = read(sales_dir, "task_types.yaml")
    task_types["task_types"]["invoice_payment"]["tools"].append("refund.execute")
    write(sales_dir, "task_types.yaml", task_types)
    (sales_dir / "budget_classes.yaml").write_text("budget_classes: [\n", encoding="utf-8")

    problems = problems_of(sales_dir)
    expected_starts = [
        "tools.yaml: tool 'contact.read': field 'roles[1]': unknown role 'marketing'",
        "tools.yaml: tool 'quote.propose': field 'mode': ",
        "roles.yaml: role 'x': expected a mapping of fields, got an integer",
        "task_types.yaml: task type 'invoice_payment': field 'tools[3]': unknown tool",
        "budget_classes.yaml: invalid YAML at line ",
    ]
    assert len(problems) == len(expected_starts), problems
    for start in expected_starts:
        assert any(p.startswith(start) for p in problems), (start, problems)
    assert "5 problem(s)" in str(CatalogueError(problems))


# -------------------------------------------------------------- models on their own


def test_cost_classes_are_ordered_by_rank_not_spelling() -> None:
    assert sorted(CostClass) == [CostClass.FREE, CostClass.LOW, CostClass.MEDIUM, CostClass.HIGH]
    assert CostClass.LOW < CostClass.HIGH  # alphabetically "high" < "low"
    assert CostClass.MEDIUM >= "low"
    assert CostClass.MEDIUM.up_to() == [CostClass.FREE, CostClass.LOW, CostClass.MEDIUM]
    with pytest.raises(ValueError, match="'cheap' is not a valid CostClass"):
        _ = CostClass.LOW < "cheap"


def test_contract_defaults() -> None:
    tool = minimal_tool()
    assert tool.requires == []
    assert tool.approval == "none"
    assert tool.execution_action is None
    assert tool.subject_param is None
    assert tool.input_schema == {"type": "object"}
    assert tool.output_schema == {"type": "object"}


def test_contract_is_frozen() -> None:
    tool = minimal_tool()
    with pytest.raises(ValidationError, match="frozen"):
        tool.mode = Mode.WRITE  # type: ignore[misc]


def test_write_tool_needs_no_execution_action() -> None:
    assert minimal_tool(mode="write").execution_action is None


def test_blank_description_is_refused() -> None:
    with pytest.raises(ValidationError, match="description"):
        minimal_tool(description="   ")


def test_version_is_strict_and_positive() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        minimal_tool(version=0)
    with pytest.raises(ValidationError, match="valid integer"):
        minimal_tool(version=1.0)


def test_catalogue_built_in_code_is_cross_checked() -> None:
    tool = minimal_tool()
    roles = {"r": RoleSpec(description="a role")}
    budgets = {"b": BudgetClassSpec(description="b", max_cost_class=CostClass.LOW)}
    ok = Catalogue(
        tools={"t.read": tool},
        roles=roles,
        task_types={"t": TaskTypeSpec(description="t", tools=["t.read"])},
        budget_classes=budgets,
    )
    assert ok.tool("t.read") is tool
    with pytest.raises(ValidationError) as caught:
        Catalogue(
            tools={"other": tool},
            roles={},
            task_types={"t": TaskTypeSpec(description="t", tools=["gone"])},
            budget_classes=budgets,
        )
    message = str(caught.value)
    assert "tools['other'] holds the contract of 't.read'" in message
    assert "tool 't.read' grants unknown role 'r'" in message
    assert "task type 't' lists unknown tool 'gone'" in message


def test_catalogue_built_in_code_checks_reviewers_and_evidence() -> None:
    budgets = {"b": BudgetClassSpec(description="b", max_cost_class=CostClass.LOW)}
    writer = minimal_tool(
        name="t.write",
        mode="write",
        approval="exact_content_and_recipient",
        reviewers=["r"],
        requires=["checked"],
    )
    with pytest.raises(ValidationError) as caught:
        Catalogue(
            tools={"t.write": writer},
            roles={"r": RoleSpec(description="a role that approves nothing")},
            task_types={"t": TaskTypeSpec(description="t", tools=["t.write"])},
            budget_classes=budgets,
        )
    message = str(caught.value)
    assert "role 'r' does not approve 'exact_content_and_recipient'" in message
    assert "no tool produces evidence 'checked'" in message
    ok = Catalogue(
        tools={"t.write": writer, "t.read": minimal_tool(produces=["checked"])},
        roles={"r": RoleSpec(description="a reviewer", approves=["exact_content_and_recipient"])},
        task_types={"t": TaskTypeSpec(description="t", tools=["t.write", "t.read"])},
        budget_classes=budgets,
    )
    assert ok.runnable_names() == {"t.write", "t.read"}


def test_a_task_type_takes_its_links_from_the_request_or_the_store(sales_dir: Path):
    assert load_catalogue(sales_dir).task_types["invoice_payment"].links is TaskLinks.REQUEST
    task_types = read(sales_dir, "task_types.yaml")
    task_types["task_types"]["invoice_payment"]["links"] = "recorded"
    write(sales_dir, "task_types.yaml", task_types)
    assert load_catalogue(sales_dir).task_types["invoice_payment"].links is TaskLinks.RECORDED
    task_types["task_types"]["invoice_payment"]["links"] = "whatever the agent says"
    write(sales_dir, "task_types.yaml", task_types)
    problem = only_problem(sales_dir)
    assert problem.startswith("task_types.yaml: task type 'invoice_payment': field 'links': ")
    assert "'request'" in problem
    assert "'recorded'" in problem
