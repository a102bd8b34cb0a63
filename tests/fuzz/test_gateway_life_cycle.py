"""The gateway's life cycle under generated sequences of steps, against the real OPA.

Hypothesis draws sequences of up to :data:`MAX_STEPS` steps. Each sequence runs
against a Gateway of its own over a fresh SQLite store
(:class:`tests.fuzz.harness.World`) seeded with two tenants, ``acme`` and
``globex`` (budget limit and recorded evidence drawn, every connection active),
whose connection credentials are planted secrets; it asks the embedded OPA serving
the real policies and the sales catalogue, and its tools are the suite's recording
bodies (:class:`tests.fuzz.harness.Provider`), each step with a plan of its own.
The steps, in any order:

- **call**: an agent (sales, finance or support of acme; sales of globex) calls a
  tool through ``Gateway.call``, under an operation id from a small pool (so an id
  comes back with the same call, or with another), none, or a malformed one, with
  parameters from a small pool or generated (secrets planted where they fit). A
  tool that needs review is proposed instead (drawn as a **propose** step);
- **review**: a reviewer gives a verdict on a proposal: the reviewer the catalogue
  names, a role that may not review it, its proposer (in a reviewing role), one of
  the other tenant; with an approval time to live that is usual, over at once, or
  refused; or on a proposal that does not exist;
- **dispatch**: the execution service dispatches a proposal (``Gateway.dispatch``);
- **connection**: an operator revokes or restores a connection
  (``Gateway.revoke_connection`` and ``restore_connection``);
- **budget**: an operator sets a tenant's or a task's limit (``capgate budget set``).

After every step, whatever came of it (:meth:`LifeCycle.check`):

1. **Only documented errors.** A step raises nothing but the errors its method
   documents (:data:`DOCUMENTED`); never PolicyUnavailable (OPA is well) nor a store
   error; capgate's messages stay within :data:`~tests.fuzz.harness.MESSAGE_CAP`.
2. **One run per operation.** The provider is entered at most once per step, and
   for an operation id only while a repeat is safe: never again once a run of it
   ended ``success`` or ``refused``, nor after ``unknown`` unless the contract makes
   repeating safe or the tool's lookup found nothing first. Nothing else enters it
   twice (an operation whose run ended retryable did not happen).
3. **No run without an allow and its intent.** The step's last execute decision
   allowed this very call (tool, tenant, operation, the digest of what the body got,
   stage ``call`` or ``dispatch``); when the body was entered, the operation's last
   ledger row was its intent under that decision's id (after the proposal's
   ``dispatched`` row, for a dispatch); the body got its tenant's credential and
   account. A tool that ran always answers with an Outcome; an Outcome without a run
   is a recorded duplicate, or the lookup's find.
4. **Budgets.** Nothing stays reserved between steps; a step that raised a budget's
   spent + reserved left it within the limit (lowering a limit below what is spent
   is the operator's, and only stops further calls); what is spent is exactly the
   cost of the operations that ended ``success`` or ``unknown``, each once.
5. **Proposals.** Statuses only move forward (pending to approved, rejected or
   blocked; approved to dispatched or blocked); a proposal is dispatched at most
   once (one ``dispatched`` row, one consumed approval), and only after an approving
   review by a reviewer of its tenant, in a reviewing role, who is not its proposer.
6. **The ledger verifies** (``Store.verify_ledger``).
7. **No planted secret** (credentials, parameter values, tool output) in a log
   record, an exception's text, ``Outcome.error``, a decision event or a ledger row,
   nor in the store but where callers' and providers' data is kept by design
   (:data:`~tests.fuzz.harness.CALLER_DATA_COLUMNS`); no credential in the store
   file's bytes or in anything a step returned.

The summary at the end of the run gives sequences, steps and the paths of the steps
(``<step> <what came of it>``), and the reason codes of the denials met. The steps are
drawn so that the life cycle gets somewhere (reviews weigh more while a proposal is
pending, dispatches while one is approved; earlier calls come back), yet any step may
come at any time. :func:`sequences` sets how many: 100 in ``make test`` (some 15 s).
"""

from __future__ import annotations

