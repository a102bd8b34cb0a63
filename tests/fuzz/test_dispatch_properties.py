"""Property-based fuzzing of the dispatcher and the agent session, against the real OPA.

Hypothesis draws parameters, facts and identifiers (tool names, operation ids,
evidence, approvals) and feeds them to ``Dispatcher.call``, ``Dispatcher.compose``
and ``AgentSession.call_tool``, with an embedded OPA serving the real Rego policies
and the sales demo catalogue, and tool bodies that record being entered
(:class:`tests.fuzz.harness.Provider`). A session runs as in production: an
``AgentSession`` over a ``Gateway`` whose facts come from a real SQLite store in a
temporary folder (:class:`tests.fuzz.harness.World`). Every example, whatever it
drew, must keep the promises of ``docs/security.md``:

1. **Only capgate's errors.** Nothing comes back but an ``Outcome`` (from a session,
   a result dict, or a proposal dict for a tool that needs review) or a
   :class:`capgate.gateway.errors.CapgateError`.
2. **No tool without an allow.** A tool body is entered only when OPA's answer to
   that very call was an allow (both the answer the real policy client returned and
   the dispatcher's own ``DecisionEvent`` say so), at most once, with exactly the
   parameters whose digest OPA judged; a tool that was entered always yields an
   Outcome, and an Outcome means it was entered. Under a session the store says the
   same: when the body was entered, the operation's last ledger row was its intent,
   written under that allow's decision id, and the body held the credential of its
   tenant's connection, never that of a tenant whose name looks like it (the store
   holds one, with secrets of its own); the outcome row follows. A session whose
   connection has no secret set fails with ``CredentialUnavailable`` before anything
   is written or run, however the look-alike's are set. A proposal was allowed at
   stage ``propose``, holds the judged digest and operation, and nothing ran.
3. **No secret in logs, errors, outcomes or the store.** Secret-looking values
   placed in parameter values, facts (tenant, role, task type, subjects and other
   linked resources, environment, budget class, evidence, who approved), connection
   credentials and tool output never appear in any log record of any logger
   (captured at DEBUG by a handler on the root logger: message, arguments and
   exception text), in an exception's text (its whole chain, as a traceback prints
   it), in ``Outcome.error``, or in a ``DecisionEvent``. Under a session, none is in
   a ledger row or in any cell of the store but those that hold what callers and
   providers sent by design (:data:`tests.fuzz.harness.CALLER_DATA_COLUMNS`: a
   proposal's parameters and task, an operation's outcome, evidence names), and no
   credential is in the store file's bytes, in any cell, or in what the session
   returned; the ledger verifies. Names are logged by design (tool names, operation
   ids, connection aliases, parameter names), so no secret is put there; nor in a
   session's tenant (a generated name), the store's key that the ledger names by
   design.
4. **Short messages.** capgate's exception messages stay within
   :data:`~tests.fuzz.harness.MESSAGE_CAP` characters and ``Outcome.error`` within
   :data:`~tests.fuzz.harness.TOOL_TEXT_CAP`, however long the inputs.

Each property also counts the paths its examples took and asserts that the
interesting ones were reached (allows that ran, denials, refusals of bad input,
proposals), so no property can pass by never getting anywhere. Example counts,
seeds and the longer run: :mod:`tests.fuzz.runs`. Reviews, dispatches, revocations
and budgets over sequences of steps: :mod:`tests.fuzz.test_gateway_life_cycle`.

What these tests rely on, so they are easy to adapt when the code changes:
``Dispatcher(catalogue, decider, registry, observer=...)`` with ``call(facts, tool,
params, operation_id=, approval=, evidence=, budget=)`` and ``compose(facts)``; the
decider protocol (``compose``, ``execute``, ``review``), wrapped to record the real
client's answers; ``DecisionEvent.kind/allow/tool``; ``Outcome`` and
``ToolFailed.outcome``; ``Gateway(catalogue, policy, registry, store,
credentials=, observer=)`` over ``open_store``, and ``AgentSession(gateway,
AgentRequest)`` with ``call_tool(name, operation_id=, **params)``, ``last_outcome``
and ``last_proposal``; ``Store.ledger`` and ``verify_ledger``; ``InProcessTools``
and ``current_call()``; the catalogue's contract fields. A dispatcher's calls are
made allowable from the caller's facts (:func:`allowing_facts`,
:func:`approval_for`, :func:`store_facts`); a session's from its store
(:func:`session_case`).
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capgate.adapters.fronts.session import AgentSession
from capgate.gateway.digest import canonical_json, digest_of, params_digest
from capgate.gateway.enforce.dispatcher import DecisionEvent, Dispatcher
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CredentialUnavailable,
    InvalidInput,
    ObligationUnsupported,
    ToolFailed,
)
from capgate.gateway.model.contracts import ApprovalKind, Catalogue, Idempotency, ToolContract
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision
from capgate.gateway.model.facts import Approval, Budget, ComposeInput, ExecuteInput, Stage
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import LedgerRow, ProposalRecord, ProposalStatus
from capgate.gateway.tools.registry import ToolRegistry
from tests.fuzz.harness import (
    MESSAGE_CAP,
    TOOL_TEXT_CAP,
    Entry,
    LogCapture,
    Plan,
    Provider,
    RecordingDecider,
    Tally,
    TenantSeed,
    World,
    account_of,
    leak_in,
    ledger_text,
    planted,
    secret_credentials,
    secret_names,
    secret_texts,
)
from tests.fuzz.runs import examples, fuzz_settings, load_project_code
from tests.fuzz.strategies import (
    Long,
    LyingStr,
    hostile_values,
    identifiers,
    look_alike,
    names,
    one_in,
    parameters,
)

load_project_code()  # the same examples alone and in the whole suite (tests/fuzz/runs.py)

pytestmark = [
    pytest.mark.integration,
    # About 0.02 s an example; room for a slow machine, for CAPGATE_FUZZ_EXAMPLES and
    # for shrinking a failure (a timeout would cut hypothesis off before it prints it).
    pytest.mark.timeout(max(900, examples() // 10)),
]

#: The facts' identifier rule (gateway.model.facts.Identifier).
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")
#: A session case's task in its store. (Its tenant is a generated name, not a planted
#: secret: it is the store's key, and the ledger names it by design.)
SESSION_TASK: Final = "fuzz-task"


# == the rig: a real OPA, recording tools and decider, every log record ==============


@dataclass(frozen=True)
class SessionSeed:
    """What a session case's store holds, and the agent's standing request."""

    request: AgentRequest
    tenant: TenantSeed
    #: connection alias -> its planted secret (an alias missing here has none set)
    credentials: dict[str, str]
    #: A tenant whose name looks like the session's (:func:`look_alike`), seeded alike,
    #: with a planted secret of its own for every connection: never the session's.
    neighbour: str
    neighbour_credentials: dict[str, str]

    @property
    def name(self) -> str:
        """The session's tenant."""
        return self.request.principal.tenant


