"""What the life-cycle tests share: the sales world, a provider on disk, a catalogue.

- **The sales world**: the tenant ``acme`` (:func:`seed`: its four connections, a
  budget), its agents and reviewers, tasks and parameters, and :func:`make_gateway`:
  a :class:`~capgate.gateway.service.gateway.Gateway` over a real store (SQLite or
  PostgreSQL) asking a real OPA, with the secrets of :data:`SECRETS` behind the
  connections. The test modules give it the demo's
  :class:`~capgate.demo.tools.sales_desk.SalesDesk` as providers, or a
  :class:`FileProvider`.
- **Reading the database directly** (:func:`raw_rows`, :func:`raw_execute`,
  :func:`row_counts`, :func:`table_dump`, :func:`sqlite_file_bytes`), as a tamperer
  or an auditor would, outside capgate.
- **A provider on disk** (:class:`FileProvider`): every effect is one line appended
  to a file (one ``write`` with ``O_APPEND``), so separate gateway processes, and a
  process killed half-way, leave a record the test can count afterwards.
- **The life-cycle catalogue** (:func:`write_lifecycle_catalogue`): the sales
  catalogue plus two metered write tools the sales catalogue lacks (every direct
  call of the sales catalogue is free): ``meter.tick`` (cost 1, ``not_idempotent``,
  registered without a lookup) and ``parcel.ship`` (cost 1, ``not_idempotent``,
  with a lookup), in a task type of their own.

- **Fixtures** (:func:`store` over the sales world with a :class:`ShiftClock`, the
  sales :func:`gateway` over a :class:`SalesDesk`, the :func:`metered` gateway over a
  :class:`FileProvider`), bound by the life-cycle test modules.

Kept apart from the test modules so spawned gateway processes
(:mod:`tests.integration.lifecycle_children`) import only this and capgate.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest
import yaml

from capgate.adapters.tools.in_process import InProcessTools, current_call
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.digest import email_digest
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus, EvidenceSubject, Principal, Reviewer
from capgate.gateway.model.outcomes import ToolUnknown
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.policy.client import PolicyClient
from capgate.gateway.service.credentials import CredentialResolver, StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state import open_store
from capgate.gateway.state.records import OperationRecord, ProposalRecord
from capgate.gateway.state.store import Store, Tx
from capgate.gateway.tools.contract import Adapter
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import INNER_HANG_SECONDS

TENANT: Final = "acme"

#: The tenant's connection secrets: distinctive, so a grep finds any leak.
SECRETS: Final = {
    (TENANT, "crm"): "sEcReT-crm-4d1f9a0b7c",
    (TENANT, "sales_mailbox"): "sEcReT-mailbox-e5b2c8d3a1",
    (TENANT, "bank"): "sEcReT-bank-90f7e6d5c4",
    (TENANT, "warehouse"): "sEcReT-warehouse-3b4a5c6d7e",
}
ACCOUNTS: Final = {
    "crm": "acme@crm.example",
    "sales_mailbox": "sales@acme.example",
    "bank": "acme-treasury@bank.example",
    "warehouse": "acme@warehouse.example",
}

SALES: Final = Principal(agent="sales-bot", role="sales", tenant=TENANT)
FINANCE: Final = Principal(agent="finance-bot", role="finance", tenant=TENANT)
MANAGER: Final = Reviewer(
    id="maria", role="sales_manager", tenant=TENANT, authenticated_by="test:fixture"
)
CONTROLLER: Final = Reviewer(
    id="carl", role="controller", tenant=TENANT, authenticated_by="test:fixture"
)

QUOTE_TASK: Final[dict[str, Any]] = {
    "type": "customer_quote",
    "id": "task-quote-17",
    "linked_resources": [
        {"type": "contact", "id": "c-42"},
        {"type": "contact", "id": "c-77"},
        {"type": "opportunity", "id": "opp-17"},
    ],
}
PAY_TASK: Final[dict[str, Any]] = {
    "type": "invoice_payment",
    "id": "task-pay-9",
    "linked_resources": [{"type": "invoice", "id": "inv-9"}],
}
METER_TASK: Final[dict[str, Any]] = {"type": "fulfilment", "id": "task-meter-1"}

EMAIL: Final[dict[str, Any]] = {
    "opportunity_id": "opp-17",
    "recipient": "ada@example.test",
    "subject": "Your quote for opp-17",
    "body": "Dear Ada, please find our quote attached.",
}
QUOTE: Final[dict[str, Any]] = {
    "opportunity_id": "opp-17",
    "amount_cents": 120_000,
    "currency": "EUR",
}
PAYMENT: Final[dict[str, Any]] = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}


def agent_request(principal: Principal, task: dict[str, Any]) -> AgentRequest:
    return AgentRequest.model_validate(
        {"principal": principal, "task": task, "environment": "production"}
    )


def seed(store: Store, *, budget_limit: int | None = 1000, budget_class: str = "unlimited") -> None:
    """The tenant acme and its four active connections."""
    with store.transaction() as tx:
        tx.put_tenant(TENANT, budget_class=budget_class, budget_limit=budget_limit)
        for alias, account in ACCOUNTS.items():
            tx.put_connection(TENANT, alias, status=ConnectionStatus.ACTIVE, account=account)


def make_gateway(
    catalogue: Catalogue,
    policy: PolicyClient,
    store: Store,
    *adapters: Adapter,
    credentials: CredentialResolver | None = None,
    **options: Any,
) -> Gateway:
    return Gateway(
        catalogue,
        policy,
        ToolRegistry(*adapters),
        store,
        credentials=credentials or StaticCredentials(SECRETS),
        **options,
    )


# -- reading the store --------------------------------------------------------------------


def proposal_of(store: Store, proposal_id: str) -> ProposalRecord:
    with store.transaction(read_only=True) as tx:
        found = tx.get_proposal(proposal_id)
    assert found is not None, proposal_id
    return found


def operation_of(store: Store, operation_id: str) -> OperationRecord | None:
    with store.transaction(read_only=True) as tx:
        return tx.get_operation(TENANT, operation_id)


def evidence_of(store: Store, task_id: str) -> set[str]:
    with store.transaction(read_only=True) as tx:
        return tx.evidence(TENANT, task_id)


def recipient(address: str = "ada@example.test") -> EvidenceSubject:
    """What ``verified_recipient`` is about: the digest of the address verified."""
    return EvidenceSubject(type="email_digest", id=email_digest(address))


def record_quote_evidence(
    tx: Tx, task_id: str, *, source: str, address: str = "ada@example.test"
) -> None:
    """The evidence quote.prepare_send requires, as its producing calls record it:
    the recipient verified (about its address), its consent and a quote revision."""
    tx.record_evidence(
        TENANT, task_id, "verified_recipient", source=source, subject=recipient(address)
    )
    tx.record_evidence(TENANT, task_id, "communication_permission", source=source)
    tx.record_evidence(TENANT, task_id, "current_quote_revision", source=source)


def kinds(store: Store, **filters: Any) -> list[tuple[str, str | None]]:
    """(kind, outcome) of the ledger rows that match ``filters``, in order."""
    return [(row.kind, row.outcome) for row in store.ledger(**filters)]


TABLES: Final = (
    "tenants",
    "task_budgets",
    "connections",
    "evidence",
    "operations",
    "proposals",
    "reviews",
    "ledger",
)


def _connect_sqlite(url: str) -> sqlite3.Connection:
    return sqlite3.connect(url.removeprefix("sqlite://"))


def raw_rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of one query read directly from the database (``?`` placeholders)."""
    if url.startswith("sqlite:///"):
        conn = _connect_sqlite(url)
        try:
            return list(conn.execute(sql, params).fetchall())
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        return list(pg.execute(sql.replace("?", "%s").encode(), params).fetchall())


