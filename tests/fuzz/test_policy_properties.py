"""Properties of the policies themselves, on generated catalogues and facts, against the real OPA.

The dispatch properties (:mod:`tests.fuzz.test_dispatch_properties`) hold the Python
side to its promises over one demo catalogue; these hold the Rego to three promises
over catalogues hypothesis makes up:

1. **Hidden means uncallable.** A tool outside the composed set is never allowed at
   execute time, at any stage, whatever approval (a matching one included),
   evidence (all the contract requires included) or subject (one linked to the
   task included) the call carries.
2. **Granting more never hides anything.** A catalogue that grants more (more roles
   on a tool, more environments, more tools listed by a task type, a higher budget
   ceiling) and facts that grant more (more connections active, fewer tools
   quarantined, no ``task.needs`` narrowing) see every tool the original saw.
3. **Revoking a connection never reveals anything.** The same question with one
   connection revoked, disabled or gone sees a subset of what it saw.

The catalogues are built as the loader builds them (:class:`Catalogue` models,
cross-checked) and compiled by :func:`capgate.gateway.catalogue.compile_catalogue`; the
facts are :class:`ComposeInput` and :class:`ExecuteInput` models. One OPA process
(``opa run`` on 127.0.0.1, serving the bundle capgate writes) answers every example
in one ``POST /v1/query``, which evaluates the real entrypoints
(``data.capgate.compose.decision``, ``data.capgate.execute.decision``) with the
generated catalogue in place of the bundle's (``with data.capgate.catalogue as``),
and the explain entrypoints beside them, whose verdicts must be the decisions'
(every example of every property checks it).
Example counts, seeds and the longer run: :mod:`tests.fuzz.runs`
(``CAPGATE_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.digest import digest_of
from capgate.gateway.model.contracts import (
    ApprovalKind,
    BudgetClassSpec,
    Catalogue,
    CostClass,
    Idempotency,
    Mode,
    RoleSpec,
    TaskTypeSpec,
    ToolContract,
)
from capgate.gateway.model.facts import ComposeInput, ExecuteInput
from capgate.gateway.opa.bundle import write_bundle
from tests.fuzz.harness import Tally
from tests.fuzz.runs import examples, fuzz_settings, load_project_code
from tests.fuzz.strategies import one_in
from tests.hang import ANSWER_TIMEOUT
from tests.integration.opa_servers import external_opa

load_project_code()  # the same examples alone and in the whole suite (tests/fuzz/runs.py)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(max(900, examples() // 5))]

ROLES: Final = ("r0", "r1", "r2")
REVIEWER: Final = "reviewer"
TASK_TYPES: Final = ("t0", "t1")
ENVIRONMENTS: Final = ("dev", "stage", "prod")
ALIASES: Final = ("a0", "a1", "a2")
BUDGET_CLASSES: Final = ("b0", "b1", "b2")
EVIDENCE: Final = ("ev.a", "ev.b")
TENANT: Final = "tenant-1"
SUBJECT: Final = {"type": "contact", "id": "c-1"}
STATUSES: Final = ("active", "disabled", "revoked")

# Bind the generated catalogue once, then ask each question with it in place.
_QUERY: Final = (
    "catalogue := input.catalogue; "
    "visible := [v | some facts in input.composes; "
    "v := data.capgate.compose.decision.visible "
    "with input as facts with data.capgate.catalogue as catalogue]; "
    "explained := [v | some facts in input.composes; "
    "e := data.capgate.explain.compose "
    "with input as facts with data.capgate.catalogue as catalogue; "
    "v := {name | some name, tool in e.tools; tool.visible == true}]; "
    "allowed := {name | some name, call in input.calls; "
    "data.capgate.execute.decision.allow == true "
    "with input as call with data.capgate.catalogue as catalogue}; "
    "explained_allowed := {name | some name, call in input.calls; "
    "data.capgate.explain.execute.allow == true "
    "with input as call with data.capgate.catalogue as catalogue}"
)


# == the rig: one OPA serving capgate's bundle ==========================================


class Policies:
    """Ask the real policies about a generated catalogue, one request per example."""

    def __init__(self, address: str) -> None:
        self.client = httpx.Client(base_url=address, timeout=ANSWER_TIMEOUT)

    def ask(
        self,
        catalogue: Catalogue,
        composes: list[ComposeInput],
        calls: dict[str, ExecuteInput] | None = None,
    ) -> tuple[list[set[str]], set[str]]:
        """The visible names for each compose input, and which calls are allowed.

        The explain entrypoints are asked the same questions, and must give the same
        verdicts: each tool's ``visible``, each call's ``allow``.
        """
        body = {
            "query": _QUERY,
            "input": {
                "catalogue": compile_catalogue(catalogue),
                "composes": [facts.model_dump(mode="json") for facts in composes],
                "calls": {name: call.to_opa() for name, call in (calls or {}).items()},
            },
        }
        response = self.client.post("/v1/query", json=body)
        assert response.status_code == 200, response.text[:2000]
        results = response.json().get("result") or []
        assert len(results) == 1, f"the query was undefined: {response.text[:2000]}"
        bound = results[0]
        visible = [set(names) for names in bound["visible"]]
        assert visible == [set(names) for names in bound["explained"]], "explain disagrees"
        assert set(bound["allowed"]) == set(bound["explained_allowed"]), "explain disagrees"
        return visible, set(bound["allowed"])


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Policies]:
    folder = tmp_path_factory.mktemp("policy-properties")
    # The bundle capgate writes (policies + a compiled catalogue); every question
    # replaces the catalogue with the generated one.
    bundle = write_bundle(load_catalogue(demo_catalogue_dir("sales")), folder / "bundle")
    with external_opa(bundle, folder / "opa.log") as server:
        asker = Policies(server.address)
        try:
            yield asker
        finally:
            asker.client.close()


# == strategies: catalogues, facts, calls ===============================================


def _subset(values: tuple[str, ...], min_size: int = 0) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(values), min_size=min_size, unique=True).map(sorted)


@st.composite
def tools(draw: st.DrawFn, index: int) -> ToolContract:
    mode = draw(st.sampled_from(list(Mode)))
    approval = ApprovalKind.EXACT_CONTENT_AND_RECIPIENT
    if mode is not Mode.PROPOSE_WRITE:
        approval = draw(st.sampled_from(list(ApprovalKind)))
    reviewed = mode is Mode.PROPOSE_WRITE or approval is not ApprovalKind.NONE
    return ToolContract.model_validate(
        {
            "name": f"tool{index}",
            "version": draw(st.integers(1, 3)),
            "description": f"generated tool {index}",
            "mode": mode,
            "roles": draw(_subset(ROLES, 1)),
            "connection_alias": draw(st.sampled_from((None, *ALIASES))),
            "subject_type": draw(st.sampled_from((None, "contact"))),
            "requires": draw(_subset(EVIDENCE)),
            "approval": approval,
            "execution_action": f"run.tool{index}" if mode is Mode.PROPOSE_WRITE else None,
            "recovery": "look_it_up",
            "idempotency": draw(st.sampled_from(list(Idempotency))),
            "cost_class": draw(st.sampled_from(list(CostClass))),
            "environments": draw(_subset(ENVIRONMENTS, 1)),
            # tool0 produces every evidence name, so any requires is satisfiable
            "produces": list(EVIDENCE) if index == 0 else [],
            "reviewers": [REVIEWER] if reviewed else [],
        }
    )


@st.composite
def catalogues(draw: st.DrawFn) -> Catalogue:
    contracts = [draw(tools(index)) for index in range(draw(st.integers(1, 6)))]
    names = tuple(contract.name for contract in contracts)
    return Catalogue(
        tools={contract.name: contract for contract in contracts},
        roles={
            **{role: RoleSpec(description=role) for role in ROLES},
            REVIEWER: RoleSpec(description="reviews", approves=[*ApprovalKind][1:]),
        },
        task_types={
            task: TaskTypeSpec(description=task, tools=draw(_subset(names))) for task in TASK_TYPES
        },
        budget_classes={
            name: BudgetClassSpec(
                description=name, max_cost_class=draw(st.sampled_from(list(CostClass)[::-1]))
            )
            for name in BUDGET_CLASSES
        },
    )


@st.composite
def compose_facts(draw: st.DrawFn, catalogue: Catalogue) -> ComposeInput:
    """Facts that mostly fit the catalogue (so that tools are visible often), and
    sometimes do not: an unknown role, task type, environment or budget class, a
    task.needs narrowing, connections not active, tools quarantined."""
    names = tuple(sorted(catalogue.tools))
    connections = {}
    for alias in ALIASES:
        status = draw(st.sampled_from(["active", "active", "active", *STATUSES[1:], "missing"]))
        if status != "missing":
            connections[alias] = status
    role = draw(st.sampled_from((*ROLES, "nobody")))
    task_type = draw(st.sampled_from((*TASK_TYPES, "t-unknown")))
    environment = draw(st.sampled_from((*ENVIRONMENTS, "env-unknown")))
    budget_class = draw(st.sampled_from((*BUDGET_CLASSES, "b-unknown")))
    if not draw(one_in(4)):
        # Aim at one tool: facts that pass its role, task and environment checks.
        target = catalogue.tools[draw(st.sampled_from(names))]
        role = draw(st.sampled_from(target.roles))
        environment = draw(st.sampled_from(target.environments))
        listing = [t for t, spec in catalogue.task_types.items() if target.name in spec.tools]
        task_type = draw(st.sampled_from(listing)) if listing else task_type
        admitting = [
            name
            for name, spec in catalogue.budget_classes.items()
            if target.cost_class.rank <= spec.max_cost_class.rank
        ]
        budget_class = draw(st.sampled_from(admitting)) if admitting else budget_class
        if target.connection_alias is not None and not draw(one_in(3)):
            connections[target.connection_alias] = "active"
    return ComposeInput.model_validate(
        {
            "principal": {
                "agent": "agent-1",
                "role": role,
                "tenant": TENANT,
            },
            "task": {
                "type": task_type,
                "id": "task-1",
                "needs": draw(_subset(names)) if draw(one_in(4)) else None,
                "linked_resources": [SUBJECT],
            },
            "connections": connections,
            "environment": environment,
            "budget_class": budget_class,
            "quarantined": draw(_subset(names)) if draw(one_in(4)) else [],
        }
    )


@st.composite
def calls(draw: st.DrawFn, contract: ToolContract, facts: ComposeInput) -> ExecuteInput:
    """A call of ``contract``: by default as allowable as a call can be (the stage its
    review needs, a matching approval, the evidence it requires, a linked subject,
    budget to spare), with any part of it drawn otherwise."""
    operation = "op-1"
    params = digest_of(b"{}")
    reviewed = contract.needs_review
    stage = draw(st.sampled_from(["natural", "call", "propose", "dispatch"]))
    if stage == "natural":
        stage = "dispatch" if reviewed else "call"
    approval: dict[str, Any] | None = {
        "kind": contract.approval.value if reviewed else "exact_content_and_recipient",
        "tool": contract.name,
        "operation_id": operation,
        "tenant": TENANT,
        "digest": params,
        "expires_at": datetime.now(UTC) + timedelta(hours=1),
        "approved_by": "person-1",
        "used": False,
    }
    shape = draw(st.sampled_from(["matching", "matching", "none", "used", "other tool"]))
    if shape == "none":
        approval = None
    elif approval is not None and shape == "used":
        approval["used"] = True
    elif approval is not None and shape == "other tool":
        approval["tool"] = "tool-elsewhere"
    evidence = draw(st.sampled_from([contract.required_names, list(EVIDENCE), []]))
    subject = draw(st.sampled_from([SUBJECT, {"type": "contact", "id": "c-unlinked"}, None]))
    if contract.subject_type is not None and draw(st.booleans()):
        subject = SUBJECT
    return ExecuteInput.model_validate(
        {
            **facts.model_dump(mode="json"),
            "call": {
                "tool": contract.name,
                "version": contract.version,
                "operation_id": operation,
                "subject": subject,
                "params_digest": params,
            },
            "stage": stage,
            "approval": approval,
            "evidence": evidence,
            "budget": draw(
                st.sampled_from(
                    [
                        {"remaining": None, "cost": contract.cost_units},
                        {"remaining": 10**6, "cost": contract.cost_units},
                        {"remaining": 0, "cost": contract.cost_units + 1},
                        None,
                    ]
                )
            ),
            "operation": {"status": "none"},
            "proposal": {
                "id": "proposal-1",
                "status": draw(st.sampled_from(["approved", "pending"])),
            },
        }
    )


# == granting more, revoking a connection ===============================================


@st.composite
def granting_more(draw: st.DrawFn, catalogue: Catalogue) -> Catalogue:
    """The same catalogue with more granted: roles, environments, task listings, ceilings."""
    names = tuple(sorted(catalogue.tools))
    tools_ = {}
    for name, contract in catalogue.tools.items():
        roles = sorted(set(contract.roles) | set(draw(_subset(ROLES))))
        environments = sorted(set(contract.environments) | set(draw(_subset(ENVIRONMENTS))))
        tools_[name] = contract.model_copy(update={"roles": roles, "environments": environments})
    task_types = {
        task: spec.model_copy(update={"tools": sorted(set(spec.tools) | set(draw(_subset(names))))})
        for task, spec in catalogue.task_types.items()
    }
    budget_classes = {
        name: spec.model_copy(
            update={
                "max_cost_class": max(
                    spec.max_cost_class,
                    draw(st.sampled_from(list(CostClass))),
                    key=lambda c: c.rank,
                )
            }
        )
        for name, spec in catalogue.budget_classes.items()
    }
    return Catalogue(
        tools=tools_, roles=catalogue.roles, task_types=task_types, budget_classes=budget_classes
    )


@st.composite
def facts_granting_more(draw: st.DrawFn, facts: ComposeInput) -> ComposeInput:
    """More connections active, fewer tools quarantined, maybe no task.needs narrowing."""
    data = facts.model_dump(mode="json")
    for alias in draw(_subset(ALIASES)):
        data["connections"][alias] = "active"
    data["quarantined"] = [name for name in data["quarantined"] if draw(st.booleans())]
    if data["task"]["needs"] is not None and draw(st.booleans()):
        data["task"]["needs"] = None
    return ComposeInput.model_validate(data)


# == the properties =======================================================================


@dataclass
class Checked:
    visible: int = 0
    hidden: int = 0


def test_a_tool_outside_the_composed_set_is_never_allowed(policies: Policies) -> None:
    """Hidden means uncallable, whatever the call carries; and allows do happen."""
    tally = Tally("hidden means uncallable")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        catalogue = data.draw(catalogues())
        facts = data.draw(compose_facts(catalogue))
        drawn = {
            name: data.draw(calls(contract, facts)) for name, contract in catalogue.tools.items()
        }
        [visible], allowed = policies.ask(catalogue, [facts], drawn)
        leaked = allowed - visible
        assert not leaked, f"allowed at execute but hidden at compose: {sorted(leaked)}"
        tally.add("some visible" if visible else "none visible")
        for name in sorted(catalogue.tools):
            if name in allowed:
                tally.note("allowed")
            elif name in visible:
                tally.note("visible, denied")
            else:
                tally.note("hidden, denied")

    run()
    tally.finish("allowed", "visible, denied", "hidden, denied")


def test_granting_more_never_hides_anything(policies: Policies) -> None:
    tally = Tally("granting more never hides")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        catalogue = data.draw(catalogues())
        facts = data.draw(compose_facts(catalogue))
        wider = data.draw(granting_more(catalogue))
        more = data.draw(facts_granting_more(facts))
        [before], _ = policies.ask(catalogue, [facts])
        [after_catalogue, after_both], _ = policies.ask(wider, [facts, more])
        assert before <= after_catalogue, f"granting hid {sorted(before - after_catalogue)}"
        assert after_catalogue <= after_both, f"facts hid {sorted(after_catalogue - after_both)}"
        tally.add("revealed more" if before < after_both else "same")

    run()
    tally.finish("revealed more", "same")


def test_revoking_a_connection_never_reveals_anything(policies: Policies) -> None:
    tally = Tally("revoking never reveals")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        catalogue = data.draw(catalogues())
        facts = data.draw(compose_facts(catalogue))
        alias = data.draw(st.sampled_from(ALIASES))
        change = data.draw(st.sampled_from(["revoked", "disabled", "missing"]))
        changed = facts.model_dump(mode="json")
        if change == "missing":
            changed["connections"].pop(alias, None)
        else:
            changed["connections"][alias] = change
        revoked = ComposeInput.model_validate(changed)
        [before, after], _ = policies.ask(catalogue, [facts, revoked])
        assert after <= before, f"revoking {alias} ({change}) revealed {sorted(after - before)}"
        tally.add("hid something" if after < before else "same")

    run()
    tally.finish("hid something", "same")