class Rig:
    """The dispatcher over the real OPA, with recording tools, decider and logs; for a
    session case, a Gateway over a fresh store around the same (a World)."""

    def __init__(
        self, catalogue: Catalogue, sidecar: PolicySidecar, logs: LogCapture, base: Path
    ) -> None:
        self.catalogue = catalogue
        self.expected_digest = sidecar.expected_digest
        self.logs = logs
        self.base = base
        self.decider = RecordingDecider(sidecar.client)
        self.provider = Provider(catalogue)
        self.events: list[DecisionEvent] = []
        #: The session and the world of a "session" case.
        self.session: AgentSession | None = None
        self.world: World | None = None
        self.dispatcher = Dispatcher(
            catalogue, self.decider, ToolRegistry(self.provider.tools), observer=self.events.append
        )

    @property
    def entered(self) -> list[Entry]:
        return self.provider.entered

    def _world(self, seed: SessionSeed) -> World:
        return World(
            self.base,
            self.catalogue,
            self.decider,
            self.provider,
            tenants={seed.name: seed.tenant, seed.neighbour: seed.tenant},
            # The session's own first: of two pairs that read one variable, the
            # look-alike's secret would be the one kept.
            credentials={(seed.name, alias): secret for alias, secret in seed.credentials.items()}
            | {(seed.neighbour, alias): s for alias, s in seed.neighbour_credentials.items()},
            observer=self.events.append,
        )

    def run(self, case: Case) -> Result:
        """Run one case; anything outside capgate's hierarchy fails the property."""
        self.events.clear()
        self.decider.clear()
        self.logs.lines.clear()
        self.provider.reset(case.plan)
        self.session = None
        self.world = self._world(case.seed) if case.seed is not None else None
        self.provider.world = self.world
        try:
            value: Any = None
            error: CapgateError | None = None
            try:
                value = case.action(self)
            except CapgateError as exc:
                error = exc
            except Exception as exc:
                pytest.fail(
                    f"{case!r} raised {type(exc).__name__}, which is outside gateway.errors:\n"
                    + "".join(traceback.format_exception(exc))
                )
            outcome = value if isinstance(value, Outcome) else None
            if isinstance(error, ToolFailed):
                outcome = error.outcome
            elif self.session is not None and isinstance(value, dict):
                outcome = self.session.last_outcome
            store = None
            if self.world is not None:
                store = StoreView(
                    self.world.store.ledger(), self.world.audit(case.secrets, case.credentials)
                )
        finally:
            self.provider.world = None
            if self.world is not None:
                self.world.close()
        return Result(value, error, outcome, store)


