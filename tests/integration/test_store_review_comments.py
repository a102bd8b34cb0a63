"""A review's comment in the store, on both backends (schema version 7).

A comment goes in with the review and comes back exactly (newlines, tabs, any
script), an absent one is NULL; the store's record refuses a bad one before the row
is written; a store of version 6 is upgraded with its reviews intact and without
comments.
"""

from __future__ import annotations

import pytest

from capgate.gateway.errors import InvalidInput, StoreError
from capgate.gateway.model.comments import MAX_COMMENT_CHARS
from capgate.gateway.state import open_store
from capgate.gateway.state.migrations import MIGRATIONS
from capgate.gateway.state.open import backend_for
from capgate.gateway.state.records import ReviewVerdict
from capgate.gateway.state.sql import SqlStore
from capgate.gateway.state.store import SCHEMA_VERSION, Store
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_support import FakeClock, proposal, raw_query, raw_sql, review

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url
store = fixtures.store
clock = fixtures.clock

WORDS = "Checked with Ada:\n\tamount and recipient are right. Grüße ✓ 👍 «ok»"


def _tenant_and_proposal(store: Store) -> None:
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
        tx.insert_proposal(proposal(tx.now))


def test_a_comment_round_trips_and_none_is_null(store: Store, store_url: str):
    assert store.schema_version() == SCHEMA_VERSION >= 7
    _tenant_and_proposal(store)
    longest = "ü" * MAX_COMMENT_CHARS
    with store.transaction() as tx:
        given = [
            tx.insert_review(review(tx.now, id="rv-0", verdict=ReviewVerdict.REJECTED)),
            tx.insert_review(review(tx.now, id="rv-1").model_copy(update={"comment": WORDS})),
            tx.insert_review(review(tx.now, id="rv-2").model_copy(update={"comment": longest})),
        ]
    with store.transaction(read_only=True) as tx:
        kept = tx.reviews("pr-1")
    assert kept == given
    assert [r.comment for r in kept] == [None, WORDS, longest]
    rows = raw_query(store_url, "SELECT id, comment FROM reviews ORDER BY n")
    assert rows == [("rv-0", None), ("rv-1", WORDS), ("rv-2", longest)]


@pytest.mark.parametrize("bad", ["x" * (MAX_COMMENT_CHARS + 1), "esc \x1b[0m", "nul \x00"])
def test_a_bad_comment_is_refused_by_the_record_and_nothing_is_written(
    store: Store, store_url: str, bad: str
):
    _tenant_and_proposal(store)
    with store.transaction() as tx:
        # model_copy does not validate: the store's own check must catch it.
        record = review(tx.now).model_copy(update={"comment": bad})
        with pytest.raises(InvalidInput, match=r"review: field 'comment': must "):
            tx.insert_review(record)
    assert raw_query(store_url, "SELECT id FROM reviews") == []


def test_a_comment_changed_outside_capgate_is_a_damaged_store(store: Store, store_url: str):
    _tenant_and_proposal(store)
    with store.transaction() as tx:
        tx.insert_review(review(tx.now))
    raw_sql(store_url, [("UPDATE reviews SET comment = ?", ["\x07" * 3])])
    damaged = r"stored review does not validate \(field\(s\) comment\)"
    with pytest.raises(StoreError, match=damaged), store.transaction(read_only=True) as tx:
        tx.reviews("pr-1")


def test_a_version_6_store_is_upgraded_keeping_its_reviews_without_comments(
    store_url: str, clock: FakeClock
):
    sixth = SqlStore(backend_for(store_url), migrations=list(MIGRATIONS[:6]), clock=clock)
    assert sixth.schema_version() == 6
    with sixth.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=None)
        tx.insert_proposal(proposal(tx.now))
    at = "2030-01-02T03:04:05.678901Z"
    # A review as version 6 wrote it: its columns only.
    raw_sql(
        store_url,
        [
            (
                "INSERT INTO reviews (id, proposal_id, reviewer, verdict, kind, tenant, tool, "
                "operation_id, digest, expires_at, consumed_at, decision_id, created_at) VALUES "
                "('rv-old', 'pr-1', ?, 'approved', 'human', 'acme', 'email.send', 'op-1', ?, ?, "
                "NULL, 'dec-7', ?)",
                [
                    '{"authenticated_by":"test:fixture","id":"ada","kind":"person",'
                    '"role":"sales_manager","tenant":"acme"}',
                    fixtures.DIGEST,
                    at,
                    at,
                ],
            )
        ],
    )
    sixth.close()
    upgraded = open_store(store_url, clock=clock)
    try:
        assert upgraded.schema_version() == SCHEMA_VERSION
        with upgraded.transaction() as tx:
            (old,) = tx.reviews("pr-1")
            assert (old.id, old.decision_id, old.comment) == ("rv-old", "dec-7", None)
            assert old.reviewer.id == "ada"
            tx.insert_review(review(tx.now, id="rv-new").model_copy(update={"comment": WORDS}))
        with upgraded.transaction(read_only=True) as tx:
            assert [r.comment for r in tx.reviews("pr-1")] == [None, WORDS]
    finally:
        upgraded.close()
