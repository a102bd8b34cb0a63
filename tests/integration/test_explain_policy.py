"""capgate.explain against a real OPA: explain's verdicts are the decisions'.

On generated catalogues and facts (a fixed seed, so a failure reproduces), for every
compose input: the tools explain calls visible are exactly compose's visible set,
``explain.compose_codes`` gives every other tool with exactly its failing checks'
codes, and the reasons ``compose(reasons=True)`` gives a tool are the compose-check
reasons execute gives a call of it, messages included (Python's templates and Rego's
wording agree). For every execute input: explain's ``allow`` is execute's, and
every reason code execute gives is the code of a failing check.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ComposeInput, ExecuteInput
from capgate.gateway.opa.sidecar import PolicySidecar
from tests.hang import ANSWER_TIMEOUT

pytestmark = pytest.mark.integration

SEED = 20261130
ROLES = ("sales", "support", "finance")
ALIASES = ("crm", "mailbox", "bank")
ENVIRONMENTS = ("development", "staging", "production")
COSTS = ("free", "low", "medium", "high")
STATUSES = ("active", "active", "disabled", "revoked")
COMPOSE_CODES = {
    "role_not_granted",
    "not_needed_by_task",
    "connection_missing",
    "tool_not_enabled_for_tenant",
    "connection_revoked",
    "environment_restricted",
    "budget_class_exceeded",
    "tool_quarantined",
}
DIGEST = "sha256:" + "7" * 64


def generated_catalogue(rng: random.Random, size: int) -> Catalogue:
    tools: dict[str, Any] = {}
    for i in range(size):
        name = f"tool.{i:03d}"
        reviewed = rng.random() < 0.3
        tools[name] = {
            "name": name,
            "version": 1 + i % 3,
            "description": f"Generated tool {i}.",
            "mode": "write" if reviewed else rng.choice(["read", "write"]),
            "roles": rng.sample(ROLES, rng.randint(1, 3)),
            "connection_alias": rng.choice([*ALIASES, None]),
            "subject_type": rng.choice([None, "opportunity"]),
            "requires": rng.sample(["checked", "verified"], rng.randint(0, 1)),
            "approval": "exact_content_and_recipient" if reviewed else "none",
            "recovery": "retry_safe",
            "idempotency": rng.choice(["idempotent", "idempotent_with_key", "not_idempotent"]),
            "cost_class": rng.choice(COSTS),
            "cost": rng.randint(0, 3),
            "environments": rng.sample(ENVIRONMENTS, rng.randint(1, 3)),
            **({"reviewers": ["manager"]} if reviewed else {}),
        }
    tools["tool.000"] |= {"requires": [], "produces": ["checked", "verified"]}
    names = sorted(tools)
    return Catalogue.model_validate(
        {
            "tools": tools,
            "roles": {
                **{r: {"description": r} for r in ROLES},
                "manager": {"description": "reviews", "approves": ["exact_content_and_recipient"]},
            },
            "task_types": {
                "work": {"description": "most tools", "tools": rng.sample(names, size * 2 // 3)},
                "other": {"description": "a few", "tools": rng.sample(names, size // 4)},
            },
            "budget_classes": {
                "frugal": {"description": "free only", "max_cost_class": "free"},
                "standard": {"description": "up to medium", "max_cost_class": "medium"},
            },
        }
    )


def generated_facts(rng: random.Random, names: list[str]) -> dict[str, Any]:
    return {
        "principal": {
            "agent": "bot",
            "role": rng.choice([*ROLES, "auditor"]),
            "tenant": "acme",
        },
        "task": {
            "type": rng.choice(["work", "other", "unknown"]),
            "needs": rng.choice([None, rng.sample(names, 5)]),
            "linked_resources": [{"type": "opportunity", "id": "o-1"}],
        },
        "connections": {a: rng.choice(STATUSES) for a in rng.sample(ALIASES, rng.randint(0, 3))},
        "environment": rng.choice([*ENVIRONMENTS, "moon"]),
        "budget_class": rng.choice(["frugal", "standard", "gold"]),
        "quarantined": rng.sample(names, rng.randint(0, 2)),
    }


def generated_call(
    rng: random.Random, catalogue: Catalogue, facts: dict[str, Any], tool: str
) -> ExecuteInput:
    contract = catalogue.tools[tool]
    stage = rng.choice(["call", "propose", "dispatch"])
    operation_id = "op-1"
    call: dict[str, Any] = {
        "tool": tool,
        "version": contract.version if rng.random() < 0.9 else contract.version + 1,
        "operation_id": operation_id,
        "subject": rng.choice([None, {"type": "opportunity", "id": rng.choice(["o-1", "o-2"])}]),
        "params_digest": DIGEST,
    }
    approval = {
        "kind": "exact_content_and_recipient",
        "tool": tool,
        "operation_id": operation_id,
        "tenant": rng.choice(["acme", "acme", "other"]),
        "digest": DIGEST,
        "expires_at": (datetime.now(UTC) + timedelta(hours=rng.choice([1, 1, -1]))).isoformat(),
        "approved_by": "maria",
        "used": rng.random() < 0.2,
    }
    return ExecuteInput.model_validate(
        {
            **facts,
            "stage": stage,
            "call": call,
            "approval": approval if rng.random() < 0.7 else None,
            "proposal": rng.choice(
                [None, {"id": "p-1", "status": "approved"}, {"id": "p-1", "status": "pending"}]
            ),
            "budget": rng.choice(
                [
                    None,
                    {"remaining": None, "cost": contract.cost_units},
                    {"remaining": 0, "cost": 1},
                ]
            ),
            "evidence": rng.sample(["checked", "verified"], rng.randint(0, 2)),
        }
    )


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[random.Random, Catalogue, PolicySidecar]]:
    rng = random.Random(SEED)
    catalogue = generated_catalogue(rng, 60)
    with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
        yield rng, catalogue, sidecar


def test_explain_compose_verdicts_are_composes(world: tuple[random.Random, Catalogue, Any]):
    rng, catalogue, sidecar = world
    names = sorted(catalogue.tools)
    seen_codes: set[str] = set()
    visible_somewhere = 0
    for _ in range(40):
        facts = ComposeInput.model_validate(generated_facts(rng, names))
        decision = sidecar.client.compose(facts)
        explanation = sidecar.client.explain_compose(facts)
        assert sorted(explanation.tools) == names
        assert sorted(decision.visible) == explanation.visible
        # The codes-only entrypoint: compose's hidden tools, explain's failing codes.
        codes, _ = sidecar.client.query(
            "capgate/explain/compose_codes", facts.model_dump(mode="json")
        )
        assert codes["catalogue_digest"] == explanation.catalogue_digest
        assert codes["hidden"] == {
            name: sorted(c.code for c in tool.checks if c.code is not None)
            for name, tool in explanation.tools.items()
            if not tool.visible
        }
        for tool in explanation.tools.values():
            assert [c.check for c in tool.checks] == [
                "role",
                "task",
                "connection",
                "environment",
                "budget",
                "quarantine",
            ]
            seen_codes |= {c.code for c in tool.checks if c.code is not None}
        visible_somewhere += bool(decision.visible)
    # The generator reaches both verdicts and every compose code.
    assert visible_somewhere > 0
    assert seen_codes == COMPOSE_CODES


def test_compose_reasons_are_executes_compose_reasons(world: tuple[random.Random, Catalogue, Any]):
    rng, catalogue, sidecar = world
    names = sorted(catalogue.tools)
    compared = 0
    for _ in range(12):
        raw = generated_facts(rng, names)
        facts = ComposeInput.model_validate(raw)
        decision = sidecar.client.compose(facts, reasons=True)
        assert set(decision.visible) | set(decision.excluded) == set(names)
        assert not set(decision.visible) & set(decision.excluded)
        for tool in rng.sample(names, 5):
            executed = sidecar.client.execute(generated_call(rng, catalogue, raw, tool))
            from_execute = {
                (r.code, r.message) for r in executed.reasons if r.code in COMPOSE_CODES
            }
            from_compose = {(r.code, r.message) for r in decision.excluded.get(tool, [])}
            assert from_compose == from_execute, tool
            compared += 1
    assert compared == 60


def test_explain_execute_allow_is_executes(world: tuple[random.Random, Catalogue, Any]):
    rng, catalogue, sidecar = world
    names = sorted(catalogue.tools)
    allowed = 0
    for _ in range(120):
        tool = rng.choice(names)
        facts = generated_facts(rng, names)
        if rng.random() < 0.5:  # often let the compose checks pass
            contract = catalogue.tools[tool]
            facts["principal"]["role"] = contract.roles[0]
            facts["task"] = {
                "type": "work",
                "needs": None,
                "linked_resources": facts["task"]["linked_resources"],
            }
            facts["environment"] = contract.environments[0]
            facts["budget_class"] = "standard"
            facts["quarantined"] = []
            if contract.connection_alias is not None:
                facts["connections"] = {contract.connection_alias: "active"}
        call = generated_call(rng, catalogue, facts, tool)
        decision = sidecar.client.execute(call)
        explanation = sidecar.client.explain_execute(call)
        assert explanation.allow == decision.allow
        failing = {c.code for c in explanation.checks if not c.passed}
        assert set(decision.reason_codes) <= failing
        assert explanation.catalogue_digest == decision.catalogue_digest
        allowed += decision.allow
    assert allowed > 0


def test_explain_execute_of_an_unknown_tool_is_one_check(
    world: tuple[random.Random, Catalogue, Any],
):
    rng, catalogue, sidecar = world
    facts = generated_facts(rng, sorted(catalogue.tools))
    call = generated_call(rng, catalogue, facts, "tool.000").model_copy(
        update={
            "call": generated_call(rng, catalogue, facts, "tool.000").call.model_copy(
                update={"tool": "ghost"}
            )
        }
    )
    explanation = sidecar.client.explain_execute(call)
    assert explanation.allow is False
    assert [(c.check, c.code, c.facts) for c in explanation.checks] == [
        ("tool", "unknown_tool", {"tool": "ghost"})
    ]