@dataclass
class Case:
    """One drawn input: what to do with the rig, and the secrets planted in it."""

    kind: str  # "call", "session" or "compose"
    facts: Any
    tool: Any = None
    params: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    plan: Plan = field(default_factory=Plan)
    #: The store of a "session" case.
    seed: SessionSeed | None = None

    def action(self, rig: Rig) -> Any:
        if self.kind == "compose":
            return rig.dispatcher.compose(self.facts)
        if self.kind == "session":
            assert rig.world is not None
            assert self.seed is not None
            rig.session = AgentSession(rig.world.gateway, self.seed.request)
            return rig.session.call_tool(
                self.tool, operation_id=self.options.get("operation_id"), **self.params
            )
        return rig.dispatcher.call(self.facts, self.tool, self.params, **self.options)

    @property
    def credentials(self) -> set[str]:
        if self.seed is None:
            return set()
        return planted(list(self.seed.credentials.values()), self.seed.neighbour_credentials)

    @property
    def secrets(self) -> set[str]:
        evidence = dict(self.seed.tenant.evidence) if self.seed else {}
        return planted(self.facts, self.params, self.options, self.plan, evidence) | (
            self.credentials
        )

    def __repr__(self) -> str:
        # Shown when a property fails; short, and the secrets in it are fake.
        seed = f", seed={_short(self.seed)}" if self.seed else ""
        return (
            f"Case({self.kind}, tool={_short(self.tool)}, params={_short(self.params)}, "
            f"options={_short(self.options)}, plan={self.plan!r}, facts={_short(self.facts)}"
            f"{seed})"
        )


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
    return text if len(text) <= 600 else text[:600] + f"... ({len(text)} characters)"


@dataclass(frozen=True)
class StoreView:
    """A session case's store once the case ran: its ledger, and what an audit found."""

    ledger: list[LedgerRow]
    problem: str | None


@dataclass
class Result:
    """What came back: a value or a capgate error, and the Outcome behind either."""

    value: Any
    error: CapgateError | None
    outcome: Outcome | None
    store: StoreView | None = None


# == the checks every example must pass ===============================================


def check(rig: Rig, case: Case, result: Result) -> str:
    """Assert the four promises for one case; return the path it took, for counting."""
    value, error, outcome = result.value, result.error, result.outcome

    # 2. a tool entered only under an allow, once, with what OPA judged
    entered = rig.entered
    assert len(entered) <= 1, f"{case!r}: a tool was entered {len(entered)} times"
    proposal: ProposalRecord | None = None
    if entered:
        entry = entered[0]
        assert rig.decider.executes, f"{case!r}: {entry.name} entered without asking OPA"
        request, decision = rig.decider.executes[-1]
        assert decision.allow, f"{case!r}: {entry.name} entered after a deny"
        assert decision.catalogue_digest == rig.expected_digest
        contract = rig.catalogue.tools[request.call.tool]
        assert entry.name in {contract.name, contract.execution_action}, (
            f"{case!r}: OPA allowed {contract.name} but {entry.name} ran"
        )
        assert any(e.kind == "execute" and e.allow and e.tool == contract.name for e in rig.events)
        # The tool received exactly the parameters whose digest OPA judged.
        assert digest_of(canonical_json(entry.params)) == request.call.params_digest
        assert entry.context.operation_id == request.call.operation_id
        keyed = contract.idempotency is Idempotency.IDEMPOTENT_WITH_KEY
        assert entry.context.idempotency_key == (request.call.operation_id if keyed else None)
        assert entry.context.connection_alias == contract.connection_alias
        assert outcome is not None, f"{case!r}: the tool ran but {error!r} came back"
        assert error is None or isinstance(error, ToolFailed)
        if case.seed is not None:
            check_session_run(case, result, entry, contract, (request, decision))
    else:
        assert outcome is None, f"{case!r}: an outcome without the tool being entered"
        proposal = rig.session.last_proposal if rig.session is not None else None
        if proposal is not None:
            check_proposal(rig, case, result, proposal)
        else:
            assert case.kind == "compose" or error is not None, f"{case!r}: returned {value!r}"
    if isinstance(error, CredentialUnavailable):
        # Only a session's call of a connection whose own secret is not set, nothing
        # written for it; the look-alike tenant's secret was there and was not taken.
        assert case.seed is not None, f"{case!r}: {error}"
        contract = rig.catalogue.tools.get(case.tool)
        alias = contract.connection_alias if contract is not None else None
        assert alias is not None, f"{case!r}: {error}"
        assert alias not in case.seed.credentials, f"{case!r}: its secret was set: {error}"
        assert "is not set" in str(error)
        assert result.store is not None
        assert not [row for row in result.store.ledger if row.kind in ("intent", "outcome")]
    if isinstance(error, CapabilityViolation) and not isinstance(error, ObligationUnsupported):
        request, decision = rig.decider.executes[-1]
        assert not decision.allow
        assert set(error.reason_codes) == {reason.code for reason in decision.reasons}
        assert any(e.kind == "execute" and not e.allow for e in rig.events)
        if result.store is not None:  # and the store's ledger records the denial
            assert [
                (row.decision_id, set(row.reason_codes))
                for row in result.store.ledger
                if (row.kind, row.outcome) == ("decision", "deny")
            ] == [(decision.decision_id, set(error.reason_codes))], f"{case!r}: ledger"

    # 3. no secret in any log record, exception text, Outcome.error, trace event or
    # (for a session) ledger row and store cell; no credential anywhere
    texts = list(rig.logs.lines) + [repr(event) for event in rig.events]
    if error is not None:
        texts.append("".join(traceback.format_exception(error)))
    if outcome is not None and outcome.error is not None:
        texts.append(outcome.error)
    if result.store is not None:
        assert result.store.problem is None, f"{case!r}: {result.store.problem}"
        texts.extend(ledger_text(row) for row in result.store.ledger)
    leak = leak_in(case.secrets, texts)
    assert leak is None, f"{case!r}: secret {leak[0]} leaked into:\n{leak[1][:2000]}"
    returned = [_short(value)] + ([outcome.model_dump_json()] if outcome is not None else [])
    leak = leak_in(case.credentials, returned)
    assert leak is None, f"{case!r}: credential {leak[0]} came back in:\n{leak[1][:2000]}"

    # 4. short messages
    if error is not None:
        message = str(error)
        assert len(message) <= MESSAGE_CAP, f"{case!r}: a {len(message)}-character message"
    if outcome is not None and outcome.error is not None:
        assert len(outcome.error) <= TOOL_TEXT_CAP, f"{len(outcome.error)}-character error"

    if error is not None:
        path = error.code
    elif outcome is not None:
        path = outcome.status.value
    else:
        path = "proposed" if proposal is not None else "answered"
    return f"session {path}" if case.kind == "session" else path


