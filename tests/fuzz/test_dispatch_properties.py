"""Property-based fuzzing of the dispatcher against the real OPA and the real policies.

Hypothesis draws parameters, facts and identifiers (tool names, operation ids,
evidence, approvals) and feeds them to ``Dispatcher.call``, ``Dispatcher.compose``
and ``AgentSession.call_tool``, with an embedded OPA serving the real Rego policies
and the sales demo catalogue, and tool bodies (``InProcessTools``) that record being
entered. Every example, whatever it drew, must keep the promises of
``docs/security.md``:

1. **Only capgate's errors.** Nothing comes back but an ``Outcome`` (a result dict
   from a session) or a :class:`gateway.errors.CapgateError`.
2. **No tool without an allow.** A tool body is entered only when OPA's answer to
   that very call was an allow (both the answer the real policy client returned and
   the dispatcher's own ``DecisionEvent`` say so), at most once, with exactly the
   parameters whose digest OPA judged; a tool that was entered always yields an
   Outcome, and an Outcome means it was entered.
3. **No secret in logs, errors or outcomes.** Secret-looking values placed in
   parameter values, facts (tenant, role, task type, subjects and other linked
   resources, environment, budget class, evidence, who approved) and tool output
   never appear in any log record of any logger (captured at DEBUG by a handler on
   the root logger: message, arguments and exception text), in an exception's text
   (its whole chain, as a traceback prints it), in ``Outcome.error``, or in a
   ``DecisionEvent``. Names are logged by design (tool names, operation ids,
   connection aliases, parameter names), so no secret is put there.
4. **Short messages.** capgate's exception messages stay within
   :data:`MESSAGE_CAP` characters and ``Outcome.error`` within
   :data:`TOOL_TEXT_CAP`, however long the inputs.

Each property also counts the paths its examples took and asserts that the
interesting ones were reached (allows that ran, denials, refusals of bad input), so
no property can pass by never getting anywhere. Example counts, seeds and the longer
run: :mod:`tests.fuzz.runs`.

What these tests rely on, so they are easy to adapt when the dispatcher changes:
``Dispatcher(catalogue, decider, registry, observer=...)`` with ``call(facts, tool,
params, operation_id=, approval=, evidence=)`` and ``compose(facts)``; the decider
protocol (``compose(facts)``, ``execute(ExecuteInput)``), wrapped here to record
the real client's answers; ``DecisionEvent.kind/allow/tool``; ``Outcome`` and
``ToolFailed.outcome``; ``AgentSession(dispatcher, facts)`` when it exists (the
session cases are skipped, and the summary says so, when it does not);
``InProcessTools`` and ``current_call()``; the catalogue's contract fields. Calls
are made allowable from the caller's facts alone; the seams for the facts that
move into the gateway's store under issue #7 are :func:`allowing_facts`,
:func:`approval_for`, :func:`store_facts` and :func:`runs_when_allowed`.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import re
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.in_process import InProcessTools, current_call
from gateway.digest import MAX_PARAMS_BYTES, canonical_json, digest_of, params_digest
from gateway.dispatch.dispatcher import DecisionEvent, Dispatcher
from gateway.dispatch.registry import ToolRegistry
from gateway.dispatch.transport import CallContext
from gateway.errors import (
    CapabilityViolation,
    CapgateError,
    InvalidInput,
    ObligationUnsupported,
    ToolFailed,
)
from gateway.model.contracts import ApprovalKind, Catalogue, Idempotency, ToolContract
from gateway.model.decisions import ComposeDecision, ExecuteDecision
from gateway.model.facts import Approval, ComposeInput, ExecuteInput
from gateway.model.outcomes import Outcome, ToolRefused, ToolRetryable
from gateway.opa.client import PolicyClient
from gateway.opa.sidecar import PolicySidecar
from tests.fuzz.runs import RESULTS, examples, fuzz_settings, load_project_code

load_project_code()  # the same examples alone and in the whole suite (tests/fuzz/runs.py)

# The agent-side session of the committed API (``AgentSession(dispatcher, facts)``);
# issue #7 moves it onto the store-backed Gateway. Without it the session cases are
# skipped and reported, not silently dropped (see test_identifiers).
try:
    AgentSession: Any = importlib.import_module("gateway.dispatch.agent").AgentSession
except ImportError:  # pragma: no cover - depends on the dispatcher's version
    AgentSession = None

pytestmark = [
    pytest.mark.integration,
    # About 0.02 s an example; room for a slow machine and for CAPGATE_FUZZ_EXAMPLES.
    pytest.mark.timeout(max(120, examples() // 10)),
]

#: The longest exception message capgate may produce (docs/security.md): every
#: caller-supplied value is quoted through ``gateway.errors.quote`` (80 characters
#: and its length) and composite messages are cut, so a few hundred characters is
#: usual; 1,000 is the promise.
MESSAGE_CAP: Final = 1_000
#: A tool's own error text is kept in ``Outcome.error`` cut to 2,000 characters,
#: after the exception's type name and followed by the "… (N characters)" note.
TOOL_TEXT_CAP: Final = 2_000 + 120

#: Below this many examples a run is a smoke run: the path counts are not asserted.
_COVERAGE_MIN_EXAMPLES: Final = 100
#: The facts' identifier rule (gateway.model.facts.Identifier).
_IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}")


# == secrets =========================================================================


def _token(n: int) -> str:
    """24 hex digits, distinctive even for n = 0 (hypothesis' favourite number)."""
    return hashlib.sha256(f"capgate-fuzz-secret-{n}".encode()).hexdigest()[:24]


_SECRET_SHAPES: Final = (
    "Bearer sk_live_{}",
    "password={}",
    "-----BEGIN PRIVATE KEY-----\nMII{}\n-----END PRIVATE KEY-----",
    "postgres://admin:{}@db.internal/prod",
    "Hello,\nyour one-time code is {}.\nRegards",
)
#: A secret token, wherever it hides in a text.
_TOKEN_RE: Final = re.compile(r"(?:sk_live_|password=|MII|admin:|code is )([0-9a-f]{24})")

#: Secret-looking names (letters, digits, _): valid wherever an identifier is.
secret_names = st.integers(0, 2**32).map(lambda n: f"sk_live_{_token(n)}")
#: Secret-looking text of other shapes, for free text (and for refusals).
secret_texts = st.builds(
    lambda n, shape: shape.format(_token(n)), st.integers(0, 2**32), st.sampled_from(_SECRET_SHAPES)
)
#: A secret inside an otherwise valid email address.
secret_emails = st.integers(0, 2**32).map(lambda n: f"sk_live_{_token(n)}@example.test")


def planted(*values: Any) -> set[str]:
    """The secret tokens held anywhere in ``values`` (walked, including model fields)."""
    found: set[str] = set()
    stack = list(values)
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.update(_TOKEN_RE.findall(str.__str__(item)))
        elif isinstance(item, dict):
            stack.extend(dict.items(item))
        elif isinstance(item, list | tuple):
            stack.extend(list.copy(item) if isinstance(item, list) else tuple.__iter__(item))
        elif isinstance(item, ComposeInput | Approval):
            stack.append(item.model_dump(mode="json"))
        elif isinstance(item, Plan):
            stack.append(item.secret)
    return found


# == the rig: a real OPA, recording tools and decider, every log record ==============


@dataclass(frozen=True)
class Entry:
    """One time a tool body was entered."""

    name: str
    params: dict[str, Any]
    context: CallContext


class RecordingDecider:
    """The real policy client; each answer it returned is kept for the checks."""

    def __init__(self, client: PolicyClient) -> None:
        self.client = client
        self.composes: list[ComposeDecision] = []
        self.executes: list[tuple[ExecuteInput, ExecuteDecision]] = []

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        decision = self.client.compose(facts)
        self.composes.append(decision)
        return decision

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        decision = self.client.execute(facts)
        self.executes.append((facts, decision))
        return decision


class LogCapture(logging.Handler):
    """Every record of every logger, formatted as a log file would hold it."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # format() adds exc_info and stack_info; the raw arguments go in too.
        self.lines.append(f"{self.format(record)}\nargs={record.args!r}")


@pytest.fixture(scope="module")
def log_capture() -> Iterator[LogCapture]:
    """A DEBUG handler on the root logger, with every logger made to reach it."""
    handler = LogCapture()
    root = logging.getLogger()
    loggers = [
        logger for logger in root.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    saved = [(logger, logger.level, logger.propagate) for logger in loggers]
    saved_root, saved_disable = root.level, root.manager.disable
    logging.disable(logging.NOTSET)
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    for logger in loggers:
        logger.setLevel(logging.NOTSET)  # effective level: the root's DEBUG
        logger.propagate = True
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_root)
        logging.disable(saved_disable)
        for logger, level, propagate in saved:
            logger.setLevel(level)
            logger.propagate = propagate


class Plan:
    """What the tool body does once entered: return something, or fail some way.

    Tool output may hold secrets (it is the tool's data); capgate must not copy
    them into ``Outcome.error``. The tool's own error texts hold none: what a tool
    writes into its own exception is its business, and ``Outcome.error`` keeps it.
    """

    KINDS: Final = (
        "conform",
        "conform",
        "conform",
        "leak",
        "not_an_object",
        "too_deep",
        "refuse",
        "retry",
        "crash",
        "unprintable",
    )

    def __init__(self, kind: str = "conform", secret: str = "", retry_after: Any = None) -> None:
        self.kind = kind
        self.secret = secret
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"Plan({self.kind!r})"

    def act(self, contract: ToolContract | None) -> Any:
        output = example_of(contract.output_schema) if contract else {}
        if self.kind == "leak":  # every string the schema has room for, and one more
            if isinstance(output, dict):
                output = {k: self.secret if isinstance(v, str) else v for k, v in output.items()}
                output["note"] = self.secret
            return output
        if self.kind == "not_an_object":
            return [self.secret]
        if self.kind == "too_deep":
            deep: Any = self.secret
            for _ in range(80):
                deep = {"d": deep}
            return {**(output if isinstance(output, dict) else {}), "deep": deep}
        if self.kind == "refuse":
            raise ToolRefused("the provider refused: " + "r" * 5_000)
        if self.kind == "retry":
            raise ToolRetryable("try later", retry_after_seconds=self.retry_after)
        if self.kind == "crash":
            raise RuntimeError("the tool crashed: " + "c" * 10_000)
        if self.kind == "unprintable":
            raise _Unprintable
        return output


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def example_of(schema: Any) -> Any:
    """A minimal value that fits the simple schemas of the demo catalogue's outputs."""
    if not isinstance(schema, dict):
        return {}
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: example_of(properties.get(name, {})) for name in schema.get("required", [])}
    if kind == "string":
        if schema.get("format") == "email":
            return "ada@example.test"
        return "x" * max(1, schema.get("minLength", 1))
    if kind == "integer":
        return max(1, schema.get("minimum", 1))
    return {"number": 1.5, "boolean": True, "array": [], "null": None}.get(kind, "x")


class Rig:
    """One dispatcher over the real OPA, with recording tools, decider and logs."""

    def __init__(self, catalogue: Catalogue, sidecar: PolicySidecar, logs: LogCapture) -> None:
        self.catalogue = catalogue
        self.expected_digest = sidecar.expected_digest
        self.logs = logs
        self.decider = RecordingDecider(sidecar.client)
        self.entered: list[Entry] = []
        self.events: list[DecisionEvent] = []
        self.plan = Plan()
        #: The session of a "session" case, for the Outcome behind its result dict.
        self.session: Any = None
        tools = InProcessTools()
        for name in sorted(runnable_names(catalogue)):
            tools.register(name, "records being entered", self._body(name))
        self.dispatcher = Dispatcher(
            catalogue, self.decider, ToolRegistry(tools), observer=self.events.append
        )

    def _body(self, name: str) -> Callable[..., Any]:
        contract = self.catalogue.tools.get(name)

        def body(**params: Any) -> Any:
            self.entered.append(Entry(name, params, current_call()))
            return self.plan.act(contract)

        return body

    def run(self, case: Case) -> Result:
        """Run one case; anything outside capgate's hierarchy fails the property."""
        self.entered.clear()
        self.events.clear()
        self.decider.composes.clear()
        self.decider.executes.clear()
        self.logs.lines.clear()
        self.plan = case.plan
        self.session = None
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
        return Result(value, error, outcome)


def runnable_names(catalogue: Catalogue) -> set[str]:
    """The tools, and (once the catalogue names them) the actions that execute them."""
    extra = getattr(catalogue, "runnable_names", None)
    return set(catalogue.tools) | (set(extra()) if callable(extra) else set())


@dataclass
class Case:
    """One drawn input: what to do with the rig, and the secrets planted in it."""

    kind: str  # "call", "session" or "compose"
    facts: Any
    tool: Any = None
    params: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    plan: Plan = field(default_factory=Plan)

    def action(self, rig: Rig) -> Any:
        if self.kind == "compose":
            return rig.dispatcher.compose(self.facts)
        if self.kind == "session":
            approval = self.options.get("approval")
            rig.session = AgentSession(
                rig.dispatcher,
                self.facts,
                evidence=self.options.get("evidence", ()),
                approvals={self.tool: approval} if approval is not None else None,
            )
            return rig.session.call_tool(self.tool, **self.params)
        return rig.dispatcher.call(self.facts, self.tool, self.params, **self.options)

    @property
    def secrets(self) -> set[str]:
        return planted(self.facts, self.params, self.options, self.plan)

    def __repr__(self) -> str:
        # Shown when a property fails; short, and the secrets in it are fake.
        return (
            f"Case({self.kind}, tool={_short(self.tool)}, params={_short(self.params)}, "
            f"options={_short(self.options)}, plan={self.plan!r}, facts={_short(self.facts)})"
        )


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
    return text if len(text) <= 600 else text[:600] + f"... ({len(text)} characters)"


@dataclass
class Result:
    """What came back: a value or a capgate error, and the Outcome behind either."""

    value: Any
    error: CapgateError | None
    outcome: Outcome | None


# == the checks every example must pass ===============================================


def check(rig: Rig, case: Case, result: Result) -> str:
    """Assert the four promises for one case; return the path it took, for counting."""
    value, error, outcome = result.value, result.error, result.outcome

    # 2. a tool entered only under an allow, once, with what OPA judged
    entered = rig.entered
    assert len(entered) <= 1, f"{case!r}: a tool was entered {len(entered)} times"
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
    else:
        assert outcome is None, f"{case!r}: an outcome without the tool being entered"
        assert case.kind == "compose" or error is not None, f"{case!r}: returned {value!r}"
    if isinstance(error, CapabilityViolation) and not isinstance(error, ObligationUnsupported):
        request, decision = rig.decider.executes[-1]
        assert not decision.allow
        assert set(error.reason_codes) == {reason.code for reason in decision.reasons}
        assert any(e.kind == "execute" and not e.allow for e in rig.events)

    # 3. no secret in any log record, exception text, Outcome.error or trace event
    texts = list(rig.logs.lines) + [repr(event) for event in rig.events]
    if error is not None:
        texts.append("".join(traceback.format_exception(error)))
    if outcome is not None and outcome.error is not None:
        texts.append(outcome.error)
    for token in case.secrets:
        for text in texts:
            # Half the token is enough to count: a leak cut short is still a leak.
            assert token[:12] not in text, f"{case!r}: secret {token} leaked into:\n{text[:2000]}"

    # 4. short messages
    if error is not None:
        message = str(error)
        assert len(message) <= MESSAGE_CAP, f"{case!r}: a {len(message)}-character message"
    if outcome is not None and outcome.error is not None:
        assert len(outcome.error) <= TOOL_TEXT_CAP, f"{len(outcome.error)}-character error"

    if error is not None:
        return error.code
    return outcome.status.value if outcome is not None else "answered"


class Tally:
    """Paths taken by one property's examples, and the summary line for CI."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.examples = 0
        self.paths: Counter[str] = Counter()
        self.started = time.perf_counter()

    def add(self, path: str) -> None:
        """One example, and the path it took."""
        self.examples += 1
        self.paths[path] += 1

    def note(self, path: str) -> None:
        """A further path the same example took."""
        self.paths[path] += 1

    def finish(self, *required: str) -> None:
        ran = self.examples
        seconds = time.perf_counter() - self.started
        shown = ", ".join(f"{path} {count}" for path, count in sorted(self.paths.items()))
        RESULTS.append(f"{self.name}: {ran} examples in {seconds:.1f} s ({shown})")
        if examples() >= _COVERAGE_MIN_EXAMPLES:
            missing = [path for path in required if not self.paths[path]]
            assert not missing, f"{self.name} never reached {missing}: {dict(self.paths)}"


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
    }
    if "used" in Approval.model_fields:  # issue #7: an approval allows one dispatch
        fields["used"] = False
    return fields


def store_facts(contract: ToolContract) -> dict[str, Any]:
    """Facts the gateway's store supplies once issue #7 lands (an unlimited budget).

    Passed only to a ``Dispatcher.call`` that takes them, so the same test runs
    against the dispatcher before and after the change.
    """
    takes = inspect.signature(Dispatcher.call).parameters
    if "budget" not in takes:
        return {}
    budget = importlib.import_module("gateway.model.facts").Budget
    cost = getattr(contract, "cost_units", 0)
    return {"budget": budget(remaining=None, cost=cost)}


def runs_when_allowed(contract: ToolContract) -> bool:
    """Whether an allowed call runs the tool at once (not so for a reviewed proposal)."""
    return not getattr(contract, "needs_review", False)


# == strategies ======================================================================


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in ``n`` draws (hypothesis favours the first choice)."""
    return st.sampled_from([False] * (n - 1) + [True])


names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,24}", fullmatch=True)
emails = st.from_regex(r"[a-z]{1,12}(\.[a-z]{1,8})?@[a-z]{1,12}\.(test|example)", fullmatch=True)
json_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = {"n": value} if level % 2 else [value]
    return value


