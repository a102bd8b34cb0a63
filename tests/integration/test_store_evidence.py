"""Evidence about a subject, with an expiry, in the store, on both backends (schema
version 8, #21).

The same name about two subjects is two pieces; recorded again, a piece keeps its
first record unless the new one lasts longer (evidence shown again is renewed,
never shortened); a subject is a type and an id or nothing; a store of version 7 is
upgraded with its evidence intact, about nothing and never expiring, which meets
exactly the requirements it met before.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from capgate.gateway.errors import InvalidInput
from capgate.gateway.model.facts import EvidencePiece, EvidenceSubject
from capgate.gateway.state import open_store
from capgate.gateway.state.migrations import MIGRATIONS
from capgate.gateway.state.open import backend_for
from capgate.gateway.state.sql import SqlStore
from capgate.gateway.state.store import SCHEMA_VERSION, Store
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_support import FakeClock, raw_query, raw_sql

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

INV_9 = EvidenceSubject(type="invoice", id="inv-9")
INV_10 = EvidenceSubject(type="invoice", id="inv-10")


def _tenant(store: Store) -> None:
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)


def test_the_same_name_about_two_subjects_is_two_pieces(store: Store, clock: FakeClock):
    assert store.schema_version() == SCHEMA_VERSION >= 8
    _tenant(store)
    with store.transaction() as tx:
        nine = tx.record_evidence("acme", "t-1", "invoice_approved", source="op:1", subject=INV_9)
        ten = tx.record_evidence("acme", "t-1", "invoice_approved", source="op:2", subject=INV_10)
        plain = tx.record_evidence("acme", "t-1", "invoice_approved", source="op:3")
        again = tx.record_evidence("acme", "t-1", "invoice_approved", source="op:4", subject=INV_9)
    assert (nine.subject, ten.subject, plain.subject) == (INV_9, INV_10, None)
    assert again == nine  # recorded once: the first source and time are kept
    with store.transaction(read_only=True) as tx:
        pieces = tx.evidence_records("acme", "t-1")
        assert tx.evidence("acme", "t-1") == {"invoice_approved"}
    assert [(p.subject, p.source) for p in pieces] == [
        (None, "op:3"),
        (INV_10, "op:2"),
        (INV_9, "op:1"),
    ]
    assert pieces[0].piece() == EvidencePiece(name="invoice_approved")


def test_a_piece_is_renewed_by_a_later_expiry_and_never_shortened(store: Store, clock: FakeClock):
    _tenant(store)
    start = clock.now
    with store.transaction() as tx:
        first = tx.record_evidence(
            "acme",
            "t-1",
            "seen",
            source="op:1",
            subject=INV_9,
            expires_at=start + timedelta(hours=1),
        )
    clock.advance(minutes=10)
    with store.transaction() as tx:
        # Shorter than what the store holds: the first record stays.
        shorter = tx.record_evidence(
            "acme",
            "t-1",
            "seen",
            source="op:2",
            subject=INV_9,
            expires_at=start + timedelta(minutes=30),
        )
        assert shorter == first
        longer = tx.record_evidence(
            "acme",
            "t-1",
            "seen",
            source="op:3",
            subject=INV_9,
            expires_at=clock.now + timedelta(hours=1),
        )
        assert (longer.source, longer.recorded_at) == ("op:3", clock.now)
        assert longer.expires_at == clock.now + timedelta(hours=1)
        # Never expiring outlasts everything, and then nothing replaces it.
        forever = tx.record_evidence("acme", "t-1", "seen", source="op:4", subject=INV_9)
        assert (forever.source, forever.expires_at) == ("op:4", None)
        later = tx.record_evidence(
            "acme",
            "t-1",
            "seen",
            source="op:5",
            subject=INV_9,
            expires_at=clock.now + timedelta(days=9),
        )
        assert later == forever


def test_a_bad_subject_or_expiry_is_refused_and_nothing_is_written(store: Store, store_url: str):
    _tenant(store)
    with store.transaction() as tx:
        with pytest.raises(InvalidInput, match=r"evidence: field 'subject.id'"):
            tx.record_evidence(
                "acme",
                "t-1",
                "seen",
                source="s",
                subject={"type": "invoice", "id": ""},  # type: ignore[arg-type]
            )
        with pytest.raises(InvalidInput, match=r"evidence: field 'expires_at'"):
            tx.record_evidence("acme", "t-1", "seen", source="s", expires_at="soon")  # type: ignore[arg-type]
    assert raw_query(store_url, "SELECT name FROM evidence") == []


def test_a_version_7_store_is_upgraded_keeping_its_evidence_about_nothing(
    store_url: str, clock: FakeClock
):
    seventh = SqlStore(backend_for(store_url), migrations=list(MIGRATIONS[:7]), clock=clock)
    assert seventh.schema_version() == 7
    with seventh.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
    # Evidence as version 7 wrote it: a name per task, its columns only.
    raw_sql(
        store_url,
        [
            (
                "INSERT INTO evidence (tenant, task_id, name, source, recorded_at) VALUES "
                "('acme', 't-1', 'invoice_approved', 'operation:op-1', ?)",
                ["2030-01-02T03:04:05.678901Z"],
            )
        ],
    )
    seventh.close()
    upgraded = open_store(store_url, clock=clock)
    try:
        assert upgraded.schema_version() == SCHEMA_VERSION
        with upgraded.transaction() as tx:
            [old] = tx.evidence_records("acme", "t-1")
            assert (old.name, old.source, old.subject, old.expires_at) == (
                "invoice_approved",
                "operation:op-1",
                None,
                None,
            )
            # The same name about a subject is a new piece beside it.
            tx.record_evidence("acme", "t-1", "invoice_approved", source="op:2", subject=INV_9)
        with upgraded.transaction(read_only=True) as tx:
            assert [p.subject for p in tx.evidence_records("acme", "t-1")] == [None, INV_9]
    finally:
        upgraded.close()