def check_session_run(
    case: Case,
    result: Result,
    entry: Entry,
    contract: ToolContract,
    asked: tuple[ExecuteInput, ExecuteDecision],
) -> None:
    """A session's run, as its store tells it: intent under the allow first, the
    outcome after; and the body held its tenant's credential for the connection."""
    assert case.seed is not None
    assert result.store is not None
    assert result.outcome is not None
    request, decision = asked
    context = entry.context
    assert entry.ledger, f"{case!r}: {entry.name} entered with no ledger row for its operation"
    intent = entry.ledger[-1]
    assert (intent.kind, intent.outcome) == ("intent", "running"), (
        f"{case!r}: {entry.name} entered after the ledger row {intent.kind}/{intent.outcome}"
    )
    assert intent.decision_id is not None
    assert intent.decision_id == decision.decision_id
    assert (intent.tool, intent.tenant) == (contract.name, request.principal.tenant)
    tenant = case.seed.name
    assert context.tenant == tenant
    alias = contract.connection_alias
    if alias is None:
        assert context.credential is None
    else:
        assert context.credential is not None, f"{case!r}: ran without its credential"
        assert alias in case.seed.credentials, f"{case!r}: ran with a secret it has not"
        assert context.credential.reveal() == case.seed.credentials[alias], (
            f"{case!r}: ran with another tenant's secret"
        )
        assert context.account == account_of(tenant, alias)
    rows = [
        (row.kind, row.outcome)
        for row in result.store.ledger
        if (row.tenant, row.operation_id) == (tenant, context.operation_id)
    ]
    assert rows[-2:] == [("intent", "running"), ("outcome", result.outcome.status.value)], rows