def raw_execute(url: str, sql: str, params: tuple[Any, ...] = ()) -> int:
    """Change the database directly, outside capgate, as a tamperer would."""
    if url.startswith("sqlite:///"):
        conn = _connect_sqlite(url)
        try:
            changed = conn.execute(sql, params).rowcount
            conn.commit()
            return changed
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        return pg.execute(sql.replace("?", "%s").encode(), params).rowcount


def row_counts(url: str) -> dict[str, int]:
    return {table: int(raw_rows(url, f"SELECT count(*) FROM {table}")[0][0]) for table in TABLES}  # noqa: S608


def all_tables(url: str) -> list[str]:
    """Every table of the store's database, whatever the schema version made."""
    if url.startswith("sqlite:///"):
        sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
    else:
        sql = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    return sorted(str(row[0]) for row in raw_rows(url, sql))


def table_dump(url: str) -> str:
    """Every row of every table, as text (a pg_dump of the data, roughly)."""
    lines = []
    tables = all_tables(url)
    assert set(TABLES) <= set(tables)
    for table in tables:
        for row in raw_rows(url, f"SELECT * FROM {table}"):  # noqa: S608
            lines.append(f"{table}: {row!r}")
    return "\n".join(lines)


def sqlite_file_bytes(url: str) -> bytes:
    """The raw bytes of a SQLite store: the database file and its WAL."""
    path = Path(url.removeprefix("sqlite://"))
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def wait_until(
    check: Callable[[], bool], timeout: float = INNER_HANG_SECONDS, what: str = "condition"
) -> None:
    """Until ``check()``; ``timeout`` bounds a hang (tests/hang.py), never a pace."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- a provider whose records survive the process ----------------------------------------


class FileProvider:
    """A provider that writes each effect as one appended line of JSON.

    It does not deduplicate: every call that reaches it is one more line, so the
    lines count real sends. ``find`` is the provider-side lookup by idempotency key
    (or operation id). ``before_effect``/``after_effect`` are test hooks run just
    before and just after the line is written (a crash test kills its own process
    there).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.before_effect: Callable[[str], None] | None = None
        self.after_effect: Callable[[str], None] | None = None
        #: Tools whose next answer is lost after the effect (ToolUnknown).
        self.lose_answer_once: set[str] = set()
        #: Tools whose next call times out after the effect, as a plain TimeoutError
        #: (the tool does not say whether anything happened).
        self.time_out_once: set[str] = set()
        #: The idempotency key of every call of a keyed tool, deduplicated or not.
        self.keys: list[str] = []
        #: Seconds each effect takes (widens race windows).
        self.delay = 0.0

    def effect(self, tool: str, payload: dict[str, Any]) -> str:
        call = current_call()
        if call.credential is None:
            raise RuntimeError("no credential: the gateway did not resolve one")
        key = call.idempotency_key or call.operation_id
        if self.before_effect is not None:
            self.before_effect(tool)
        if self.delay:
            time.sleep(self.delay)
        receipt = f"{tool}:{key}:{os.getpid()}:{time.monotonic_ns()}"
        line = json.dumps(
            {"tool": tool, "key": key, "receipt": receipt, "payload": payload, "pid": os.getpid()},
            sort_keys=True,
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        if self.after_effect is not None:
            self.after_effect(tool)
        if tool in self.lose_answer_once:
            self.lose_answer_once.discard(tool)
            raise ToolUnknown("the provider took the request, then the answer was lost")
        if tool in self.time_out_once:
            self.time_out_once.discard(tool)
            raise TimeoutError("the provider did not answer in time")
        return receipt

    def entries(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        found = [json.loads(line) for line in lines if line.strip()]
        return [e for e in found if tool is None or e["tool"] == tool]

    def find(self, tool: str, key: str) -> str | None:
        for entry in self.entries(tool):
            if entry["key"] == key:
                return str(entry["receipt"])
        return None

    # -- tool bodies ----------------------------------------------------------------------

    def tools(self) -> InProcessTools:
        """``meter.tick`` (no lookup), ``parcel.ship`` and ``quote.dispatch_reviewed``
        (both with a lookup), ``ledger.post`` (no lookup, but deduplicated by its
        idempotency key, as a keyed provider API is), all writing here."""
        tools = InProcessTools()

        def tick(label: str) -> dict[str, Any]:
            return {"tick_id": self.effect("meter.tick", {"label": label})}

        def ship(parcel_id: str, address: str) -> dict[str, Any]:
            return {"shipment_id": self.effect("parcel.ship", {"parcel_id": parcel_id})}

        def find_shipment(operation_id: str) -> dict[str, Any] | None:
            receipt = self.find("parcel.ship", current_call().idempotency_key or operation_id)
            return None if receipt is None else {"shipment_id": receipt}

        def send(opportunity_id: str, recipient: str, subject: str, body: str) -> dict[str, Any]:
            payload = {"to": recipient, "subject": subject}
            return {"message_id": self.effect("quote.dispatch_reviewed", payload), "status": "sent"}

        def find_sent(operation_id: str) -> dict[str, Any] | None:
            key = current_call().idempotency_key or operation_id
            receipt = self.find("quote.dispatch_reviewed", key)
            return None if receipt is None else {"message_id": receipt, "status": "sent"}

        def post(entry: str) -> dict[str, Any]:
            key = current_call().idempotency_key
            if key is None:
                raise RuntimeError("no idempotency key: the gateway did not pass one")
            self.keys.append(key)
            done = self.find("ledger.post", key)
            return {"entry_id": done or self.effect("ledger.post", {"entry": entry})}

        tools.register("meter.tick", "Count one unit of metered work.", tick)
        tools.register("ledger.post", "Post a ledger entry once per key.", post)
        tools.register("parcel.ship", "Ship a parcel.", ship, lookup=find_shipment)
        tools.register("quote.dispatch_reviewed", "Send a reviewed quote.", send, lookup=find_sent)
        return tools


# -- the life-cycle catalogue ------------------------------------------------------------

_EXTRA_TOOLS: Final[list[dict[str, Any]]] = [
    {
        "name": "meter.tick",
        "version": 1,
        "description": "Count one unit of metered work at the provider. Params: {label: str}.",
        "mode": "write",
        "roles": ["sales"],
        "connection_alias": "warehouse",
        "subject_type": None,
        "approval": "none",
        "recovery": "manual_reconciliation",
        "idempotency": "not_idempotent",
        "cost_class": "low",
        "receipt_field": "tick_id",
        "input_schema": {
            "type": "object",
            "properties": {"label": {"type": "string", "maxLength": 64}},
            "required": ["label"],
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "properties": {"tick_id": {"type": "string", "minLength": 1}},
            "required": ["tick_id"],
        },
        "environments": ["production"],
    },
    {
        "name": "parcel.ship",
        "version": 1,
        "description": "Ship one parcel. Params: {parcel_id: str, address: str}.",
        "mode": "write",
        "roles": ["sales"],
        "connection_alias": "warehouse",
        "subject_type": None,
        "approval": "none",
        "recovery": "lookup_before_retry",
        "idempotency": "not_idempotent",
        "cost_class": "low",
        "receipt_field": "shipment_id",
        "input_schema": {
            "type": "object",
            "properties": {
                "parcel_id": {"type": "string", "maxLength": 64},
                "address": {"type": "string", "maxLength": 200},
            },
            "required": ["parcel_id", "address"],
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "properties": {"shipment_id": {"type": "string", "minLength": 1}},
            "required": ["shipment_id"],
        },
        "environments": ["production"],
    },
    {
        "name": "ledger.post",
        "version": 1,
        "description": "Post one entry to the provider's ledger, once per key. "
        "Params: {entry: str}.",
        "mode": "write",
        "roles": ["sales"],
        "connection_alias": "warehouse",
        "subject_type": None,
        "approval": "none",
        "recovery": "lookup_before_retry",
        "idempotency": "idempotent_with_key",
        "cost_class": "low",
        "receipt_field": "entry_id",
        "input_schema": {
            "type": "object",
            "properties": {"entry": {"type": "string", "maxLength": 64}},
            "required": ["entry"],
            "additionalProperties": False,
        },
        "output_schema": {
            "type": "object",
            "properties": {"entry_id": {"type": "string", "minLength": 1}},
            "required": ["entry_id"],
        },
        "environments": ["production"],
    },
]


def write_lifecycle_catalogue(
    folder: Path, *, tool_updates: dict[str, dict[str, Any]] | None = None
) -> Path:
    """The sales catalogue plus the metered tools, written to ``folder``.

    ``tool_updates`` changes fields of existing tools (e.g. a new version).
    """
    folder.mkdir(parents=True, exist_ok=True)
    source = demo_catalogue_dir("sales")
    for name in ("budget_classes.yaml", "roles.yaml", "currencies.yaml"):
        shutil.copyfile(source / name, folder / name)
    tools = yaml.safe_load((source / "tools.yaml").read_text())
    for tool in tools["tools"]:
        tool.update((tool_updates or {}).get(tool["name"], {}))
    tools["tools"].extend(_EXTRA_TOOLS)
    task_types = yaml.safe_load((source / "task_types.yaml").read_text())
    task_types["task_types"]["fulfilment"] = {
        "description": "Ship parcels and meter the work.",
        "tools": ["meter.tick", "parcel.ship", "ledger.post"],
    }
    (folder / "tools.yaml").write_text(yaml.safe_dump(tools, sort_keys=False))
    (folder / "task_types.yaml").write_text(yaml.safe_dump(task_types, sort_keys=False))
    return folder


class ShiftClock:
    """The system clock moved by ``offset``: a store clock a test controls."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


# -- fixtures (bound by the life-cycle test modules) --------------------------------------


@pytest.fixture
def clock() -> ShiftClock:
    return ShiftClock()


@pytest.fixture
def store(store_url: str, clock: ShiftClock) -> Iterator[Store]:
    opened = open_store(store_url, clock=clock)
    try:
        seed(opened)
        yield opened
    finally:
        opened.close()


@pytest.fixture
def desk() -> SalesDesk:
    return SalesDesk()


@pytest.fixture
def gateway(
    sales_catalogue: Catalogue, sales_sidecar: PolicySidecar, store: Store, desk: SalesDesk
) -> Gateway:
    return make_gateway(sales_catalogue, sales_sidecar.client, store, desk.tools())


@pytest.fixture
def provider(tmp_path: Path) -> FileProvider:
    return FileProvider(tmp_path / "provider.jsonl")


@pytest.fixture
def metered(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
) -> Gateway:
    """A gateway of the life-cycle catalogue whose metered tools write to ``provider``."""
    return make_gateway(lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools())
