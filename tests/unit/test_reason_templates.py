"""Compose's message templates: the code and docs/reason-codes.md say the same.

``capgate.gateway.model.reasons.TEMPLATES`` renders the messages of compose's reason codes;
the "Message templates" table of ``docs/reason-codes.md`` documents them. Both ways:
every template is documented word for word, every documented one is in the code,
and every compose code (the ``capgate.visibility`` METADATA) has one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.decisions import ComposeDecision, ComposeExplanation
from capgate.gateway.model.reasons import TEMPLATES, compose_reasons, render, with_reasons

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reason-codes.md"
VISIBILITY = REPO / "policies" / "capgate" / "visibility" / "visibility.rego"
DIGEST = "sha256:" + "ab" * 32


def documented_templates() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Message templates\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\|\s*`([a-z_]+)`\s*\|\s*`([^`]+)`\s*\|$", section, re.M)
    return dict(rows)


def compose_codes() -> set[str]:
    text = VISIBILITY.read_text(encoding="utf-8")
    head = text.split("package capgate.visibility", 1)[0]
    return set(re.findall(r"^#\s+- ([a-z_]+)$", head, re.M))


def test_every_template_is_documented_and_every_documented_one_is_in_the_code():
    assert documented_templates() == dict(TEMPLATES)


def test_every_compose_code_has_a_template():
    assert compose_codes() == set(TEMPLATES)
    assert len(TEMPLATES) == 8


def test_render_fills_tool_and_facts_as_json():
    assert render("role_not_granted", "quote.send", {"role": "support"}) == (
        'tool "quote.send" is not granted to role "support"'
    )
    assert render("not_needed_by_task", "a", {"task_type": "t", "needs": ["b", "c"]}) == (
        'tool "a" is not offered by task type "t" with task.needs ["b","c"]'
    )
    assert render("connection_revoked", "a", {"alias": "crm", "status": None}) == (
        'tool "a" needs connection "crm", whose status is null, not active'
    )


def test_render_shows_a_missing_fact_as_null_and_an_unknown_code_plainly():
    assert render("environment_restricted", "a", {}) == (
        'tool "a" is not available in environment null'
    )
    assert render("brand_new_code", "a", {"x": 1}) == 'tool "a" is hidden: brand_new_code'


def _check(name: str, code: str | None, **facts: object) -> dict[str, object]:
    return {"check": name, "pass": code is None, "code": code, "facts": facts}


def _explanation(**tools: list[dict[str, object]]) -> ComposeExplanation:
    return ComposeExplanation.model_validate(
        {
            "catalogue_digest": DIGEST,
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
        ComposeExplanation.model_validate({"catalogue_digest": DIGEST, "tools": {"t": tool}})