def check_proposal(rig: Rig, case: Case, result: Result, proposal: ProposalRecord) -> None:
    """A session's call of a tool that needs review: proposed under an allow at stage
    ``propose``, with the judged digest and operation; nothing ran."""
    assert result.store is not None
    assert result.error is None
    assert rig.decider.executes, f"{case!r}: proposed without asking OPA"
    request, decision = rig.decider.executes[-1]
    assert decision.allow, f"{case!r}: proposed after a deny"
    assert request.stage is Stage.PROPOSE, f"{case!r}: proposed at stage {request.stage}"
    assert result.value == {
        "proposal_id": proposal.id,
        "status": "pending_review",
        "tool": proposal.tool,
        "operation_id": proposal.operation_id,
        "version": proposal.contract_version,
        "decision_id": proposal.decision_id,
        **({"unsettled_twins": proposal.unsettled_twins} if proposal.unsettled_twins else {}),
    }
    assert (proposal.tool, proposal.operation_id, proposal.params_digest) == (
        request.call.tool,
        request.call.operation_id,
        request.call.params_digest,
    )
    assert proposal.decision_id == decision.decision_id
    assert proposal.status is ProposalStatus.PENDING
    rows = [row for row in result.store.ledger if row.proposal_id == proposal.id]
    assert [(row.kind, row.outcome, row.decision_id) for row in rows] == [
        ("proposal", "pending", decision.decision_id)
    ]


# == facts and approvals that allow a call ===========================================


def subject_of(contract: ToolContract, params: Any) -> dict[str, str] | None:
    if contract.subject_type is None:
        return None
    name = contract.subject_param or f"{contract.subject_type}_id"
    value = params.get(name) if type(params) is dict else None
    usable = type(value) is str and _IDENTIFIER.fullmatch(value)
    return {"type": contract.subject_type, "id": value if usable else "s-1"}


def allowing_facts(
    catalogue: Catalogue, contract: ToolContract, params: Any, tenant: str
) -> dict[str, Any]:
    """Facts under which the policy allows ``contract``'s tool (as a dict to perturb)."""
    role = next(r for r in contract.roles if r in catalogue.roles)
    task_type = next(
        (name for name, spec in catalogue.task_types.items() if contract.name in spec.tools),
        next(iter(catalogue.task_types)),
    )
    budget = next(
        name for name, spec in catalogue.budget_classes.items() if spec.admits(contract.cost_class)
    )
    subject = subject_of(contract, params)
    return {
        "principal": {"agent": "fuzz-agent", "role": role, "tenant": tenant},
        "task": {"type": task_type, "linked_resources": [subject] if subject else []},
        "connections": {contract.connection_alias: "active"} if contract.connection_alias else {},
        "environment": contract.environments[0],
        "budget_class": budget,
    }


def approval_for(
    contract: ToolContract, params: Any, operation_id: str, tenant: str, approved_by: str
) -> dict[str, Any] | None:
    """The approval fields that make the policy accept the call (None if none needed)."""
    if contract.approval is ApprovalKind.NONE:
        return None
    try:
        digest = params_digest(params)
    except InvalidInput:  # parameters the dispatcher refuses have no digest either
        digest = digest_of(b"")
    fields: dict[str, Any] = {
        "kind": contract.approval.value,
        "tool": contract.name,
        "operation_id": operation_id,
        "tenant": tenant,
        "digest": digest,
        "expires_at": datetime.now(UTC) + timedelta(hours=1),
        "approved_by": approved_by,
        "used": False,  # an approval allows one dispatch
    }
    return fields


def store_facts(contract: ToolContract) -> dict[str, Any]:
    """The facts a gateway's store supplies, as a caller of the stateless dispatcher
    vouches for them: an unlimited budget that the call's cost fits."""
    return {"budget": Budget(remaining=None, cost=contract.cost_units)}


def runs_when_allowed(contract: ToolContract) -> bool:
    """Whether an allowed call runs the tool at once (not so for a reviewed proposal)."""
    return not contract.needs_review


# == strategies of this module (the shared ones: tests/fuzz/strategies.py) ===========


def perturbed(
    draw: st.DrawFn, base: dict[str, Any], catalogue: Catalogue, contract: ToolContract
) -> dict[str, Any]:
    """``base`` facts with some fields swapped for other catalogue values or secrets."""
    facts = {**base, "principal": dict(base["principal"]), "task": dict(base["task"])}

    def maybe(current: Any, other: st.SearchStrategy[Any]) -> Any:
        return draw(other) if draw(one_in(4)) else current

    principal, task = facts["principal"], facts["task"]
    principal["role"] = maybe(
        principal["role"], st.sampled_from(sorted(catalogue.roles)) | secret_names
    )
    principal["tenant"] = maybe(principal["tenant"], secret_names)
    task["type"] = maybe(task["type"], st.sampled_from(sorted(catalogue.task_types)) | secret_names)
    task["needs"] = maybe(
        None,
        st.sampled_from([[], [contract.name]])
        | st.lists(st.sampled_from(sorted(catalogue.tools)) | secret_names, max_size=3),
    )
    task["linked_resources"] = maybe(
        task["linked_resources"],
        st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.sampled_from(["contact", "opportunity", "invoice"]) | names,
                    "id": secret_names | names,
                }
            ),
            max_size=3,
        ),
    )
    facts["connections"] = maybe(
        facts["connections"],
        st.dictionaries(
            st.sampled_from(["crm", "sales_mailbox", "bank"]) | names,
            st.sampled_from(["active", "disabled", "revoked"]),
            max_size=3,
        ),
    )
    facts["environment"] = maybe(
        facts["environment"],
        st.sampled_from(["development", "staging", "production"]) | secret_names,
    )
    facts["budget_class"] = maybe(
        facts["budget_class"], st.sampled_from(sorted(catalogue.budget_classes)) | secret_names
    )
    return facts


