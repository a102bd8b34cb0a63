"""Versioned schema migrations, applied whole or not at all when a store opens.

The ``schema_version`` table holds one row: the schema version of the store and
the capgate version that last wrote it. A database without that table is at
version 0 (empty). Opening a store runs, in one transaction under the migration
lock, every step above its version; a step that fails rolls back the whole upgrade,
so a store is never left half-migrated (both backends have transactional DDL).

A store whose version is above the last step here was written by a newer capgate:
it is refused with :class:`~capgate.gateway.errors.StoreVersionError` and left as it
is, because this code could misread a fact that grants something.

To change the schema, append a :class:`Migration` with the next version and raise
``SCHEMA_VERSION`` in :mod:`capgate.gateway.state.store`; never edit a released step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capgate.gateway.errors import StoreError, StoreVersionError
from capgate.gateway.state.backend import Dialect, Session
from capgate.gateway.state.store import SCHEMA_VERSION
from capgate.gateway.version import __version__

__all__ = ["MIGRATIONS", "Migration", "check_steps", "migrate", "read_version"]

_log = logging.getLogger("capgate.state")


@dataclass(frozen=True)
class Migration:
    """One step: the statements that take a store from ``version - 1`` to ``version``."""

    version: int
    description: str
    statements: Callable[[Dialect], Sequence[str]]


def _version_1(d: Dialect) -> list[str]:
    """Every table of the first schema.

    Times are fixed-width UTC text (:mod:`capgate.gateway.state.times`), JSON is canonical
    JSON text. Budget amounts are checked non-negative by the database too, as a
    backstop behind the store's own checks.
    """
    i, t = d.int_type, d.time_type
    return [
        f"""CREATE TABLE tenants (
            tenant TEXT PRIMARY KEY,
            budget_class TEXT NOT NULL,
            budget_limit {i} CHECK (budget_limit IS NULL OR budget_limit >= 0),
            reserved {i} NOT NULL DEFAULT 0 CHECK (reserved >= 0),
            spent {i} NOT NULL DEFAULT 0 CHECK (spent >= 0),
            created_at {t} NOT NULL,
            updated_at {t} NOT NULL
        )""",
        f"""CREATE TABLE task_budgets (
            tenant TEXT NOT NULL REFERENCES tenants (tenant),
            task_id TEXT NOT NULL,
            budget_limit {i} CHECK (budget_limit IS NULL OR budget_limit >= 0),
            reserved {i} NOT NULL DEFAULT 0 CHECK (reserved >= 0),
            spent {i} NOT NULL DEFAULT 0 CHECK (spent >= 0),
            updated_at {t} NOT NULL,
            PRIMARY KEY (tenant, task_id)
        )""",
        f"""CREATE TABLE connections (
            tenant TEXT NOT NULL REFERENCES tenants (tenant),
            alias TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('active', 'disabled', 'revoked')),
            account TEXT NOT NULL,
            updated_at {t} NOT NULL,
            PRIMARY KEY (tenant, alias)
        )""",
        f"""CREATE TABLE evidence (
            tenant TEXT NOT NULL REFERENCES tenants (tenant),
            task_id TEXT NOT NULL,
            name TEXT NOT NULL,
            source TEXT NOT NULL,
            recorded_at {t} NOT NULL,
            PRIMARY KEY (tenant, task_id, name)
        )""",
        f"""CREATE TABLE operations (
            tenant TEXT NOT NULL REFERENCES tenants (tenant),
            operation_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            params_digest TEXT NOT NULL,
            task_id TEXT,
            status TEXT NOT NULL CHECK (status IN ('running', 'done')),
            outcome TEXT,
            cost {i} NOT NULL CHECK (cost >= 0),
            attempts {i} NOT NULL CHECK (attempts >= 1),
            lease_until {t},
            created_at {t} NOT NULL,
            updated_at {t} NOT NULL,
            PRIMARY KEY (tenant, operation_id)
        )""",
        "CREATE INDEX operations_running ON operations (lease_until) WHERE status = 'running'",
        f"""CREATE TABLE proposals (
            n {d.identity_pk},
            id TEXT NOT NULL UNIQUE,
            tenant TEXT NOT NULL REFERENCES tenants (tenant),
            task_id TEXT NOT NULL,
            proposer TEXT NOT NULL,
            environment TEXT NOT NULL,
            task TEXT NOT NULL,
            tool TEXT NOT NULL,
            contract_version {i} NOT NULL,
            execution_action TEXT NOT NULL,
            params TEXT NOT NULL,
            params_digest TEXT NOT NULL,
            operation_id TEXT NOT NULL,
            decision_id TEXT,
            status TEXT NOT NULL CHECK (
                status IN ('pending', 'approved', 'rejected', 'dispatched', 'blocked')
            ),
            reason_codes TEXT NOT NULL,
            created_at {t} NOT NULL,
            updated_at {t} NOT NULL,
            UNIQUE (tenant, operation_id)
        )""",
        "CREATE INDEX proposals_by_status ON proposals (status, tenant)",
        f"""CREATE TABLE reviews (
            n {d.identity_pk},
            id TEXT NOT NULL UNIQUE,
            proposal_id TEXT NOT NULL REFERENCES proposals (id),
            reviewer TEXT NOT NULL,
            verdict TEXT NOT NULL CHECK (verdict IN ('approved', 'rejected')),
            kind TEXT NOT NULL,
            tenant TEXT NOT NULL,
            tool TEXT NOT NULL,
            operation_id TEXT NOT NULL,
            digest TEXT NOT NULL,
            expires_at {t} NOT NULL,
            consumed_at {t},
            decision_id TEXT,
            created_at {t} NOT NULL
        )""",
        "CREATE INDEX reviews_by_proposal ON reviews (proposal_id)",
        f"""CREATE TABLE ledger (
            seq {i} PRIMARY KEY,
            at {t} NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL,
            kind TEXT NOT NULL,
            tenant TEXT,
            principal TEXT,
            tool TEXT,
            contract_version {i},
            operation_id TEXT,
            proposal_id TEXT,
            decision_id TEXT,
            policy_revision TEXT,
            outcome TEXT,
            reason_codes TEXT NOT NULL,
            detail TEXT NOT NULL
        )""",
        "CREATE INDEX ledger_by_tenant ON ledger (tenant, seq)",
        "CREATE INDEX ledger_by_operation ON ledger (operation_id, seq)",
        "CREATE INDEX ledger_by_proposal ON ledger (proposal_id, seq)",
    ]


def _version_2(d: Dialect) -> list[str]:
    """Whether a running attempt holds a budget reservation (a retry of an unknown
    operation was charged before and holds none, so a crash during it must not be
    charged again), and an index to find a tenant's proposal by operation id."""
    del d
    return [
        "ALTER TABLE operations ADD COLUMN reserved INTEGER NOT NULL DEFAULT 1 "
        "CHECK (reserved IN (0, 1))",
        "CREATE INDEX proposals_by_operation ON proposals (tenant, operation_id)",
    ]