class _Long(str):
    """A long string that a failing example prints by its length, not in full."""

    def __repr__(self) -> str:
        return f"<{len(self)} characters of {str.__str__(self[:1])!r}>"


class _LyingStr(str):
    """A str whose own methods tell another story than its contents."""

    def __str__(self) -> str:
        return "benign"

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


class _LyingDict(dict[str, Any]):
    def items(self) -> Any:
        return iter([("harmless", "yes")])

    def keys(self) -> Any:
        return iter(["harmless"])


class _RaisingMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("no items here")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("no iteration here")

    def __len__(self) -> int:
        return 1


class _Unrepresentable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


hostile_values = st.one_of(
    secret_texts,
    secret_names,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.just(10**5000),  # past the digit limit for printing an integer
    st.floats(),  # NaN and infinities included
    st.binary(max_size=8),
    st.none(),
    st.booleans(),
    st.lists(json_values, max_size=3),
    st.tuples(json_leaves, json_leaves),
    st.frozensets(st.integers(), max_size=2),
    st.integers(0xD800, 0xDFFF).map(lambda c: "lone " + chr(c)),  # not UTF-8
    st.integers(55, 75).flatmap(lambda d: secret_texts.map(lambda s: nested(d, s))),
    st.just(_Long("x" * (MAX_PARAMS_BYTES + 1))),
    st.dictionaries(st.integers(), st.text(max_size=4), min_size=1, max_size=2),
    secret_names.map(_LyingStr),
    st.builds(lambda s: _LyingDict(inner=s), secret_texts),
    st.just(_RaisingMapping()),
    st.just(_Unrepresentable()),
    st.just(object()),
)