def odd_facts(draw: st.DrawFn, facts: dict[str, Any]) -> Any:
    """Facts a caller should not pass: not a ComposeInput, or a richer model."""
    which = draw(st.integers(0, 2))
    if which == 0:
        return facts  # the dict, not the model
    if which == 1:
        return draw(st.sampled_from([None, "facts", 7, ["principal"]]))
    call = {"tool": "contact.read", "version": 1, "operation_id": "op-1"}
    return ExecuteInput.model_validate({**facts, "call": {**call, "params_digest": digest_of(b"")}})


tool_names_hostile = st.one_of(
    names,
    st.text(max_size=40),
    st.just(Long("t" * 100_000)),
    st.just(""),
    st.sampled_from([None, 7, b"contact.read", ["contact.read"]]),
)


def near_misses(catalogue: Catalogue) -> st.SearchStrategy[str]:
    """Catalogue names with a character added: a space, a newline, a dot, a zero-width space."""
    return st.builds(
        lambda name, extra: name + extra,
        st.sampled_from(sorted(catalogue.tools)),
        st.sampled_from([" ", "\n", ".", "\u200b", "\x00"]),
    )


operation_ids = st.one_of(
    st.none(),
    names,
    st.text(max_size=20),
    st.just(""),
    st.just(Long("o" * 5_000)),
    st.sampled_from([7, b"op-1", ["op-1"]]),
    names.map(LyingStr),
)


@st.composite
def evidence_lists(draw: st.DrawFn, contract: ToolContract) -> Any:
    choice = draw(st.integers(0, 9))
    if choice <= 4:
        return contract.required_names
    if choice == 5:
        return draw(
            st.lists(st.sampled_from(contract.requires or ["x"]) | secret_names, max_size=4)
        )
    if choice == 6:
        return "invoice_approved"  # a string is not a list of names
    if choice == 7:
        return ["ok"] * 300  # past the limit
    if choice == 8:
        return iter(contract.requires)
    return draw(st.lists(hostile_values, min_size=1, max_size=2))


def _plans() -> st.SearchStrategy[Plan]:
    return st.builds(
        Plan,
        st.sampled_from(Plan.KINDS),
        st.one_of(secret_texts, secret_names),
        st.one_of(
            st.none(), st.floats(0, 60), st.just(float("nan")), st.just("soon"), st.just(True)
        ),
    )


# == the properties ==================================================================


@pytest.fixture(scope="module")
def rig(
    sales_catalogue: Catalogue,
    sales_sidecar: PolicySidecar,
    log_capture: LogCapture,
    tmp_path_factory: pytest.TempPathFactory,
) -> Rig:
    return Rig(sales_catalogue, sales_sidecar, log_capture, tmp_path_factory.mktemp("sessions"))


def _tools(catalogue: Catalogue) -> st.SearchStrategy[ToolContract]:
    return st.sampled_from([catalogue.tools[name] for name in sorted(catalogue.tools)])


def _call_case(
    draw: st.DrawFn,
    catalogue: Catalogue,
    contract: ToolContract,
    params: Any,
    *,
    perturb_facts: bool = False,
    kind: str = "call",
) -> Case:
    """A call of ``contract`` with ``params`` under facts and proofs that allow it."""
    tenant = draw(secret_names)
    operation_id = draw(names)
    facts = allowing_facts(catalogue, contract, params, tenant)
    if perturb_facts:
        facts = perturbed(draw, facts, catalogue, contract)
    approval = approval_for(contract, params, operation_id, tenant, draw(secret_names))
    options: dict[str, Any] = {
        "operation_id": operation_id,
        "evidence": contract.required_names,
        **store_facts(contract),
    }
    if approval is not None:
        options["approval"] = Approval.model_validate(approval)
    return Case(
        kind, ComposeInput.model_validate(facts), contract.name, params, options, draw(_plans())
    )


def test_parameters(rig: Rig) -> None:
    """Any parameters: valid ones with secrets in them run; broken ones are InvalidInput."""
    tally = Tally("parameters")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        contract = data.draw(_tools(rig.catalogue))
        params = data.draw(parameters(contract, hostile=data.draw(st.booleans())))
        case = _call_case(data.draw, rig.catalogue, contract, params)
        tally.add(check(rig, case, rig.run(case)))

    run()
    tally.finish("success", "unknown", "input_invalid")