def _version_3(d: Dialect) -> list[str]:
    """Pins of upstream MCP tool definitions: what each server last showed of each
    tool, the definition a person accepted (and as which catalogue tool), and the one
    they rejected. A tool whose shown definition is not the accepted one is
    quarantined (``docs/mcp-upstreams.md``)."""
    t = d.time_type
    digest = "CHECK ({0} IS NULL OR {0} LIKE 'sha256:%')"
    return [
        f"""CREATE TABLE upstream_pins (
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending', 'accepted', 'changed', 'rejected')),
            observed_digest TEXT {digest.format("observed_digest")},
            observed_definition TEXT,
            observed_at {t} NOT NULL,
            catalogue_tool TEXT,
            accepted_digest TEXT {digest.format("accepted_digest")},
            accepted_definition TEXT,
            accepted_by TEXT,
            accepted_at {t},
            rejected_digest TEXT {digest.format("rejected_digest")},
            rejected_by TEXT,
            rejected_at {t},
            updated_at {t} NOT NULL,
            PRIMARY KEY (server, tool)
        )""",
        "CREATE INDEX upstream_pins_by_catalogue_tool ON upstream_pins (catalogue_tool)",
    ]


def _version_4(d: Dialect) -> list[str]:
    """What it takes to settle uncertain outcomes without acting again.

    ``operations.outcome_status`` repeats the status of the stored outcome (NULL while
    running), so the reconciler finds the ``unknown`` operations to look up, and a new
    proposal the unsettled operations with its very content, through one small
    partial index rather than by reading every outcome. Existing rows take the status
    from their outcome's JSON. ``proposals.unsettled_twins`` records, when a proposal
    is made, the unsettled operations of the same tool and content it may repeat.
    """
    backfill = (
        "UPDATE operations SET outcome_status = json_extract(outcome, '$.status') "
        "WHERE outcome IS NOT NULL"
        if d.name == "sqlite"
        else "UPDATE operations SET outcome_status = (CAST(outcome AS jsonb) ->> 'status') "
        "WHERE outcome IS NOT NULL"
    )
    return [
        "ALTER TABLE operations ADD COLUMN outcome_status TEXT CHECK (outcome_status IS NULL "
        "OR outcome_status IN ('success', 'refused', 'retryable', 'unknown'))",
        backfill,
        "CREATE INDEX operations_unsettled ON operations (tenant, tool, params_digest) "
        "WHERE status = 'running' OR outcome_status = 'unknown'",
        "ALTER TABLE proposals ADD COLUMN unsettled_twins TEXT NOT NULL DEFAULT '[]'",
    ]


