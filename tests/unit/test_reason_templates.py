"""Message templates: declared once, documented from the declarations, rendered alike.

Each code's title and templates are declared by its check, in the policies
(:mod:`capgate.gateway.opa.declarations` reads them). The table of
``docs/reason-codes.md`` is written from them (``scripts/reason-codes.py``), and the
gateway renders compose's reasons from the templates explain's answer carries
(``ComposeExplanation.templates``), never from a copy of its own; these tests fail
when the page drifts, and pin how a template is filled.
``tests/integration/test_explain_policy.py`` holds the gateway's rendering to
execute's, made in Rego from the same templates.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model import reasons
from capgate.gateway.model.decisions import ComposeDecision, ComposeExplanation
from capgate.gateway.model.reasons import compose_reasons, render, with_reasons
from capgate.gateway.opa.declarations import declared_checks, markdown_table

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reason-codes.md"
DIGEST = "sha256:" + "ab" * 32


def _script() -> ModuleType:
    path = REPO / "scripts" / "reason-codes.py"
    spec = importlib.util.spec_from_file_location("reason_codes", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: compose's templates as the policies declare them, the ones explain carries.
TEMPLATES = {
    code.code: code.message
    for check in declared_checks(REPO / "policies")
    if check.package == "capgate.visibility"
    for code in check.codes
    if code.message is not None
}


def test_the_documented_table_is_the_one_the_declarations_give():
    script = _script()
    text = DOC.read_text(encoding="utf-8")
    assert script.with_table(text, markdown_table(REPO / "policies")) == text, (
        "docs/reason-codes.md is out of date: run .venv/bin/python scripts/reason-codes.py"
    )


def test_the_table_writer_replaces_only_between_its_markers():
    script = _script()
    page = f"head\n{script.BEGIN}\nold\n{script.END}\ntail\n"
    written = script.with_table(page, "| new |\n")
    assert written == f"head\n{script.BEGIN}\n| new |\n{script.END}\ntail\n"


def test_every_compose_code_declares_one_template():
    compose = [c for c in declared_checks(REPO / "policies") if c.package == "capgate.visibility"]
    assert [c.check for c in compose] == [
        "role", "task", "connection", "environment", "budget", "quarantine",
    ]  # fmt: skip
    assert all(code.message is not None for check in compose for code in check.codes)
    assert len(TEMPLATES) == 8


def test_the_gateway_keeps_no_templates_of_its_own():
    assert not hasattr(reasons, "TEMPLATES")
    source = Path(reasons.__file__).read_text(encoding="utf-8")
    assert not [template for template in TEMPLATES.values() if template in source]


def test_render_fills_tool_and_facts_as_json():
    assert render(TEMPLATES, "role_not_granted", "quote.send", {"role": "support"}) == (
        'tool "quote.send" is not granted to role "support"'
    )
    assert render(
        TEMPLATES, "not_needed_by_task", "a", {"task_type": "t", "needs": ["b", "c"]}
    ) == ('tool "a" is not offered by task type "t" with task.needs ["b","c"]')
    assert render(TEMPLATES, "connection_revoked", "a", {"alias": "crm", "status": None}) == (
        'tool "a" needs connection "crm", whose status is null, not active'
    )


def test_render_shows_a_missing_fact_as_null_and_an_unknown_code_plainly():
    assert render(TEMPLATES, "environment_restricted", "a", {}) == (
        'tool "a" is not available in environment null'
    )
    assert (
        render(TEMPLATES, "brand_new_code", "a", {"x": 1}) == 'tool "a" is hidden: brand_new_code'
    )


def _check(name: str, code: str | None, **facts: object) -> dict[str, object]:
    return {"check": name, "pass": code is None, "code": code, "facts": facts}


def _explanation(**tools: list[dict[str, object]]) -> ComposeExplanation:
    return ComposeExplanation.model_validate(
        {
            "catalogue_digest": DIGEST,
            "templates": TEMPLATES,
            "tools": {
                name: {"visible": all(c["pass"] for c in checks), "checks": checks}
                for name, checks in tools.items()
            },
        }
    )


EXPLANATION = _explanation(
    seen=[_check("role", None, role="sales")],
    hidden=[
        _check("role", "role_not_granted", role="support"),
        _check("budget", "budget_class_exceeded", budget_class="frugal", cost_class="low"),
    ],
)


def test_compose_reasons_gives_one_rendered_reason_per_failing_check():
    reasons = compose_reasons(EXPLANATION)
    assert list(reasons) == ["hidden"]
    assert [(r.code, r.message) for r in reasons["hidden"]] == [
        ("role_not_granted", 'tool "hidden" is not granted to role "support"'),
        (
            "budget_class_exceeded",
            'tool "hidden" has cost class "low", which budget class "frugal" does not admit',
        ),
    ]


def test_with_reasons_fills_excluded_of_an_agreeing_decision():
    decision = ComposeDecision(visible=["seen"], catalogue_digest=DIGEST)
    assert decision.excluded == {}
    explained = with_reasons(decision, EXPLANATION)
    assert explained.visible == ["seen"]
    assert explained.reasons_for("hidden") == ["budget_class_exceeded", "role_not_granted"]


@pytest.mark.parametrize(
    "decision",
    [
        ComposeDecision(visible=["seen", "hidden"], catalogue_digest=DIGEST),
        ComposeDecision(visible=[], catalogue_digest=DIGEST),
        ComposeDecision(visible=["seen"], catalogue_digest="sha256:" + "cd" * 32),
    ],
    ids=["more visible", "fewer visible", "other catalogue"],
)
def test_with_reasons_refuses_an_explanation_that_disagrees(decision: ComposeDecision):
    with pytest.raises(PolicyUnavailable, match="refusing both"):
        with_reasons(decision, EXPLANATION)


@pytest.mark.parametrize(
    "tool",
    [
        {"visible": True, "checks": [_check("role", "role_not_granted")]},
        {"visible": False, "checks": [_check("role", None)]},
        {"visible": True, "checks": []},
        {"visible": False, "checks": [{"check": "role", "pass": False, "code": None, "facts": {}}]},
        {"visible": True, "checks": [{"check": "role", "pass": True, "code": "x", "facts": {}}]},
    ],
    ids=[
        "visible with a failing check",
        "hidden with none",
        "no checks",
        "fails without code",
        "passes with code",
    ],
)
def test_an_explanation_whose_verdict_is_not_its_checks_is_refused(tool: dict[str, object]):
    with pytest.raises(ValueError, match="check"):
        ComposeExplanation.model_validate(
            {"catalogue_digest": DIGEST, "templates": {}, "tools": {"t": tool}}
        )


def test_reasons_are_rendered_from_the_templates_the_explanation_carries():
    # Another policy's wording reaches people as that policy words it.
    explanation = ComposeExplanation.model_validate(
        {
            **EXPLANATION.model_dump(by_alias=True),
            "templates": {"role_not_granted": "role {role} may not use {tool}"},
        }
    )
    assert [(r.code, r.message) for r in compose_reasons(explanation)["hidden"]] == [
        ("role_not_granted", 'role "support" may not use "hidden"'),
        ("budget_class_exceeded", 'tool "hidden" is hidden: budget_class_exceeded'),
    ]


def test_an_explanation_without_templates_is_refused():
    with pytest.raises(ValueError, match="templates"):
        ComposeExplanation.model_validate({"catalogue_digest": DIGEST, "tools": {}})