def valid_value(schema: Any) -> st.SearchStrategy[Any]:
    """Values that fit the simple schemas of the demo catalogue's parameters."""
    if not isinstance(schema, dict):
        return json_values
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        if schema.get("format") == "email":
            return emails
        low, high = schema.get("minLength", 0), schema.get("maxLength", 10**9)
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$"):
            return st.from_regex(pattern[1:-1], fullmatch=True).filter(
                lambda text: low <= len(text) <= high
            )
        return st.text(min_size=low, max_size=max(low, min(high, 60)))
    if kind == "integer":
        return st.integers(schema.get("minimum", -(10**9)), schema.get("maximum", 10**12))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {name: valid_value(sub) for name, sub in properties.items() if name in required},
            optional={
                name: valid_value(s) for name, s in properties.items() if name not in required
            },
        )
    if kind == "array":
        return st.lists(valid_value(schema.get("items", {})), max_size=3)
    return json_values


def secret_value(schema: Any) -> st.SearchStrategy[Any]:
    """A secret shaped to pass ``schema`` where it can be, so it reaches OPA and the tool."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return valid_value(schema)
    if schema.get("format") == "email":
        return secret_emails
    pattern = schema.get("pattern", "")
    if pattern.startswith("^[A-Za-z0-9]"):
        return secret_names
    if pattern:
        return valid_value(schema)
    return secret_texts


@st.composite
def parameters(draw: st.DrawFn, contract: ToolContract, hostile: bool = False) -> Any:
    """Parameters for ``contract``: valid (secrets where they fit), or broken on purpose."""
    schema = contract.input_schema
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    params: dict[str, Any] = {}
    for name, sub in properties.items():
        if name in required or draw(st.booleans()):
            params[name] = draw(st.one_of(valid_value(sub), secret_value(sub)))
    if not hostile:
        return params
    for _ in range(draw(st.integers(1, 3))):
        change = draw(st.sampled_from(["replace", "replace", "drop", "extra"]))
        key = draw(st.sampled_from(sorted(params))) if params else "anything"
        if change == "replace":
            params[key] = draw(hostile_values)
        elif change == "drop":
            params.pop(key, None)
        else:
            params[draw(names)] = draw(st.one_of(secret_texts, hostile_values))
    whole = draw(st.sampled_from(["as is"] * 9 + ["not a mapping", "raising", "lying"]))
    if whole == "not a mapping":
        return draw(st.sampled_from([None, [], "contact_id=c-1", 42]))
    if whole == "raising":
        return _RaisingMapping()
    if whole == "lying":
        return _LyingDict(params)
    return params


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
    st.just(_Long("t" * 100_000)),
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
    st.just(_Long("o" * 5_000)),
    st.sampled_from([7, b"op-1", ["op-1"]]),
    names.map(_LyingStr),
)


@st.composite
def evidence_lists(draw: st.DrawFn, contract: ToolContract) -> Any:
    choice = draw(st.integers(0, 9))
    if choice <= 4:
        return list(contract.requires)
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
def rig(sales_catalogue: Catalogue, sales_sidecar: PolicySidecar, log_capture: LogCapture) -> Rig:
    return Rig(sales_catalogue, sales_sidecar, log_capture)


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
        "evidence": list(contract.requires),
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
        kind = data.draw(st.sampled_from(["call", "session"] if AgentSession else ["call"]))
        case = _call_case(data.draw, rig.catalogue, contract, params, kind=kind)
        draw = data.draw
        if draw(one_in(3)):
            case.tool = draw(
                st.sampled_from(sorted(runnable_names(rig.catalogue) | {"contact.READ"}))
                | near_misses(rig.catalogue)
                | tool_names_hostile
            )
        if draw(one_in(3)):
            case.options["operation_id"] = draw(operation_ids)
        if draw(one_in(3)):
            case.options["evidence"] = draw(evidence_lists(contract))
        if draw(one_in(3)):
            case.options["approval"] = draw(approvals(contract, case))
        if kind == "session":
            case.options.pop("operation_id", None)  # a session makes its own
            if type(case.tool) is not str or type(case.params) is not dict:
                case.kind = "call"  # not something ``**params`` can even pass
        tally.add(check(rig, case, rig.run(case)))

    run()
    tally.finish(
        "success",
        "capability_denied",
        "input_invalid",
        *(["tool_failed"] if AgentSession else []),
    )
    if AgentSession is None:
        RESULTS.append(
            "identifiers: AgentSession(dispatcher, facts) is gone: session cases skipped"
        )


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