def test_facts(rig: Rig) -> None:
    """Any facts: roles, tenants, tasks, subjects, connections, environments, budgets."""
    tally = Tally("facts")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        contract = data.draw(_tools(rig.catalogue))
        params = data.draw(parameters(contract))
        case = _call_case(data.draw, rig.catalogue, contract, params, perturb_facts=True)
        if data.draw(one_in(6)):
            base = case.facts.model_dump(mode="json")
            case.facts = odd_facts(data.draw, base)
        tally.add(check(rig, case, rig.run(case)))

    run()
    tally.finish("success", "capability_denied", "input_invalid")


def test_identifiers(rig: Rig) -> None:
    """Any tool name, operation id, evidence and approval, through calls and sessions."""
    tally = Tally("identifiers")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        contract = data.draw(_tools(rig.catalogue))
        params = data.draw(parameters(contract))
        # Two in three through a session: the dispatcher's own calls have four more
        # properties; the session's paths (run, proposed, refused, failed) need room.
        kind = data.draw(st.sampled_from(["call", "session", "session"]))
        case = _call_case(data.draw, rig.catalogue, contract, params)
        draw = data.draw
        if draw(one_in(3)):
            case.tool = draw(
                st.sampled_from(sorted(rig.catalogue.runnable_names() | {"contact.READ"}))
                | near_misses(rig.catalogue)
                | tool_names_hostile
            )
        if draw(one_in(3)):
            case.options["operation_id"] = draw(operation_ids)
        if draw(one_in(3)):
            case.options["evidence"] = draw(evidence_lists(contract))
        if draw(one_in(3)):
            case.options["approval"] = draw(approvals(contract, case))
        # ``**params`` cannot even pass what is not a dict of a str-named tool.
        if kind == "session" and type(case.tool) is str and type(case.params) is dict:
            case = session_case(draw, rig.catalogue, case)
        tally.add(check(rig, case, rig.run(case)))

    run()
    # (A session's denials, some 20 in 200 examples, and its calls without their
    # secret, a few, are not required: an odd seed draws none.)
    tally.finish(
        "success",
        "capability_denied",
        "input_invalid",
        "session success",
        "session tool_failed",
        "session proposed",
        "session input_invalid",
    )


def session_case(draw: st.DrawFn, catalogue: Catalogue, case: Case) -> Case:
    """The same call made by an agent's session, with the facts in the gateway's store.

    The store holds the tenant, under a generated name, with the facts' budget
    class and connections, and records for the task the evidence the case drew (a
    list of names; anything else records none). Approvals come only from reviews
    now, so a drawn one is dropped (reviews: test_gateway_life_cycle.py); each
    connection gets a planted secret as its credential. The operation id, drawn or
    absent (the session makes one), is passed as the session's. Beside it, the store
    holds a tenant whose name looks like it (another case, ``_ . - : /`` swapped,
    issue #17), with the same facts and secrets of its own.

    One case in three changes what the store holds instead, as an operator might:
    the called tool's connection disabled, revoked or missing, or another budget
    class. The session cannot say otherwise: OPA must see the store's facts. And one
    in four leaves the called tool's secret unset (the look-alike's is set).
    """
    facts = case.facts
    connections = {alias: status.value for alias, status in facts.connections.items()}
    budget_class = facts.budget_class
    contract = catalogue.tools.get(case.tool)
    if draw(one_in(3)) and contract is not None:
        change = draw(st.sampled_from(["disabled", "revoked", "missing", "budget class"]))
        alias = contract.connection_alias
        if change == "budget class" or alias is None:
            budget_class = draw(st.sampled_from(sorted(catalogue.budget_classes)))
        elif change == "missing":
            connections.pop(alias, None)
        else:
            connections[alias] = change
    tenant = draw(identifiers)
    principal = {**facts.principal.model_dump(mode="json"), "tenant": tenant}
    evidence = case.options.get("evidence")
    names = set()
    if type(evidence) is list:
        names = {e for e in evidence if type(e) is str and _IDENTIFIER.fullmatch(e)}
    aliases = sorted({c.connection_alias for c in catalogue.tools.values() if c.connection_alias})
    seed = SessionSeed(
        request=AgentRequest.model_validate(
            {
                "principal": principal,
                "task": {**facts.task.model_dump(mode="json"), "id": SESSION_TASK},
                "environment": facts.environment,
            }
        ),
        tenant=TenantSeed(
            budget_class=budget_class,
            connections=connections,
            evidence={SESSION_TASK: tuple(sorted(names))},
        ),
        credentials={alias: draw(secret_credentials) for alias in aliases},
        neighbour=draw(look_alike(tenant)),
        neighbour_credentials={alias: draw(secret_credentials) for alias in aliases},
    )
    if draw(one_in(4)) and contract is not None and contract.connection_alias is not None:
        del seed.credentials[contract.connection_alias]
    facts = ComposeInput.model_validate({**facts.model_dump(mode="json"), "principal": principal})
    options = {"operation_id": case.options.get("operation_id")}
    return Case("session", facts, case.tool, case.params, options, case.plan, seed)


