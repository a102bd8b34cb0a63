"""A reviewer's comment: one rule, checked before OPA is asked, kept, never sent to OPA.

The rule (:mod:`capgate.gateway.model.comments`) is tested alone, then where it is
used: the store's record, ``Gateway.review`` over a real SQLite store with a scripted
decider standing in for OPA (what OPA is asked, what is written, what is logged), the
review desk and the MCP review tools' schemas.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from capgate.adapters.fronts.answers import proposal_view_answer
from capgate.adapters.fronts.desk import ReviewDesk
from capgate.adapters.fronts.mcp.desk_tools import APPROVE, REJECT, desk_answer, desk_tools
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.digest import params_digest
from capgate.gateway.errors import CapabilityViolation, InvalidInput
from capgate.gateway.model.comments import MAX_COMMENT_CHARS, review_comment
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import Reason
from capgate.gateway.model.facts import Principal, Reviewer
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import ProposalRecord, ProposalStatus, ReviewRecord
from capgate.gateway.state.store import Store
from tests.unit import gateway_support
from tests.unit.scripted_decider import ScriptedDecider, review_decision

PARAMS: dict[str, Any] = {"opportunity_id": "opp-17", "recipient": "ada@example.test"}
MANAGER = Reviewer(id="maria", role="sales_manager", tenant="t", authenticated_by="test:unit")
PROPOSER = Principal(agent="a", role="sales", tenant="t")
#: A comment no log line, OPA input or ledger row may carry.
WORDS = "Checked the amount with Ada on the phone.\n\tOK to send."


# -- the rule -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        (None, None),
        ("", None),
        (" \n\t ", None),
        ("  fine by me  ", "fine by me"),
        ("line one\nline two\twith a tab", "line one\nline two\twith a tab"),
        # A browser's textarea sends CR LF: the newline it is.
        ("line one\r\nline two\r\n", "line one\nline two"),
        ("x" * MAX_COMMENT_CHARS, "x" * MAX_COMMENT_CHARS),
        # Counted once stripped, in characters (not bytes).
        ("  " + "é" * MAX_COMMENT_CHARS + "\n", "é" * MAX_COMMENT_CHARS),
        ("Grüße ✓ 👍", "Grüße ✓ 👍"),
    ],
)
def test_a_comment_is_stripped_and_an_empty_one_is_none(given, kept):
    assert review_comment(given) == kept


@pytest.mark.parametrize(
    ("given", "rule"),
    [
        ("x" * (MAX_COMMENT_CHARS + 1), f"at most {MAX_COMMENT_CHARS} characters"),
        ("é" * (MAX_COMMENT_CHARS + 1), f"at most {MAX_COMMENT_CHARS} characters"),
        ("ok\x00", "no control characters but newline and tab"),
        ("red \x1b[31malert\x1b[0m", "no control characters but newline and tab"),
        ("a lone\rcarriage return", "no control characters but newline and tab"),
        ("\x0b", "no control characters but newline and tab"),  # whitespace, still refused
        ("del \x7f", "no control characters but newline and tab"),
        ("c1 \x85 next line", "no control characters but newline and tab"),
        ("bell \x07", "no control characters but newline and tab"),
        (17, "must be a string"),
        (["a list"], "must be a string"),
    ],
)
def test_a_bad_comment_is_invalid_input_naming_the_field_not_the_text(given, rule):
    with pytest.raises(InvalidInput) as caught:
        review_comment(given)
    message = str(caught.value)
    assert message.startswith("comment: ")
    assert rule in message
    assert caught.value.code == "input_invalid"
    for text in ("alert", "carriage", "xxxx", "bell"):  # the rule is named, not the text
        assert text not in message


def test_the_record_keeps_a_comment_by_the_same_rule():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    fields: dict[str, Any] = {
        "id": "rv-1",
        "proposal_id": "pr-1",
        "reviewer": MANAGER,
        "verdict": "approved",
        "kind": "human",
        "tenant": "t",
        "tool": "quote.prepare_send",
        "operation_id": "op-1",
        "digest": params_digest(PARAMS),
        "expires_at": now + timedelta(hours=1),
        "decision_id": None,
        "created_at": now,
    }
    assert ReviewRecord(**fields).comment is None
    assert ReviewRecord(**fields, comment="  ").comment is None
    assert ReviewRecord(**fields, comment=" why\r\n").comment == "why"
    with pytest.raises(ValidationError, match="no control characters"):
        ReviewRecord(**fields, comment="\x1b")
    with pytest.raises(ValidationError, match="at most 2000 characters"):
        ReviewRecord(**fields, comment="x" * 2001)


# -- the gateway and the desk ------------------------------------------------------------


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


def _proposed(store: Store, proposal_id: str = "pr-1") -> ProposalRecord:
    with store.transaction() as tx:
        return tx.insert_proposal(
            ProposalRecord(
                id=proposal_id,
                tenant="t",
                task_id="task-1",
                proposer=PROPOSER,
                environment="production",
                task={"type": "customer_quote", "linked_resources": []},
                tool="quote.prepare_send",
                contract_version=1,
                execution_action="quote.dispatch_reviewed",
                params=PARAMS,
                params_digest=params_digest(PARAMS),
                operation_id=f"op-{proposal_id}",
                decision_id="d-0",
                status=ProposalStatus.PENDING,
                created_at=tx.now,
                updated_at=tx.now,
            )
        )


def _written(store: Store) -> tuple[list[str], list[Any]]:
    with store.transaction(read_only=True) as tx:
        proposals = tx.list_proposals()
        reviews = [r for p in proposals for r in tx.reviews(p.id)]
    return [row.hash for row in store.ledger()], [proposals, reviews]


def test_a_comment_is_kept_with_the_verdict_and_not_shown_to_opa(
    catalogue: Catalogue, store: Store, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    decider = ScriptedDecider()
    gateway = gateway_support.gateway(catalogue, decider, store)
    commented, plain = _proposed(store, "pr-1"), _proposed(store, "pr-2")
    review = gateway.review(commented.id, MANAGER, "approved", comment=f"  {WORDS}  ")
    assert review.comment == WORDS
    assert gateway.review(plain.id, MANAGER, "rejected").comment is None
    with store.transaction(read_only=True) as tx:
        assert [r.comment for r in tx.reviews(commented.id)] == [WORDS]
        assert [r.comment for r in tx.reviews(plain.id)] == [None]
    # The review policy's input is what it was without comments: no field of its own.
    with_comment, without = (facts.to_opa() for facts in decider.reviewed)
    assert "comment" not in with_comment
    assert with_comment == {
        **without,
        "proposal": {**without["proposal"], "id": commented.id},
        "verdict": "approved",
    }
    assert WORDS not in repr(decider.reviewed)
    # The ledger says whether there was a comment, never what it said.
    rows = [r for r in store.ledger() if r.kind == "review"]
    assert [(r.proposal_id, r.detail["commented"]) for r in rows] == [
        (commented.id, True),
        (plain.id, False),
    ]
    assert not any("Ada on the phone" in str(r.model_dump()) for r in store.ledger())
    assert caplog.records  # the review was logged, without its comment
    assert not any("Ada on the phone" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bad", ["x" * 2001, "ring \x07 ring", "\x00"])
def test_a_bad_comment_is_refused_before_opa_is_asked_and_nothing_is_written(
    catalogue: Catalogue, store: Store, bad: str
):
    decider = ScriptedDecider()
    gateway = gateway_support.gateway(catalogue, decider, store)
    proposal = _proposed(store)
    before = _written(store)
    with pytest.raises(InvalidInput, match=r"^comment: "):
        gateway.review(proposal.id, MANAGER, "approved", comment=bad)
    with pytest.raises(InvalidInput, match=r"^comment: "):
        ReviewDesk(gateway).decide(
            MANAGER, proposal.id, "approved", digest=proposal.params_digest, comment=bad
        )
    assert decider.reviewed == []
    assert _written(store) == before


def test_a_refused_verdict_is_recorded_with_commented_and_not_its_comment(
    catalogue: Catalogue, store: Store
):
    refusal = review_decision(
        allow=False, reasons=[Reason(code="self_review", message="no")], decision_id="r-9"
    )
    gateway = gateway_support.gateway(catalogue, ScriptedDecider(review_answer=refusal), store)
    proposal = _proposed(store)
    with pytest.raises(CapabilityViolation):
        gateway.review(proposal.id, MANAGER, "approved", comment=WORDS)
    (row,) = [r for r in store.ledger() if r.kind == "review"]
    assert (row.outcome, row.detail["commented"]) == ("refused", True)
    with store.transaction(read_only=True) as tx:
        assert tx.reviews(proposal.id) == []


# -- the MCP review tools ------------------------------------------------------------------


def _reviewer_request() -> AgentRequest:
    return AgentRequest.model_validate(
        {
            "principal": {"agent": "maria-bot", "role": "sales_manager", "tenant": "t"},
            "task": {"type": "customer_quote", "id": "task-r", "linked_resources": []},
            "environment": "production",
        }
    )


def test_the_review_tools_take_an_optional_comment(catalogue: Catalogue):
    principal = _reviewer_request().principal
    tools = {t.name: t for t in desk_tools(catalogue, principal)}
    for name in (APPROVE, REJECT):
        schema = tools[name].input_schema
        assert schema["properties"]["comment"]["type"] == "string"
        assert schema["properties"]["comment"]["maxLength"] == MAX_COMMENT_CHARS
        assert schema["required"] == ["proposal_id", "digest"]
        assert "comment" in (tools[name].description or "")


def test_an_mcp_verdict_keeps_its_comment_and_the_view_shows_it(catalogue: Catalogue, store: Store):
    gateway: Gateway = gateway_support.gateway(catalogue, ScriptedDecider(), store)
    desk = ReviewDesk(gateway)
    proposal = _proposed(store)
    request = _reviewer_request()
    arguments = {"proposal_id": proposal.id, "digest": proposal.params_digest}
    bad = desk_answer(desk, request, APPROVE, {**arguments, "comment": "\x1b[2J"})
    assert (bad.error, bad.facts["error"]) == (True, "input_invalid")
    assert bad.facts["message"].startswith("comment: ")
    wrong_type = desk_answer(desk, request, APPROVE, {**arguments, "comment": 7})
    assert wrong_type.facts["message"] == "comment: must be a string"
    answer = desk_answer(desk, request, APPROVE, {**arguments, "comment": WORDS})
    assert answer.error is False, answer.facts
    reviewer = Reviewer.of_agent(request.principal, authenticated_by="mcp")
    shown = proposal_view_answer(desk.show(reviewer, proposal.id))
    assert [r["comment"] for r in shown.facts["reviews"]] == [WORDS]
