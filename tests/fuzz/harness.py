"""What the fuzz properties share: planted secrets, the recording rig, the gateway's world.

- **Secrets** (:data:`secret_names`, :data:`secret_texts`, :data:`secret_emails`,
  :func:`planted`, :func:`leak_in`): secret-looking values, each holding a
  24-hex-digit token that a property looks for wherever it must not be.
- **Recorders**: :class:`RecordingDecider` (the real policy client; every compose,
  execute and review answer it returned is kept), :class:`LogCapture` (every record
  of every logger) and :class:`Provider`: one tool body per runnable name of the
  catalogue, which records being entered (with the operation's ledger rows at that
  moment, when it runs under a :class:`World`) and does what the current
  :class:`Plan` says. Unless the plan refuses or asks for a retry, the call leaves an
  effect at the provider; tools whose contract says ``lookup_before_retry`` get a
  lookup that finds it.
- **The world** (:class:`World`): a :class:`~gateway.Gateway` over a fresh SQLite store
  in a folder of its own, seeded the way an operator would seed it (tenants, budget
  classes and limits, connections, recorded evidence), whose connection secrets are
  planted ones in an environment of their own, read by
  :class:`~gateway.EnvironmentCredentials` (``capgate serve``'s default resolver),
  so every body that holds its own tenant's secret went through that mapping; and
  an auditor's view of the store: every cell of every table, and the raw bytes of
  the database file and its write-ahead log.
- **The tally** (:class:`Tally`): the paths a property's examples took, printed in the
  summary at the end of the run (``tests/fuzz/conftest.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hypothesis import strategies as st

from capgate.adapters.tools.in_process import InProcessTools, current_call
from capgate.gateway.enforce.dispatcher import DecisionEvent
from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.model.decisions import ComposeDecision, ExecuteDecision, ReviewDecision
from capgate.gateway.model.facts import (
    Approval,
    ComposeInput,
    ConnectionStatus,
    EvidenceSubject,
    ExecuteInput,
    ReviewInput,
)
from capgate.gateway.model.outcomes import ToolRefused, ToolRetryable
from capgate.gateway.policy.client import PolicyClient
from capgate.gateway.service.credentials import EnvironmentCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import open_store
from capgate.gateway.state.records import LedgerRow
from capgate.gateway.tools.contract import CallContext
from capgate.gateway.tools.registry import ToolRegistry
from tests.fuzz.runs import RESULTS, examples

__all__ = [
    "CALLER_DATA_COLUMNS",
    "MESSAGE_CAP",
    "TOOL_TEXT_CAP",
    "Entry",
    "LogCapture",
    "Lookup",
    "Plan",
    "Provider",
    "RecordingDecider",
    "SeededEvidence",
    "Tally",
    "TenantSeed",
    "World",
    "account_of",
    "contract_of",
    "example_of",
    "leak_in",
    "ledger_text",
    "planted",
    "secret_credentials",
    "secret_emails",
    "secret_names",
    "secret_texts",
]

#: The longest exception message capgate may produce (docs/security.md): every
#: caller-supplied value is quoted through ``capgate.gateway.errors.quote`` (80 characters
#: and its length) and composite messages are cut, so a few hundred characters is
#: usual; 1,000 is the promise.
MESSAGE_CAP: Final = 1_000
#: A tool's own error text is kept in ``Outcome.error`` cut to 2,000 characters,
#: after the exception's type name and followed by the "… (N characters)" note.
TOOL_TEXT_CAP: Final = 2_000 + 120

#: Below this many examples a run is a smoke run: the path counts are not asserted.
_COVERAGE_MIN_EXAMPLES: Final = 100


# == secrets =========================================================================


def _token(n: int, kind: str = "secret") -> str:
    """24 hex digits, distinctive even for n = 0 (hypothesis' favourite number)."""
    return hashlib.sha256(f"capgate-fuzz-{kind}-{n}".encode()).hexdigest()[:24]


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
#: A connection's credential: its token comes from a space of its own, so no planted
#: parameter, fact or output shares it, and finding it anywhere is the credential's leak.
secret_credentials = st.builds(
    lambda n, shape: shape.format(_token(n, "credential")),
    st.integers(0, 2**32),
    st.sampled_from(_SECRET_SHAPES),
)


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


def leak_in(secrets: Iterable[str], texts: Iterable[str]) -> tuple[str, str] | None:
    """The first (secret, text) where a secret shows, or None.

    Half the token is enough to count: a leak cut short is still a leak.
    """
    halves = [(token, token[:12]) for token in secrets]
    if not halves:
        return None
    for text in texts:
        for token, half in halves:
            if half in text:
                return token, text
    return None


# == recorders =======================================================================


@dataclass(frozen=True)
class Entry:
    """One time a tool body was entered."""

    name: str
    params: dict[str, Any]
    context: CallContext
    #: The kind of plan the body followed.
    plan: str = "conform"
    #: The operation's ledger rows (of its tenant) at the moment the body was
    #: entered, when it ran under a World; None for the stateless dispatcher.
    ledger: tuple[LedgerRow, ...] | None = None


@dataclass(frozen=True)
class Lookup:
    """One time a tool's lookup was asked about an earlier attempt."""

    name: str
    operation_id: str
    tenant: str | None
    found: bool


class RecordingDecider:
    """The real policy client; each answer it returned is kept for the checks."""

    def __init__(self, client: PolicyClient) -> None:
        self.client = client
        self.composes: list[ComposeDecision] = []
        self.executes: list[tuple[ExecuteInput, ExecuteDecision]] = []
        self.reviews: list[tuple[ReviewInput, ReviewDecision]] = []

    def clear(self) -> None:
        self.composes.clear()
        self.executes.clear()
        self.reviews.clear()

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        decision = self.client.compose(facts)
        self.composes.append(decision)
        return decision

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        decision = self.client.execute(facts)
        self.executes.append((facts, decision))
        return decision

    def review(self, facts: ReviewInput) -> ReviewDecision:
        decision = self.client.review(facts)
        self.reviews.append((facts, decision))
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


class Plan:
    """What the tool body does once entered: return something, or fail some way.

    Tool output may hold secrets (it is the tool's data); capgate must not copy
    them into ``Outcome.error``, a log line or the ledger. The tool's own error texts
    hold no planted secret, except the credential it was handed: a careless tool
    that prints its ``Secret`` prints ``Secret(***)``.
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
        if self.kind == "retry":
            return f"Plan('retry', retry_after={self.retry_after!r})"
        return f"Plan({self.kind!r})"

    @property
    def has_effect(self) -> bool:
        """Whether the provider acted (a refusal or a retry says it did not)."""
        return self.kind not in ("refuse", "retry")

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
            credential = current_call().credential
            raise RuntimeError(
                f"the tool crashed holding {credential} ({credential!r}): " + "c" * 10_000
            )
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


def contract_of(catalogue: Catalogue, name: str) -> ToolContract | None:
    """The contract a runnable name runs under: the tool's, or the proposal tool's
    whose execution action it is."""
    contract = catalogue.tools.get(name)
    if contract is not None:
        return contract
    return next((c for c in catalogue.tools.values() if c.dispatch_action == name), None)


class Provider:
    """The tool bodies of every runnable name of a catalogue, recording what happens.

    ``plan`` is what the next body does; ``world`` (when set) is read at entry for
    the operation's ledger rows. ``effects`` are (tenant, operation id, name) of the
    calls that acted at the provider; a lookup finds them.
    """

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self.entered: list[Entry] = []
        self.lookups: list[Lookup] = []
        self.effects: set[tuple[str | None, str, str]] = set()
        self.plan = Plan()
        self.world: World | None = None
        self.tools = InProcessTools()
        for name in sorted(catalogue.runnable_names()):
            contract = contract_of(catalogue, name)
            looks_up = contract is not None and contract.recovery == "lookup_before_retry"
            self.tools.register(
                name,
                "records being entered",
                self._body(name, contract),
                lookup=self._lookup(name, contract) if looks_up else None,
            )

    def reset(self, plan: Plan | None = None) -> None:
        self.entered.clear()
        self.lookups.clear()
        self.effects.clear()
        self.plan = plan or Plan()

    def has_lookup(self, name: str) -> bool:
        return self.tools.has_lookup(name)

    def _body(self, name: str, contract: ToolContract | None) -> Callable[..., Any]:
        def body(**params: Any) -> Any:
            context = current_call()
            ledger = None
            if self.world is not None:
                ledger = tuple(
                    self.world.store.ledger(
                        tenant=context.tenant, operation_id=context.operation_id
                    )
                )
            plan = self.plan
            self.entered.append(Entry(name, params, context, plan.kind, ledger))
            if plan.has_effect:
                self.effects.add((context.tenant, context.operation_id, name))
            return plan.act(contract)

        return body

    def _lookup(self, name: str, contract: ToolContract | None) -> Callable[[str], Any]:
        def lookup(operation_id: str) -> Any:
            tenant = current_call().tenant
            found = (tenant, operation_id, name) in self.effects
            self.lookups.append(Lookup(name, operation_id, tenant, found))
            return example_of(contract.output_schema) if found and contract else None

        return lookup


# == the world: a gateway over a real store ==========================================


#: A piece of evidence seeded for a task: a name (about nothing in particular), or a
#: name with what it is about.
SeededEvidence = str | tuple[str, EvidenceSubject]


@dataclass(frozen=True)
class TenantSeed:
    """What an operator set up for one tenant before the agents came."""

    budget_class: str
    budget_limit: int | None = None
    #: alias -> status ("active", "disabled", "revoked")
    connections: Mapping[str, str] = field(default_factory=dict)
    #: task id -> evidence already recorded for it
    evidence: Mapping[str, tuple[SeededEvidence, ...]] = field(default_factory=dict)


def account_of(tenant: str, alias: str) -> str:
    """The provider account a seeded connection acts as (logged and kept by design)."""
    return f"{alias}@{tenant}.example"


#: Cells that hold what callers and providers sent, by design: a proposal's exact
#: parameters and task (a reviewer reads them), an operation's first outcome with
#: the tool's result (a duplicate gets it back), evidence names. A planted secret
#: may be there; a credential may not. Every other cell is checked for every
#: planted secret.
CALLER_DATA_COLUMNS: Final = frozenset(
    {
        ("proposals", "params"),
        ("proposals", "task"),
        ("operations", "outcome"),
        ("evidence", "name"),
    }
)


def _without_receipt(detail: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in detail.items() if key != "receipt"}


def ledger_text(row: LedgerRow) -> str:
    """A ledger row as text, less the provider's receipt of an outcome row.

    The receipt (the contract's ``receipt_field`` of the tool's output) is what the
    ledger keeps by design (docs/lifecycle.md); a provider that writes a secret into
    its own receipt puts it there. Every other field is the gateway's to keep clean.
    """
    data = row.model_dump(mode="json")
    if row.kind == "outcome":
        data["detail"] = _without_receipt(row.detail)
    return json.dumps(data, ensure_ascii=False)


class World:
    """A Gateway over a fresh SQLite store in a folder of its own under ``base``."""

    def __init__(
        self,
        base: Path,
        catalogue: Catalogue,
        policy: RecordingDecider,
        provider: Provider,
        *,
        tenants: Mapping[str, TenantSeed],
        credentials: Mapping[tuple[str, str], str],
        observer: Callable[[DecisionEvent], None] | None = None,
    ) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="world-", dir=base)
        self.path = Path(self._folder.name) / "state.db"
        self.credentials = dict(credentials)
        #: The variables the gateway's resolver reads (a set of two pairs that read one
        #: variable would keep one secret of the two: a body would hold the other's).
        names = EnvironmentCredentials(environ={})
        self.environment = {
            names.variable(tenant, alias): secret
            for (tenant, alias), secret in self.credentials.items()
        }
        self.tenants = dict(tenants)
        self.store = open_store(str(self.path))
        try:
            with self.store.transaction() as tx:
                for tenant, seed in tenants.items():
                    tx.put_tenant(
                        tenant, budget_class=seed.budget_class, budget_limit=seed.budget_limit
                    )
                    for alias, status in seed.connections.items():
                        tx.put_connection(
                            tenant,
                            alias,
                            status=ConnectionStatus(status),
                            account=account_of(tenant, alias),
                        )
                    for task, pieces in seed.evidence.items():
                        for piece in pieces:
                            name, about = piece if isinstance(piece, tuple) else (piece, None)
                            tx.record_evidence(tenant, task, name, source="seeded", subject=about)
            self.gateway = Gateway(
                catalogue,
                policy,
                ToolRegistry(provider.tools),
                self.store,
                credentials=EnvironmentCredentials(environ=self.environment),
                observer=observer,
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            self.store.close()
        finally:
            self._folder.cleanup()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the auditor's view: the store as whoever holds the file reads it ------------

    def file_bytes(self) -> bytes:
        """The raw bytes of the database file and its write-ahead log."""
        parts = (self.path, self.path.with_name(self.path.name + "-wal"))
        return b"".join(part.read_bytes() for part in parts if part.exists())

    def cells(self) -> Iterator[tuple[str, str, str]]:
        """(table, column, text) of every cell of every table, read outside capgate."""
        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            tables = [
                str(row[0])
                for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
            ]
            for table in tables:
                cursor = connection.execute(f'SELECT * FROM "{table}"')  # noqa: S608
                columns = [column[0] for column in cursor.description]
                for row in cursor.fetchall():
                    for column, value in zip(columns, row, strict=True):
                        if value is None:
                            continue
                        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
                        if (table, column) == ("ledger", "detail"):
                            text = json.dumps(_without_receipt(json.loads(text)))
                        yield table, column, text
        finally:
            connection.close()

    def audit(self, secrets: set[str], credentials: set[str]) -> str | None:
        """What an auditor with the file finds, or None.

        No credential anywhere in the file's bytes or any cell; no planted secret in
        any cell but :data:`CALLER_DATA_COLUMNS`; the ledger's hash chain whole.
        """
        report = self.store.verify_ledger()
        if not report.ok:
            return f"the ledger does not verify: {report.problem} at row {report.first_bad_seq}"
        raw = self.file_bytes().decode("latin-1")
        found = leak_in(credentials, [raw])
        if found:
            return f"credential {found[0]} is in the store's file"
        for table, column, text in self.cells():
            checked = credentials if (table, column) in CALLER_DATA_COLUMNS else secrets
            found = leak_in(checked, [text])
            if found:
                return f"secret {found[0]} is in the store, {table}.{column}: {text[:500]}"
        return None


# == counting ========================================================================


class Tally:
    """Paths taken by one property's examples, and the summary line for CI."""

    def __init__(self, name: str, unit: str = "examples") -> None:
        self.name = name
        self.unit = unit
        self.examples = 0
        self.steps = 0
        self.paths: Counter[str] = Counter()
        self.started = time.perf_counter()

    def add(self, path: str) -> None:
        """One example, and the path it took."""
        self.examples += 1
        self.paths[path] += 1

    def note(self, path: str) -> None:
        """A further path the same example took."""
        self.paths[path] += 1

    def finish(self, *required: str, more: Iterable[str] = ()) -> None:
        """Add the summary line (and ``more`` lines); assert ``required`` paths were taken."""
        ran = self.examples
        seconds = time.perf_counter() - self.started
        shown = ", ".join(f"{path} {count}" for path, count in sorted(self.paths.items()))
        steps = f", {self.steps} steps" if self.steps else ""
        RESULTS.append(f"{self.name}: {ran} {self.unit}{steps} in {seconds:.1f} s ({shown})")
        RESULTS.extend(more)
        if examples() >= _COVERAGE_MIN_EXAMPLES:
            missing = [path for path in required if not self.paths[path]]
            assert not missing, f"{self.name} never reached {missing}: {dict(self.paths)}"