def _version_5(d: Dialect) -> list[str]:
    """The dispatch queue: one job per approved proposal, which the execution workers
    claim with a lease (``claimed_by`` until ``claim_until``), retry with backoff
    (``not_before``) and settle (``docs/lifecycle.md``, the worker). The partial index
    holds only the queued jobs, so finding due work reads no finished ones. Proposals
    approved before this version are queued, due at once: they were waiting for an
    execution service, and a worker is one."""
    i, t = d.int_type, d.time_type
    return [
        f"""CREATE TABLE dispatch_queue (
            n {d.identity_pk},
            proposal_id TEXT NOT NULL UNIQUE REFERENCES proposals (id),
            tenant TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('queued', 'done', 'given_up')),
            not_before {t} NOT NULL,
            claimed_by TEXT,
            claim_until {t},
            tries {i} NOT NULL DEFAULT 0 CHECK (tries >= 0),
            last_result TEXT,
            created_at {t} NOT NULL,
            updated_at {t} NOT NULL,
            CHECK ((claimed_by IS NULL) = (claim_until IS NULL))
        )""",
        "CREATE INDEX dispatch_queue_due ON dispatch_queue (not_before) WHERE status = 'queued'",
        "INSERT INTO dispatch_queue (proposal_id, tenant, status, not_before, tries, "
        "created_at, updated_at) SELECT id, tenant, 'queued', updated_at, 0, updated_at, "
        "updated_at FROM proposals WHERE status = 'approved' ORDER BY n",
    ]


def _version_6(d: Dialect) -> list[str]:
    """Webhook notices, whose outbox is the ledger: each tenant's cursor (how far its
    notices have gone, and which notifier holds them), each notice delivered or given
    up, and each attempt. No cursor is made here: a tenant's first notifier starts at
    the ledger's end, so turning notices on does not send the history."""
    i, t = d.int_type, d.time_type
    return [
        f"""CREATE TABLE notice_cursors (
            tenant TEXT PRIMARY KEY,
            after_seq {i} NOT NULL CHECK (after_seq >= 0),
            claimed_by TEXT,
            claim_until {t},
            updated_at {t} NOT NULL,
            CHECK ((claimed_by IS NULL) = (claim_until IS NULL))
        )""",
        f"""CREATE TABLE notice_deliveries (
            event_id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL,
            seq {i} NOT NULL,
            event TEXT NOT NULL,
            proposal_id TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('sending', 'delivered', 'failed')),
            attempts {i} NOT NULL CHECK (attempts >= 0),
            last_result TEXT,
            created_at {t} NOT NULL,
            updated_at {t} NOT NULL
        )""",
        "CREATE INDEX notice_deliveries_by_tenant ON notice_deliveries (tenant, seq)",
        f"""CREATE TABLE notice_attempts (
            n {d.identity_pk},
            event_id TEXT NOT NULL REFERENCES notice_deliveries (event_id),
            attempt {i} NOT NULL CHECK (attempt >= 1),
            at {t} NOT NULL,
            result TEXT NOT NULL,
            status_code {i},
            UNIQUE (event_id, attempt)
        )""",
    ]


def _version_7(d: Dialect) -> list[str]:
    """A reviewer's comment beside the verdict: free text for people, checked by the
    store's record (:mod:`capgate.gateway.model.comments`) and never sent to OPA.
    Reviews given before this version have none (NULL)."""
    del d
    return ["ALTER TABLE reviews ADD COLUMN comment TEXT"]


def _version_8(d: Dialect) -> list[str]:
    """Evidence about something, for a while: each piece names its subject (the call's
    subject or one of its values, ``docs/catalogue.md``) and may expire. The subject
    joins the primary key, so the same name about two invoices is two pieces; a
    primary key cannot change in place on SQLite, so the table is rebuilt on both
    backends. Rows from before keep their names and are about nothing (empty type and
    id, which no subject has) and never expire: they meet exactly the requirements
    they met before."""
    t = d.time_type
    return [
        f"""CREATE TABLE evidence_v8 (
            tenant TEXT NOT NULL REFERENCES tenants (tenant),
            task_id TEXT NOT NULL,
            name TEXT NOT NULL,
            subject_type TEXT NOT NULL DEFAULT '',
            subject_id TEXT NOT NULL DEFAULT '',
            source TEXT NOT NULL,
            recorded_at {t} NOT NULL,
            expires_at {t},
            CHECK ((subject_type = '') = (subject_id = '')),
            PRIMARY KEY (tenant, task_id, name, subject_type, subject_id)
        )""",
        "INSERT INTO evidence_v8 (tenant, task_id, name, source, recorded_at) "
        "SELECT tenant, task_id, name, source, recorded_at FROM evidence",
        "DROP TABLE evidence",
        "ALTER TABLE evidence_v8 RENAME TO evidence",
    ]