import contextlib
import io
import traceback
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from capgate.cli.main import main as capgate_cli
from capgate.gateway.digest import canonical_json, digest_of, email_digest
from capgate.gateway.enforce.dispatcher import DecisionEvent
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    InvalidInput,
    OperationConflict,
    UnknownConnection,
    UnknownProposal,
)
from capgate.gateway.model.contracts import Catalogue, Idempotency
from capgate.gateway.model.decisions import ExecuteDecision
from capgate.gateway.model.facts import EvidenceSubject, ExecuteInput, Reviewer, Stage
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import (
    BudgetState,
    LedgerRow,
    OperationStatus,
    ProposalRecord,
    ProposalStatus,
    ReviewVerdict,
)
from tests.fuzz.harness import (
    MESSAGE_CAP,
    Entry,
    LogCapture,
    Lookup,
    Plan,
    Provider,
    RecordingDecider,
    SeededEvidence,
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
from tests.fuzz.strategies import one_in, parameters

load_project_code()  # the same examples alone and in the whole suite (tests/fuzz/runs.py)

pytestmark = [
    pytest.mark.integration,
    # About 15 s by default. A failure is shrunk by replaying whole sequences, each
    # over a fresh store; a timeout would cut hypothesis off before it prints one.
    pytest.mark.timeout(max(900, examples())),
]

#: The most steps in one sequence.
MAX_STEPS: Final = 12

ACME: Final = "acme"
GLOBEX: Final = "globex"
ALIASES: Final = ("bank", "crm", "sales_mailbox")
QUOTE_TASK: Final = {
    "type": "customer_quote",
    "id": "task-quote",
    "linked_resources": [
        {"type": "contact", "id": "c-42"},
        {"type": "contact", "id": "c-77"},
        {"type": "opportunity", "id": "opp-17"},
    ],
}
PAY_TASK: Final = {
    "type": "invoice_payment",
    "id": "task-pay",
    "linked_resources": [{"type": "invoice", "id": "inv-9"}],
}
TASKS: Final = ("task-quote", "task-pay")


def _agent(agent: str, role: str, tenant: str, task: dict[str, Any]) -> AgentRequest:
    return AgentRequest.model_validate(
        {
            "principal": {"agent": agent, "role": role, "tenant": tenant},
            "task": task,
            "environment": "production",
        }
    )


#: Who calls: agents of acme in three roles, and one of globex (with the same agent
#: name as acme's sales agent: a name is no identity across tenants).
AGENTS: Final = {
    "sales": _agent("sales-bot", "sales", ACME, QUOTE_TASK),
    "finance": _agent("finance-bot", "finance", ACME, PAY_TASK),
    "support": _agent("help-bot", "support", ACME, QUOTE_TASK),
    "globex sales": _agent("sales-bot", "sales", GLOBEX, QUOTE_TASK),
}


def _reviewer(name: str, role: str, tenant: str) -> Reviewer:
    return Reviewer(id=name, role=role, tenant=tenant, authenticated_by="test:fuzz")


#: Who reviews. "fit" (drawn most) is the one the catalogue names for the proposal
#: in its tenant; the others may not review it, or not every proposal.
REVIEWERS: Final = {
    "maria": _reviewer("maria", "sales_manager", ACME),
    "carl": _reviewer("carl", "controller", ACME),
    "sam (support)": _reviewer("sam", "support", ACME),
    "sales-bot (sales_manager)": _reviewer("sales-bot", "sales_manager", ACME),
    "finance-bot (controller)": _reviewer("finance-bot", "controller", ACME),
    "mallory of globex": _reviewer("mallory", "sales_manager", GLOBEX),
}
FIT: Final = "fit"

_EMAIL: Final = {
    "opportunity_id": "opp-17",
    "recipient": "ada@example.test",
    "subject": "Your quote for opp-17",
    "body": "Dear Ada, please find our quote attached.",
}
_PAYMENT: Final = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}
_RECIPIENT_VERIFIED: Final = EvidenceSubject(
    type="email_digest", id=email_digest(_EMAIL["recipient"])
)
_INVOICE_APPROVED: Final = EvidenceSubject(type="invoice", id=_PAYMENT["invoice_id"])
_CONTACTS: Final = [{"contact_id": "c-42"}, {"contact_id": "c-77"}, {"contact_id": "c-99"}]
#: Parameters most calls use: in the tasks' scope but for one per tool, so the same
#: operation id comes back with the same parameters, or other ones.
POOL: Final[dict[str, list[dict[str, Any]]]] = {
    "contact.read": _CONTACTS,
    "contact.verify_email": _CONTACTS,
    "consent.check": _CONTACTS,
    "invoice.check_approval": [{"invoice_id": "inv-9"}, {"invoice_id": "inv-10"}],
    "quote.propose": [
        {"opportunity_id": "opp-17", "amount_cents": 120_000, "currency": "EUR"},
        {"opportunity_id": "opp-17", "amount_cents": 99_000, "currency": "EUR"},
    ],
    "quote.prepare_send": [_EMAIL, {**_EMAIL, "subject": "Your revised quote"}],
    "payment.execute": [_PAYMENT, {**_PAYMENT, "amount_cents": 99_000}],
}
OPERATION_IDS: Final = (None, "op-1", "op-2", "op-3")
MALFORMED_OPERATION_IDS: Final = ("", "op 1", "o" * 200, 7)
LIMITS: Final = (None, 0, 1, 2, 20, 21, 25, 40)

#: The errors each step's method documents (Gateway.call, review, dispatch,
#: revoke_connection and restore_connection), exactly these classes. The operator's
#: budget command answers with its exit status instead.
DOCUMENTED: Final[dict[str, tuple[type[CapgateError], ...]]] = {
    "call": (InvalidInput, OperationConflict, CapabilityViolation),
    "propose": (InvalidInput, OperationConflict, CapabilityViolation),
    "review": (InvalidInput, UnknownProposal, CapabilityViolation),
    "dispatch": (UnknownProposal, CapabilityViolation),
    "connection": (UnknownConnection,),
    "budget": (),
    "reconcile": (),
}
#: Refusals the gateway finds after OPA's allow, while claiming the operation.
_AFTER_ALLOW: Final = {"budget_exhausted", "approval_used", "proposal_not_approved"}
#: How a proposal's status may change in one step.
_FORWARD: Final = {
    (ProposalStatus.PENDING, ProposalStatus.APPROVED),
    (ProposalStatus.PENDING, ProposalStatus.REJECTED),
    (ProposalStatus.PENDING, ProposalStatus.BLOCKED),
    (ProposalStatus.APPROVED, ProposalStatus.DISPATCHED),
    (ProposalStatus.APPROVED, ProposalStatus.BLOCKED),
}