@st.composite
def approvals(draw: st.DrawFn, contract: ToolContract, case: Case) -> Any:
    """An approval that is wrong in one or more ways, or not an approval at all."""
    tenant = case.facts.principal.tenant
    operation_id = case.options.get("operation_id")
    if type(operation_id) is not str or not _IDENTIFIER.fullmatch(operation_id):
        operation_id = "op-1"
    fields = approval_for(
        contract.model_copy(update={"approval": ApprovalKind.EXACT_CONTENT_AND_RECIPIENT}),
        case.params,
        operation_id,
        tenant,
        draw(secret_names),
    )
    assert fields is not None
    # sorted: a set's order follows the string hash, which changes from run to run
    for name in sorted(draw(st.sets(st.sampled_from(sorted(fields)), max_size=3))):
        if name == "expires_at":
            fields[name] = datetime.now(UTC) - draw(
                st.sampled_from([timedelta(0), timedelta(days=1)])
            )
        elif name == "digest":
            fields[name] = digest_of(draw(st.binary(max_size=8)))
        elif name == "operation_id":  # logged by design: never a secret (docs/security.md)
            fields[name] = draw(names)
        elif name == "used":
            fields[name] = True
        else:
            fields[name] = draw(names | secret_names)
    which = draw(st.sampled_from(["approval"] * 4 + ["dict", "other"]))
    if which == "dict":
        return fields  # the fields, not an Approval
    if which == "other":
        return draw(st.sampled_from(["approved", 1, object()]))
    return Approval.model_validate(fields)


def test_allowed_calls_run_once_with_what_was_judged(rig: Rig) -> None:
    """Calls the policy allows: entered exactly once, with the judged parameters."""
    tally = Tally("allowed calls")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        contract = data.draw(_tools(rig.catalogue))
        params = data.draw(parameters(contract))
        case = _call_case(data.draw, rig.catalogue, contract, params)
        result = rig.run(case)
        path = check(rig, case, result)
        tally.add(path)
        if runs_when_allowed(contract) and not isinstance(result.error, InvalidInput):
            # (InvalidInput: e.g. a pattern that Python and ECMA-262 read apart.)
            assert len(rig.entered) == 1, f"{case!r}: allowing facts, but {path}"

    run()
    tally.finish("success")


def test_compose_and_hidden_tools(rig: Rig) -> None:
    """Any facts compose to a subset of the catalogue; a hidden tool is never entered."""
    tally = Tally("compose")

    @fuzz_settings()
    @given(st.data())
    def run(data: st.DataObject) -> None:
        contract = data.draw(_tools(rig.catalogue))
        params = data.draw(parameters(contract))
        call = _call_case(data.draw, rig.catalogue, contract, params, perturb_facts=True)
        facts = call.facts
        if data.draw(one_in(10)):
            facts = odd_facts(data.draw, facts.model_dump(mode="json"))
        case = Case("compose", facts, plan=call.plan)
        result = rig.run(case)
        tally.add(check(rig, case, result))
        if not isinstance(result.value, ComposeDecision):
            return
        assert set(result.value.visible) <= set(rig.catalogue.tools)
        if contract.name in result.value.visible:
            return
        # Hidden at compose time: the same facts, with every proof, must not run it.
        tally.note("hidden tool called")
        hidden = rig.run(call)
        check(rig, call, hidden)
        assert not rig.entered, f"{call!r}: hidden by compose, entered by call"

    run()
    tally.finish("answered", "hidden tool called")


def test_compose_refuses_facts_built_without_validation(rig: Rig) -> None:
    """Facts made with ``model_copy(update=...)`` (validation skipped) are refused.

    ``compose`` validates the facts again from a plain dump, like ``call``: a
    ComposeInput that skipped validation never reaches OPA as it is.
    """
    facts = ComposeInput.model_validate(
        {
            "principal": {"agent": "a", "role": "sales", "tenant": "t"},
            "task": {"type": "customer_quote"},
            "environment": "production",
            "budget_class": "standard",
        }
    )
    unchecked = facts.model_copy(update={"environment": "not an identifier " + "e" * 1000})
    with pytest.raises(InvalidInput, match="environment"):
        rig.dispatcher.compose(unchecked)
