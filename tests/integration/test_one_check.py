"""A compose check added in one place is enforced by compose and by execute.

The policies derive every form of a compose check (per tool, for the called tool,
over the whole catalogue) from its one declaration and definition in
``policies/capgate/visibility/checks.rego``. This test writes a throwaway check
there, in a copy of the policies and in no other file, starts a real OPA on the
copy, and asks the questions a gateway asks: compose must hide the tool the check
fails, with the check's declared message, and execute must refuse a call of it with
the check's code, explain naming the check. The same questions against the policies
as shipped allow the tool, so the check alone makes the difference.
"""

from __future__ import annotations

import filecmp
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.model.facts import Budget, ComposeInput, ExecuteInput
from capgate.gateway.opa.policies import default_policies_dir
from capgate.gateway.opa.sidecar import PolicySidecar

pytestmark = pytest.mark.integration

TOOL = "contact.read"
CODE = "tool_set_aside"
MESSAGE = f'tool "{TOOL}" is set aside by a throwaway check'

#: The check's declaration: one more entry of the list capgate.visibility declares.
DECLARATION = """\
#     - check: set_aside
#       title: Set aside
#       description: A throwaway check that admits every tool but one.
#       facts: []
#       codes:
#         tool_set_aside:
#           title: Tool set aside
#           message: tool {tool} is set aside by a throwaway check
"""
#: Its definition: the index entries that admit a tool, here every tool but one.
DEFINITION = f'\t"set_aside": [object.remove(data.capgate.catalogue.tools, ["{TOOL}"])],\n'

#: Where each goes in checks.rego: the declaration after the last declared check,
#: just above the rule it annotates; the definition as the last entry of _admits.
DECLARED_RULE = "declared := rego.metadata.rule().custom.checks\n"
LAST_ENTRY = '\t"quarantine": [data.capgate.catalogue.tools | not _is_quarantine_malformed],\n'

FACTS = {
    "principal": {"agent": "a", "role": "sales", "tenant": "t"},
    "task": {"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c"}]},
    "connections": {"crm": "active"},
    "environment": "production",
    "budget_class": "standard",
}


def add_throwaway_check(policies: Path) -> Path:
    """Write the check into ``policies``' checks.rego, its one place; that file."""
    checks = policies / "capgate" / "visibility" / "checks.rego"
    text = checks.read_text(encoding="utf-8")
    assert text.count(DECLARED_RULE) == 1
    assert text.count(LAST_ENTRY) == 1
    text = text.replace(DECLARED_RULE, DECLARATION + DECLARED_RULE)
    text = text.replace(LAST_ENTRY, LAST_ENTRY + DEFINITION)
    checks.write_text(text, encoding="utf-8")
    return checks


def changed_files(left: Path, right: Path) -> list[str]:
    """The files that differ between two policy trees, or are in one only."""
    changed: list[str] = []

    def walk(compared: filecmp.dircmp[str], prefix: str) -> None:
        changed.extend(prefix + name for name in compared.diff_files)
        changed.extend(prefix + name for name in compared.left_only + compared.right_only)
        for name, sub in compared.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(filecmp.dircmp(left, right), "")
    return sorted(changed)


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("policies") / "policies"
    shutil.copytree(default_policies_dir(), copy)
    add_throwaway_check(copy)
    return copy


@pytest.fixture(scope="module")
def sidecars(policies: Path) -> Iterator[tuple[PolicySidecar, PolicySidecar]]:
    """A real OPA on the policies as shipped, and one on the copy with the check."""
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    with (
        PolicySidecar(catalogue, timeout=10.0) as shipped,
        PolicySidecar(catalogue, policies_dir=policies, timeout=10.0) as with_check,
    ):
        yield shipped, with_check


def call_facts() -> ExecuteInput:
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    budget = Budget(remaining=None, cost=catalogue.tools[TOOL].cost_units)
    return ExecuteInput.model_validate(
        {
            **FACTS,
            "call": {
                "tool": TOOL,
                "version": catalogue.tools[TOOL].version,
                "operation_id": "op-1",
                "subject": {"type": "contact", "id": "c"},
                "params_digest": "sha256:" + "ab" * 32,
            },
            "stage": "call",
            "budget": budget.model_dump(),
        }
    )


def test_the_check_is_written_in_one_file(policies: Path):
    assert changed_files(default_policies_dir(), policies) == ["capgate/visibility/checks.rego"]


def test_without_the_check_compose_and_execute_allow_the_tool(sidecars):
    shipped, _ = sidecars
    facts = ComposeInput.model_validate(FACTS)
    assert TOOL in shipped.client.compose(facts).visible
    decision = shipped.client.execute(call_facts())
    assert decision.allow, decision.reasons


def test_compose_hides_the_tool_with_the_checks_declared_message(sidecars):
    _, with_check = sidecars
    facts = ComposeInput.model_validate(FACTS)
    decision = with_check.client.compose(facts, reasons=True)
    assert TOOL not in decision.visible
    assert [(r.code, r.message) for r in decision.excluded[TOOL]] == [(CODE, MESSAGE)]
    # every other tool is judged as before
    shipped_visible = set(sidecars[0].client.compose(facts).visible)
    assert set(decision.visible) == shipped_visible - {TOOL}


def test_execute_refuses_the_call_with_the_checks_code(sidecars):
    _, with_check = sidecars
    decision = with_check.client.execute(call_facts())
    assert not decision.allow
    assert [(r.code, r.message) for r in decision.reasons] == [(CODE, MESSAGE)]
    assert decision.obligations == []
    explained = with_check.client.explain_execute(call_facts())
    failing = [(c.check, c.code) for c in explained.checks if not c.passed]
    assert failing == [("set_aside", CODE)]