_PHASES: Final = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def sequences() -> int:
    """Sequences per run: 100 with the default examples (about 15 s), more with more."""
    return max(1, examples() // 2)


# == the steps =======================================================================


@dataclass(frozen=True)
class Call:
    kind: str  # "call", or "propose" for a tool that needs review
    agent: str
    tool: str
    params: Any
    operation_id: Any
    plan: Plan


@dataclass(frozen=True)
class Review:
    #: The proposal: an index into the sequence's proposals, oldest first (None: an
    #: id that does not exist).
    proposal: int | None
    reviewer: str
    verdict: str
    ttl: timedelta | None
    kind: str = "review"


@dataclass(frozen=True)
class Dispatch:
    proposal: int | None
    plan: Plan
    kind: str = "dispatch"


@dataclass(frozen=True)
class Connection:
    tenant: str
    alias: str
    revoke: bool
    kind: str = "connection"


@dataclass(frozen=True)
class BudgetLimit:
    tenant: str
    task: str | None
    limit: int | None
    kind: str = "budget"


@dataclass(frozen=True)
class Reconcile:
    """What a service runs on a timer: stale operations marked, unknown ones looked up."""

    kind: str = "reconcile"


Step = Call | Review | Dispatch | Connection | BudgetLimit | Reconcile

_plans = st.builds(
    Plan,
    st.sampled_from(["conform"] * 8 + ["leak", "not_an_object", "refuse", "retry", "crash"]),
    st.one_of(secret_texts, secret_names),
    st.one_of(st.none(), st.floats(0, 60), st.just(float("nan"))),
)


class Menu:
    """The tools an agent may pick from, by kind of step (short in a failure's report)."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.tools = {
            kind: sorted(name for name, c in catalogue.tools.items() if c.needs_review == review)
            for kind, review in (("call", False), ("propose", True))
        }
        self.roles = {name: set(c.roles) for name, c in catalogue.tools.items()}
        self.contracts = catalogue.tools

    def __repr__(self) -> str:
        return f"Menu({self.tools})"


@dataclass(frozen=True)
class SoFar:
    """What a sequence has done so far, for drawing its next step."""

    proposals: int = 0
    calls: tuple[Call, ...] = ()
    #: Indexes of the proposals by status, for reviews and dispatches that fit them.
    pending: tuple[int, ...] = ()
    approved: tuple[int, ...] = ()
    #: Operations whose last run ended unknown (a reconcile may settle them).
    unknown: int = 0

    def __repr__(self) -> str:
        return (
            f"SoFar({self.proposals} proposals ({len(self.pending)} pending, "
            f"{len(self.approved)} approved), {len(self.calls)} calls)"
        )


@st.composite
def _steps(draw: st.DrawFn, menu: Menu, so_far: SoFar) -> Step:
    # Reviews weigh more while something is pending, dispatches while something is
    # approved: the life cycle gets somewhere, and every step still comes in any order.
    kinds = ["call", "propose"] * 3 + ["connection", "budget"]
    kinds += ["reconcile"] * (4 if so_far.unknown else 1)
    kinds += ["review"] * (6 if so_far.pending else 1)
    kinds += ["dispatch"] * (6 if so_far.approved else 1)
    kind = draw(st.sampled_from(kinds))
    if so_far.approved and kind in ("call", "propose") and draw(one_in(3)):
        # Few sequences reach an approval (a proposal needs its evidence about its own
        # subject, then a fitting reviewer): once one has, a dispatch comes sooner.
        kind = "dispatch"
    if kind in ("review", "dispatch") and not so_far.proposals and not draw(one_in(6)):
        kind = "propose"  # nothing to review yet
    if kind in ("call", "propose"):
        return draw(_calls(menu, so_far, kind))
    if kind in ("review", "dispatch"):
        # Mostly a proposal in the state the step fits (pending for a review, approved
        # for a dispatch), else any, latest first; rarely one that does not exist.
        fitting = so_far.pending if kind == "review" else so_far.approved
        choices = fitting if fitting and not draw(one_in(4)) else range(so_far.proposals)
        which = None
        if choices and not draw(one_in(10)):
            which = choices[len(choices) - 1 - draw(st.integers(0, len(choices) - 1))]
        if kind == "dispatch":
            return Dispatch(which, draw(_plans))
        reviewer = draw(st.sampled_from([FIT] * 8 + sorted(REVIEWERS)))
        verdict = draw(st.sampled_from(["approved"] * 6 + ["rejected", "rejected", "maybe"]))
        ttl = draw(
            st.sampled_from(
                [None] * 6
                + [timedelta(hours=1), timedelta(microseconds=1), timedelta(microseconds=1)]
                + [timedelta(0), timedelta(days=400)]
            )
        )
        return Review(which, reviewer, verdict, ttl)
    if kind == "reconcile":
        return Reconcile()
    if kind == "connection":
        tenant = draw(st.sampled_from([ACME, ACME, GLOBEX]))
        return Connection(tenant, draw(st.sampled_from([*ALIASES, "fax"])), draw(st.booleans()))
    tenant, task = draw(
        st.sampled_from([(ACME, None), (ACME, "task-pay"), (ACME, "task-quote"), (GLOBEX, None)])
    )
    return BudgetLimit(tenant, task, draw(st.sampled_from(LIMITS)))


@st.composite
def _calls(draw: st.DrawFn, menu: Menu, so_far: SoFar, kind: str) -> Call:
    """A call: often one made before again (its operation id with the same parameters,
    or other ones); else a tool of the agent's role, mostly, with parameters from the
    pool, mostly."""
    earlier = [call for call in so_far.calls if call.kind == kind]
    if earlier and draw(one_in(3)):
        again = earlier[len(earlier) - 1 - draw(st.integers(0, len(earlier) - 1))]
        params = again.params
        if draw(one_in(3)):
            params = draw(st.sampled_from(POOL[again.tool]))
        return Call(kind, again.agent, again.tool, params, again.operation_id, draw(_plans))
    agent = draw(st.sampled_from(["sales"] * 3 + ["finance"] * 2 + ["support", "globex sales"]))
    role = AGENTS[agent].principal.role
    granted = [name for name in menu.tools[kind] if role in menu.roles[name]]
    # Mostly a tool of the agent's role; sometimes any (a denial).
    tool = draw(st.sampled_from(granted if granted and not draw(one_in(5)) else menu.tools[kind]))
    contract = menu.contracts[tool]
    params = draw(st.sampled_from(POOL[tool]) if not draw(one_in(8)) else parameters(contract))
    operation_id = draw(
        st.sampled_from(MALFORMED_OPERATION_IDS)
        if draw(one_in(15))
        else st.sampled_from(OPERATION_IDS)
    )
    return Call(kind, agent, tool, params, operation_id, draw(_plans))


# == the lab: a real OPA, recording tools and decider, every log record ===============


class Lab:
    """What every sequence shares: the catalogue, OPA and the recorders."""

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
        self.menu = Menu(catalogue)
        self.tally = Tally("gateway life cycle", unit="sequences")
        self.reasons: Counter[str] = Counter()

    def world(self, draw: st.DrawFn) -> World:
        """A fresh store: acme's limit and the evidence its tasks have drawn."""
        # Evidence about what the calls of the pool are about: the quote's recipient
        # (by its digest, as contact.verify_email records it) and the paid invoice.
        quote_evidence: tuple[SeededEvidence, ...] = (
            "communication_permission",
            "current_quote_revision",
            ("verified_recipient", _RECIPIENT_VERIFIED),
        )

        def some(pieces: tuple[SeededEvidence, ...]) -> tuple[SeededEvidence, ...]:
            return tuple(piece for piece in pieces if not draw(one_in(4)))  # most of them

        connections = dict.fromkeys(ALIASES, "active")
        tenants = {
            ACME: TenantSeed(
                budget_class="unlimited",
                budget_limit=draw(st.sampled_from([None, 100, 25, 21, 1])),
                connections=connections,
                evidence={
                    "task-quote": some(quote_evidence),
                    "task-pay": some((("invoice_approved", _INVOICE_APPROVED),)),
                },
            ),
            GLOBEX: TenantSeed(
                budget_class="unlimited",
                connections=connections,
                evidence={"task-quote": some(quote_evidence)},
            ),
        }
        credentials = {
            (tenant, alias): draw(secret_credentials) for tenant in tenants for alias in ALIASES
        }
        return World(
            self.base,
            self.catalogue,
            self.decider,
            self.provider,
            tenants=tenants,
            credentials=credentials,
            observer=self.events.append,
        )


@dataclass
class Mark:
    """Where the recorders and the store stood before a step."""

    logs: int
    events: int
    entries: int
    lookups: int
    executes: int
    reviews: int
    seq: int
    budgets: dict[tuple[str, str | None], BudgetState]
    dispatched: set[str]


@dataclass
class Done:
    """What a step came to."""

    value: Any = None
    error: CapgateError | None = None
    entry: Entry | None = None
    lookups: list[Lookup] = field(default_factory=list)
    rows: list[LedgerRow] = field(default_factory=list)

    @property
    def outcome(self) -> Outcome | None:
        return self.value if isinstance(self.value, Outcome) else None


class LifeCycle:
    """One sequence: its world, the steps so far, and the checks after each."""

    def __init__(self, lab: Lab, world: World) -> None:
        self.lab = lab
        self.world = world
        self.store = world.store
        self.gateway = world.gateway
        self.steps: list[Step] = []
        #: The ids of the proposals made so far, oldest first.
        self.proposals: list[str] = []
        self.statuses: dict[str, ProposalStatus] = {}
        #: (tenant, operation id) -> the outcome statuses of the runs so far
        self.runs: dict[tuple[str, str], list[OutcomeStatus]] = {}
        self.credentials = planted(list(world.credentials.values()))
        self.secrets: set[str] = set(self.credentials)

    def so_far(self) -> SoFar:
        calls = tuple(step for step in self.steps if isinstance(step, Call))
        by_status = [self.statuses[proposal] for proposal in self.proposals]
        return SoFar(
            len(self.proposals),
            calls,
            pending=tuple(i for i, s in enumerate(by_status) if s is ProposalStatus.PENDING),
            approved=tuple(i for i, s in enumerate(by_status) if s is ProposalStatus.APPROVED),
            unknown=sum(1 for runs in self.runs.values() if runs[-1] is OutcomeStatus.UNKNOWN),
        )

    # -- running a step -----------------------------------------------------------------

    def proposal_id(self, which: int | None) -> str:
        return "prop-does-not-exist" if which is None else self.proposals[which]

    def reviewer(self, step: Review) -> Reviewer:
        if step.reviewer != FIT:
            return REVIEWERS[step.reviewer]
        if step.proposal is None:
            return REVIEWERS["maria"]
        with self.store.transaction(read_only=True) as tx:
            proposal = tx.get_proposal(self.proposal_id(step.proposal))
        assert proposal is not None
        reviewers = self.lab.catalogue.tools[proposal.tool].reviewers
        return next(
            (
                p
                for p in REVIEWERS.values()
                if p.tenant == proposal.tenant
                and p.role in reviewers
                and p.id != proposal.proposer.agent
            ),
            REVIEWERS["maria"],
        )

    def act(self, step: Step) -> Any:
        if isinstance(step, Call):
            return self.gateway.call(
                AGENTS[step.agent], step.tool, step.params, operation_id=step.operation_id
            )
        if isinstance(step, Review):
            return self.gateway.review(
                self.proposal_id(step.proposal), self.reviewer(step), step.verdict, ttl=step.ttl
            )
        if isinstance(step, Dispatch):
            return self.gateway.dispatch(self.proposal_id(step.proposal))
        if isinstance(step, Reconcile):
            return self.gateway.reconcile()
        if isinstance(step, Connection):
            change = (
                self.gateway.revoke_connection if step.revoke else self.gateway.restore_connection
            )
            return change(step.tenant, step.alias, by="ops")
        limit = ["--unlimited"] if step.limit is None else [str(step.limit)]
        task = [] if step.task is None else ["--task", step.task]
        command = ["budget", "set", step.tenant, *limit, *task, "--by", "ops"]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            status = capgate_cli([*command, "--store", str(self.world.path)])
        assert status == 0, f"capgate {' '.join(command)} exited {status}"
        return status

    def run(self, step: Step) -> str:
        """Run one step and check everything after it; return the path it took."""
        self.steps.append(step)
        lab = self.lab
        lab.provider.plan = step.plan if isinstance(step, Call | Dispatch) else Plan()
        mark = Mark(
            logs=len(lab.logs.lines),
            events=len(lab.events),
            entries=len(lab.provider.entered),
            lookups=len(lab.provider.lookups),
            executes=len(lab.decider.executes),
            reviews=len(lab.decider.reviews),
            seq=self._last_seq(),
            budgets=self._budgets(),
            dispatched={p for p, s in self.statuses.items() if s is ProposalStatus.DISPATCHED},
        )
        done = Done()
        try:
            done.value = self.act(step)
        except CapgateError as exc:
            done.error = exc
        except Exception as exc:
            pytest.fail(
                f"{self._where()} raised {type(exc).__name__}, which is outside "
                "capgate.gateway.errors:\n" + "".join(traceback.format_exception(exc))
            )
        entries = lab.provider.entered[mark.entries :]
        assert len(entries) <= 1, f"{self._where()}: the provider was entered {len(entries)} times"
        done.entry = entries[0] if entries else None
        done.lookups = lab.provider.lookups[mark.lookups :]
        done.rows = self.store.ledger(after_seq=mark.seq)
        return self.check(step, done, mark)

    def _where(self) -> str:
        shown = "\n".join(f"  {n}. {s!r}" for n, s in enumerate(self.steps, 1))
        return f"after the steps\n{shown}\n"

    def _last_seq(self) -> int:
        rows = self.store.ledger()
        return rows[-1].seq if rows else 0

    def _budgets(self) -> dict[tuple[str, str | None], BudgetState]:
        states: dict[tuple[str, str | None], BudgetState] = {}
        with self.store.transaction(read_only=True) as tx:
            for tenant in (ACME, GLOBEX):
                states[(tenant, None)] = tx.budget(tenant)
                for task in TASKS:
                    state = tx.budget(tenant, task)
                    if state.task_id is not None:  # the task has a limit of its own
                        states[(tenant, task)] = state
        return states

    # -- the checks ---------------------------------------------------------------------

    def check(self, step: Step, done: Done, mark: Mark) -> str:
        where = self._where()
        error, outcome = done.error, done.outcome

        # 1. only documented errors, with short messages
        if error is not None:
            assert type(error) in DOCUMENTED[step.kind], (
                f"{where}{type(error).__name__} [{error.code}] is not among the errors "
                f"{step.kind} documents: {error}"
            )
            assert len(str(error)) <= MESSAGE_CAP, f"{where}a {len(str(error))}-character message"

        executes = self.lab.decider.executes[mark.executes :]
        if done.entry is not None:
            path = self._check_run(step, done, executes, where)
        elif outcome is not None:
            path = self._check_outcome_without_run(step, done, mark, where)
        elif isinstance(done.value, ProposalRecord):
            path = self._check_proposed(step, done, executes, where)
        elif error is not None:
            path = error.code
        else:
            path = "done"
        if isinstance(error, CapabilityViolation):
            self._check_denial(step, done, executes, mark, where)
        if isinstance(step, Connection) and error is None:
            path = "revoked" if step.revoke else "restored"
        if isinstance(step, Review) and error is None:
            path = str(ReviewVerdict(step.verdict))
        if isinstance(step, BudgetLimit):
            path = "set"
        if isinstance(step, Reconcile):
            path = self._check_reconcile(done, executes, where)

        self._check_budgets(mark, where)
        self._check_proposals(mark, where)
        report = self.store.verify_ledger()
        assert report.ok, f"{where}the ledger does not verify: {report.problem}"
        self._check_secrets(step, done, mark, where)
        return path

    def _check_run(
        self,
        step: Step,
        done: Done,
        executes: list[tuple[ExecuteInput, ExecuteDecision]],
        where: str,
    ) -> str:
        """The provider was entered: for an allow of this very call, once per operation."""
        entry = done.entry
        assert entry is not None
        assert isinstance(step, Call | Dispatch), f"{where}{entry.name} entered by a {step.kind}"
        assert executes, f"{where}{entry.name} entered without asking OPA"
        request, decision = executes[-1]
        assert decision.allow, f"{where}{entry.name} entered after a deny"
        assert decision.catalogue_digest == self.lab.expected_digest
        stage = Stage.DISPATCH if isinstance(step, Dispatch) else Stage.CALL
        assert request.stage is stage, f"{where}{entry.name} entered at stage {request.stage}"
        contract = self.lab.catalogue.tools[request.call.tool]
        action = contract.dispatch_action if stage is Stage.DISPATCH else contract.name
        assert entry.name == action, f"{where}OPA allowed {action}, {entry.name} ran"
        assert digest_of(canonical_json(entry.params)) == request.call.params_digest
        context, tenant = entry.context, request.principal.tenant
        assert (context.tenant, context.operation_id) == (tenant, request.call.operation_id)
        keyed = contract.idempotency is Idempotency.IDEMPOTENT_WITH_KEY
        assert context.idempotency_key == (request.call.operation_id if keyed else None)
        alias = contract.connection_alias
        if alias is not None:
            assert context.credential is not None, f"{where}{entry.name} ran without its secret"
            assert context.credential.reveal() == self.world.credentials[(tenant, alias)]
            assert context.account == account_of(tenant, alias)

        # The intent was recorded, under this allow, before the body was entered.
        assert entry.ledger, f"{where}{entry.name} entered with no ledger row for its operation"
        intent = entry.ledger[-1]
        assert (intent.kind, intent.outcome) == ("intent", "running"), (
            f"{where}{entry.name} entered after the ledger row {intent.kind}/{intent.outcome}"
        )
        assert intent.decision_id is not None
        assert intent.decision_id == decision.decision_id, f"{where}intent under another decision"
        assert intent.tool == contract.name
        if stage is Stage.DISPATCH:
            assert request.proposal is not None
            dispatched = [
                row
                for row in entry.ledger
                if (row.kind, row.outcome, row.proposal_id)
                == ("dispatch", "dispatched", request.proposal.id)
            ]
            assert len(dispatched) == 1, f"{where}{len(dispatched)} dispatched rows before the run"
            assert dispatched[0].seq < intent.seq

        # A tool that ran answers with an Outcome.
        assert done.error is None, f"{where}{entry.name} ran, then {done.error!r} came back"
        outcome = done.outcome
        assert outcome is not None, f"{where}{entry.name} ran, then {done.value!r} came back"
        assert outcome.operation_id == context.operation_id

        # Entered again only while a repeat is safe.
        runs = self.runs.setdefault((tenant, context.operation_id), [])
        if runs:
            last = runs[-1]
            looked_up = any(
                (lookup.operation_id, lookup.found) == (context.operation_id, False)
                for lookup in done.lookups
            )
            has_lookup = self.lab.provider.has_lookup(action)
            safe = contract.idempotency is not Idempotency.NOT_IDEMPOTENT
            assert last is OutcomeStatus.RETRYABLE or (
                last is OutcomeStatus.UNKNOWN and (safe or has_lookup)
            ), f"{where}operation {context.operation_id} ran again after {last.value}"
            assert looked_up or not has_lookup, (
                f"{where}operation {context.operation_id} ran again without a lookup first"
            )
        runs.append(outcome.status)
        return outcome.status.value

    def _check_reconcile(
        self, done: Done, executes: list[tuple[ExecuteInput, ExecuteDecision]], where: str
    ) -> str:
        """Looking is not acting: nothing entered, OPA not asked; each operation looked
        up is settled by what the provider has (its effect: success; none: retryable)
        or, for an answer that settles nothing, left unknown."""
        assert done.entry is None, f"{where}a reconcile entered {done.entry}"
        assert not executes, f"{where}a reconcile asked OPA {len(executes)} execute question(s)"
        with self.store.transaction(read_only=True) as tx:
            for lookup in done.lookups:
                assert lookup.tenant is not None
                stored = tx.get_operation(lookup.tenant, lookup.operation_id)
                assert stored is not None, f"{where}looked up {lookup.operation_id}, not stored"
                status = OutcomeStatus((stored.outcome or {}).get("status"))
                expected = (
                    {OutcomeStatus.SUCCESS, OutcomeStatus.UNKNOWN}
                    if lookup.found
                    else {OutcomeStatus.RETRYABLE}
                )
                assert status in expected, (
                    f"{where}{lookup.operation_id} looked up (found: {lookup.found}), now {status}"
                )
                if status is not OutcomeStatus.UNKNOWN:
                    self.runs.setdefault((lookup.tenant, lookup.operation_id), []).append(status)
        rows = [row for row in done.rows if row.kind == "lookup"]
        assert len(rows) == len(done.lookups), (
            f"{where}{len(rows)} rows, {len(done.lookups)} lookups"
        )
        return f"looked up {len(done.lookups)}" if done.lookups else "nothing to look up"

    def _check_outcome_without_run(self, step: Step, done: Done, mark: Mark, where: str) -> str:
        """An Outcome, but nothing ran: the lookup found the effect, or a duplicate."""
        outcome = done.outcome
        assert outcome is not None
        assert isinstance(step, Call | Dispatch), f"{where}an outcome from a {step.kind}"
        found = [lookup for lookup in done.lookups if lookup.found]
        tenant = (
            AGENTS[step.agent].tenant
            if isinstance(step, Call)
            else self._proposal(step.proposal).tenant
        )
        if found:
            assert found[-1].operation_id == outcome.operation_id
            self.runs.setdefault((tenant, outcome.operation_id), []).append(outcome.status)
            return "looked up"
        with self.store.transaction(read_only=True) as tx:
            stored = tx.get_operation(tenant, outcome.operation_id)
        assert stored is not None, f"{where}an outcome of an operation the store lacks"
        assert stored.outcome is not None
        assert Outcome.model_validate(stored.outcome) == outcome, f"{where}not the first outcome"
        duplicate = [
            row
            for row in done.rows
            if (row.kind, row.operation_id) == ("duplicate", outcome.operation_id)
        ]
        again = isinstance(step, Dispatch) and self.proposal_id(step.proposal) in mark.dispatched
        assert duplicate or again, f"{where}an outcome without a run, a lookup or a duplicate"
        return "duplicate"

    def _check_proposed(
        self,
        step: Step,
        done: Done,
        executes: list[tuple[ExecuteInput, ExecuteDecision]],
        where: str,
    ) -> str:
        """A call of a tool that needs review: a proposal, allowed at stage propose."""
        proposal = done.value
        assert isinstance(proposal, ProposalRecord)
        assert isinstance(step, Call), f"{where}a proposal from a {step.kind}"
        assert self.lab.catalogue.tools[step.tool].needs_review
        assert executes, f"{where}proposed without asking OPA"
        request, decision = executes[-1]
        assert decision.allow, f"{where}proposed after a deny"
        assert request.stage is Stage.PROPOSE, f"{where}proposed at stage {request.stage}"
        assert (proposal.tool, proposal.operation_id, proposal.params_digest) == (
            request.call.tool,
            request.call.operation_id,
            request.call.params_digest,
        )
        assert proposal.tenant == request.principal.tenant
        if proposal.id in self.proposals:  # the same operation and call, proposed again
            assert not [row for row in done.rows if row.kind == "proposal"]
            return "proposed again"
        assert proposal.status is ProposalStatus.PENDING
        assert proposal.decision_id == decision.decision_id
        rows = [(row.kind, row.outcome) for row in done.rows if row.proposal_id == proposal.id]
        assert rows == [("proposal", "pending")], f"{where}{rows}"
        self.proposals.append(proposal.id)
        return "proposed"

    def _check_denial(
        self,
        step: Step,
        done: Done,
        executes: list[tuple[ExecuteInput, ExecuteDecision]],
        mark: Mark,
        where: str,
    ) -> None:
        """A CapabilityViolation carries the reasons of the policy's deny, or of a
        refusal found after an allow (recorded as such)."""
        error = done.error
        assert isinstance(error, CapabilityViolation)
        codes = set(error.reason_codes)
        self.lab.reasons.update(codes)
        if isinstance(step, Review):
            reviews = self.lab.decider.reviews[mark.reviews :]
            assert reviews, f"{where}a review refused without asking OPA"
            decision = reviews[-1][1]
            assert not decision.allow, f"{where}a review refused after OPA allowed it"
            assert codes == {reason.code for reason in decision.reasons}
            refused = [
                row
                for row in done.rows
                if (row.kind, row.outcome) == ("review", "refused")
                and set(row.reason_codes) == codes
            ]
            assert refused, f"{where}a refused review the ledger does not record"
            return
        assert executes, f"{where}denied without asking OPA"
        _, decision = executes[-1]
        if not decision.allow:
            assert codes == {reason.code for reason in decision.reasons}
        else:
            assert codes <= _AFTER_ALLOW, f"{where}{codes} refused after an allow"
        denials = [
            row
            for row in done.rows
            if row.kind == "decision" and row.outcome == "deny" and set(row.reason_codes) == codes
        ]
        assert denials, f"{where}a denial the ledger does not record"

    def _proposal(self, which: int | None) -> ProposalRecord:
        with self.store.transaction(read_only=True) as tx:
            found = tx.get_proposal(self.proposal_id(which))
        assert found is not None
        return found

    def _check_budgets(self, mark: Mark, where: str) -> None:
        """Each operation is charged once, by what is known of it now: a success has
        spent its cost, an unknown one still holds its reservation (until a lookup
        settles it), and nothing else holds or spends anything between steps; a
        reservation fits the limit."""
        after = self._budgets()
        spent: dict[tuple[str, str | None], int] = {}
        held: dict[tuple[str, str | None], int] = {}
        operations = {
            (row.tenant, row.operation_id)
            for row in self.store.ledger()
            if row.kind == "intent" and row.tenant is not None and row.operation_id is not None
        }
        with self.store.transaction(read_only=True) as tx:
            for tenant, operation_id in operations:
                operation = tx.get_operation(tenant, operation_id)
                assert operation is not None, f"{where}operation {operation_id} vanished"
                assert operation.status is OperationStatus.DONE, (
                    f"{where}operation {operation_id} is still running between steps"
                )
                status = (operation.outcome or {}).get("status")
                cost = self.lab.catalogue.tools[operation.tool].cost_units
                into = spent if status == "success" else held if status == "unknown" else None
                if into is None:
                    assert not operation.reserved, f"{where}{operation_id} ({status}) holds budget"
                    continue
                for key in {(tenant, None), (tenant, operation.task_id)}:
                    into[key] = into.get(key, 0) + cost
        for (tenant, task), state in after.items():
            whose = f"{tenant}" + (f" task {task}" if task else "")
            assert state.reserved == held.get((tenant, task), 0), (
                f"{where}{state.reserved} units of {whose} reserved, "
                f"{held.get((tenant, task), 0)} held by unknown outcomes"
            )
            used = state.spent + state.reserved
            before = mark.budgets.get((tenant, task))
            if before is not None and used > before.spent + before.reserved:
                assert state.limit is None or used <= state.limit, (
                    f"{where}{whose} spent {state.spent} + reserved {state.reserved} "
                    f"past its limit {state.limit}"
                )
            cost = spent.get((tenant, task), 0)
            assert state.spent == cost, f"{where}{whose} spent {state.spent}, charged {cost}"

    def _check_proposals(self, mark: Mark, where: str) -> None:
        """Forward only; dispatched once, after an approval by another of its tenant."""
        ledger = self.store.ledger()
        with self.store.transaction(read_only=True) as tx:
            proposals = tx.list_proposals()
            reviews = {proposal.id: tx.reviews(proposal.id) for proposal in proposals}
        for proposal in proposals:
            before = self.statuses.get(proposal.id)
            if before is not None and before is not proposal.status:
                assert (before, proposal.status) in _FORWARD, (
                    f"{where}proposal {proposal.id} went from {before} to {proposal.status}"
                )
            self.statuses[proposal.id] = proposal.status
            consumed = [r for r in reviews[proposal.id] if r.consumed_at is not None]
            rows = [row for row in ledger if row.proposal_id == proposal.id]
            dispatched = [r for r in rows if (r.kind, r.outcome) == ("dispatch", "dispatched")]
            if proposal.status is not ProposalStatus.DISPATCHED:
                assert not consumed, f"{where}{proposal.status} proposal with a used approval"
                assert not dispatched, f"{where}{proposal.status} proposal with a dispatched row"
                continue
            assert len(consumed) == 1, f"{where}dispatched on {len(consumed)} approvals"
            assert len(dispatched) == 1, f"{where}dispatched {len(dispatched)} times"
            review = consumed[0]
            contract = self.lab.catalogue.tools[proposal.tool]
            assert review.verdict is ReviewVerdict.APPROVED
            assert review.reviewer.id != proposal.proposer.agent, f"{where}self-approved"
            assert review.reviewer.tenant == proposal.tenant, f"{where}approved by another tenant"
            assert review.reviewer.role in contract.reviewers, f"{where}approved by a non-reviewer"
            approvals = [
                row
                for row in rows
                if (row.kind, row.outcome) == ("review", "approved")
                and row.detail.get("review") == review.id
                and row.seq < dispatched[0].seq
            ]
            assert len(approvals) == 1, f"{where}no approving review row before the dispatch"

    def _check_secrets(self, step: Step, done: Done, mark: Mark, where: str) -> None:
        """No planted secret where it must not be; no credential anywhere."""
        if isinstance(step, Call):
            self.secrets |= planted(step.params, step.plan)
        elif isinstance(step, Dispatch):
            self.secrets |= planted(step.plan)
        lab = self.lab
        texts = lab.logs.lines[mark.logs :] + [repr(event) for event in lab.events[mark.events :]]
        if done.error is not None:
            texts.append("".join(traceback.format_exception(done.error)))
        outcome = done.outcome
        if outcome is not None and outcome.error is not None:
            texts.append(outcome.error)
        texts.extend(ledger_text(row) for row in done.rows)
        leak = leak_in(self.secrets, texts)
        assert leak is None, f"{where}secret {leak[0]} leaked into:\n{leak[1][:2000]}"
        returned = repr(done.value) + (outcome.model_dump_json() if outcome else "")
        leak = leak_in(self.credentials, [returned])
        assert leak is None, f"{where}credential {leak[0]} came back in:\n{leak[1][:2000]}"
        problem = self.world.audit(self.secrets, self.credentials)
        assert problem is None, f"{where}{problem}"


# == the property ====================================================================


@pytest.fixture(scope="module")
def lab(
    sales_catalogue: Catalogue,
    sales_sidecar: PolicySidecar,
    log_capture: LogCapture,
    tmp_path_factory: pytest.TempPathFactory,
) -> Lab:
    return Lab(sales_catalogue, sales_sidecar, log_capture, tmp_path_factory.mktemp("worlds"))


def test_gateway_life_cycle(lab: Lab) -> None:
    """Calls, proposals, reviews, dispatches, revocations and budget changes in any
    order keep every promise of the life cycle after every step."""
    tally = lab.tally

    # No "explain" phase: it replays a failing sequence many times over to say which
    # draws matter; the shrunk steps are report enough.
    @settings(fuzz_settings(), max_examples=sequences(), phases=_PHASES)
    @given(st.data())
    def run(data: st.DataObject) -> None:
        lab.provider.reset()
        lab.decider.clear()
        lab.events.clear()
        lab.logs.lines.clear()
        with lab.world(data.draw) as world:
            lab.provider.world = world
            try:
                life = LifeCycle(lab, world)
                for _ in range(MAX_STEPS):
                    step = data.draw(_steps(lab.menu, life.so_far()))
                    tally.note(f"{step.kind} {life.run(step)}")
                    tally.steps += 1
                    # Mostly on; stopping early is what a failure shrinks towards.
                    if data.draw(st.sampled_from(["stop"] + ["more"] * 14)) == "stop":
                        break
            finally:
                lab.provider.world = None
        tally.examples += 1

    run()
    # The paths every seed reaches (checked over many); the rest are printed.
    tally.finish(
        "call success",
        "call capability_denied",
        "propose proposed",
        "propose capability_denied",
        "review approved",
        "review capability_denied",
        "dispatch success",
        "dispatch capability_denied",
        "connection revoked",
        "connection restored",
        "budget set",
        more=[
            "gateway life cycle, denials by reason: "
            + ", ".join(f"{code} {count}" for code, count in sorted(lab.reasons.items()))
        ],
    )