def _version_9(d: Dialect) -> list[str]:
    """Task links the gateway owns: a resource linked to a task by someone, at some
    time (``capgate tasks link``). Each link is one row, kept until it is unlinked;
    the ledger keeps both acts."""
    t = d.time_type
    return [
        f"""CREATE TABLE task_links (
            tenant TEXT NOT NULL REFERENCES tenants (tenant),
            task_id TEXT NOT NULL,
            resource_type TEXT NOT NULL,
            resource_id TEXT NOT NULL,
            linked_by TEXT NOT NULL,
            linked_at {t} NOT NULL,
            PRIMARY KEY (tenant, task_id, resource_type, resource_id)
        )""",
    ]


def _version_10(d: Dialect) -> list[str]:
    """Contract versions pinned to their content: the digest each tool's contract
    version was first served with, so that a contract changed under the same
    version is refused at start (``capgate.gateway.service.versions``)."""
    t = d.time_type
    return [
        f"""CREATE TABLE contract_pins (
            tool TEXT NOT NULL,
            version INTEGER NOT NULL,
            digest TEXT NOT NULL,
            pinned_at {t} NOT NULL,
            PRIMARY KEY (tool, version)
        )""",
    ]


#: Every step, in order; the last one's version is :data:`SCHEMA_VERSION`.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "tenants, budgets, connections, evidence, operations, proposals, "
              "reviews and the ledger", _version_1),
    Migration(2, "operations.reserved; proposals by operation id", _version_2),
    Migration(3, "pins of upstream MCP tool definitions", _version_3),
    Migration(4, "operations.outcome_status for settling unknown outcomes; proposals' "
              "unsettled twins", _version_4),
    Migration(5, "the dispatch queue of the execution workers", _version_5),
    Migration(6, "webhook notices: cursors, deliveries and attempts", _version_6),
    Migration(7, "reviews.comment, what a reviewer wrote beside the verdict", _version_7),
    Migration(8, "evidence about a subject, with an expiry", _version_8),
    Migration(9, "task links the gateway owns", _version_9),
    Migration(10, "contract versions pinned to their content", _version_10),
)  # fmt: skip


def check_steps(steps: Sequence[Migration]) -> int:
    """The version ``steps`` lead to; they must be numbered 1, 2, ... without gaps."""
    versions = [step.version for step in steps]
    if not versions or versions != list(range(1, len(versions) + 1)):
        raise StoreError(f"migration steps must be numbered 1, 2, ... (got {versions[:10]})")
    return versions[-1]


if check_steps(MIGRATIONS) != SCHEMA_VERSION:  # pragma: no cover - caught by any import
    raise RuntimeError("capgate.gateway.state: MIGRATIONS does not end at SCHEMA_VERSION")


_VERSION_TABLE = """CREATE TABLE schema_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL CHECK (version >= 0),
    written_by TEXT NOT NULL,
    updated_at TEXT NOT NULL
)"""


def read_version(session: Session) -> tuple[int, str | None]:
    """The store's schema version and the capgate that wrote it (0 and None: empty)."""
    if not session.table_exists("schema_version"):
        return 0, None
    rows = session.query("SELECT version, written_by FROM schema_version WHERE id = 1")
    if not rows:
        return 0, None
    return int(rows[0]["version"]), rows[0]["written_by"]


def migrate(
    session: Session,
    *,
    location: str,
    now: str,
    steps: Sequence[Migration] = MIGRATIONS,
    dialect: Dialect,
) -> int:
    """Bring the store to the last version of ``steps`` in one transaction; return it.

    Refuses (StoreVersionError, nothing changed) a store above that version. The
    migration lock makes concurrent openers wait, and the second one finds the
    store already upgraded.
    """
    target = check_steps(steps)
    session.begin(read_only=False)
    try:
        session.lock("migrations")
        found, written_by = read_version(session)
        if found > target:
            raise StoreVersionError(location, found, target, written_by)
        if found < target:
            if not session.table_exists("schema_version"):
                session.execute(_VERSION_TABLE)
            for step in steps[found:]:
                for statement in step.statements(dialect):
                    session.execute(statement)
            params = {"version": target, "written_by": __version__, "now": now}
            if (
                session.execute(
                    "UPDATE schema_version SET version = :version, written_by = :written_by, "
                    "updated_at = :now WHERE id = 1",
                    params,
                )
                == 0
            ):
                session.execute(
                    "INSERT INTO schema_version (id, version, written_by, updated_at) "
                    "VALUES (1, :version, :written_by, :now)",
                    params,
                )
    except BaseException:
        session.finish(commit=False)
        raise
    session.finish(commit=True)
    if found < target:
        _log.info("store %s migrated from schema version %d to %d", location, found, target)
    return target
