"""Fail closed on any input: bounded nesting and size, and only capgate's own errors.

Whatever a caller (an agent loop feeding a model's output) passes to
``Dispatcher.call``, ``Dispatcher.compose``, ``AgentSession`` or the ``Gateway``, the
answer is a capgate error from :mod:`capgate.gateway.errors` before OPA or the tool is
touched, or an Outcome once the tool has run. Sessions and gateways run over a real
SQLite store (the ``store`` fixture). Nesting is refused by an explicit, iterative check
(never a ``RecursionError`` half-way through json, jsonschema or pydantic).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from capgate.adapters.fronts.session import AgentSession
from capgate.adapters.tools.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.digest import (
    MAX_DEPTH,
    MAX_OUTPUT_BYTES,
    MAX_PARAMS_BYTES,
    canonical_json,
    params_digest,
    plain_json,
)
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import InvalidInput, PolicyUnavailable, ToolFailed
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import Reason
from capgate.gateway.model.facts import Approval, Budget, ComposeInput, Reviewer
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry
from tests.unit import gateway_support
from tests.unit.scripted_decider import (
    ScriptedDecider,
    compose_decision,
    execute_decision,
    review_decision,
)

# A schema that accepts any nesting, so only the explicit limits can refuse it.
DEEP_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"contact_id": {"type": "string"}, "doc": {}},
    "required": ["contact_id"],
}


def nested(depth: int, leaf: Any = "x") -> Any:
    """A value with ``depth`` levels of objects: ``{"a": {"a": ... leaf}}``."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    sales = load_catalogue(demo_catalogue_dir("sales"))
    contract = sales.tools["contact.read"].model_copy(
        update={"input_schema": DEEP_TOOL_SCHEMA, "output_schema": {"type": "object"}}
    )
    return sales.model_copy(update={"tools": {**sales.tools, "contact.read": contract}})


FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "a", "role": "sales", "tenant": "t"},
        "task": {"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c"}]},
        "connections": {"crm": "active"},
        "environment": "production",
        "budget_class": "standard",
    }
)


class Tool:
    """contact.read that records its calls and returns what it is told to."""

    def __init__(self, returns: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.returns = returns

    def __call__(self, **params: Any) -> Any:
        self.calls.append(params)
        return {"ok": True} if self.returns is None else self.returns


def dispatcher(catalogue: Catalogue, tool: Tool, decider: ScriptedDecider | None = None):
    tools = InProcessTools()
    tools.register("contact.read", "d", tool)
    return Dispatcher(catalogue, decider or ScriptedDecider(), ToolRegistry(tools))


def gateway(catalogue: Catalogue, tool: Tool, decider: ScriptedDecider, store: Store) -> Gateway:
    tools = InProcessTools()
    tools.register("contact.read", "d", tool)
    return gateway_support.gateway(catalogue, decider, store, tools)


def session(catalogue: Catalogue, tool: Tool, decider: ScriptedDecider, store: Store):
    return AgentSession(gateway(catalogue, tool, decider, store), gateway_support.request())


# -- A: nesting and size of parameters ----------------------------------------------


def test_params_nested_a_thousand_deep_are_invalid_input_naming_the_limit(catalogue):
    tool, decider = Tool(), ScriptedDecider()
    params = {"contact_id": "c", "doc": nested(1000)}
    with pytest.raises(InvalidInput, match=f"limit of {MAX_DEPTH} levels"):
        dispatcher(catalogue, tool, decider).call(FACTS, "contact.read", params)
    assert decider.asked == []
    assert tool.calls == []


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_any_depth_is_refused_without_touching_the_stack(catalogue, depth):
    # Far past the recursion limit: only an iterative check gets here unharmed.
    assert depth > sys.getrecursionlimit()
    params = {"contact_id": "c", "doc": nested(depth)}
    with pytest.raises(InvalidInput, match="nested deeper"):
        dispatcher(catalogue, Tool()).call(FACTS, "contact.read", params)


def test_arrays_count_as_levels_too(catalogue):
    doc: Any = "x"
    for _ in range(MAX_DEPTH):
        doc = [doc]
    params = {"contact_id": "c", "doc": doc}  # the params object is one more level
    with pytest.raises(InvalidInput, match="nested deeper"):
        dispatcher(catalogue, Tool()).call(FACTS, "contact.read", params)


def test_nesting_up_to_the_limit_runs(catalogue):
    tool = Tool()
    params = {"contact_id": "c", "doc": nested(MAX_DEPTH - 1)}  # params object: level 1
    outcome = dispatcher(catalogue, tool).call(FACTS, "contact.read", params)
    assert outcome.status is OutcomeStatus.SUCCESS
    assert tool.calls == [params]


def test_nesting_one_past_the_limit_is_refused(catalogue):
    params = {"contact_id": "c", "doc": nested(MAX_DEPTH)}
    with pytest.raises(InvalidInput, match=f"limit of {MAX_DEPTH} levels"):
        dispatcher(catalogue, Tool()).call(FACTS, "contact.read", params)


def test_params_larger_than_the_size_limit_are_refused(catalogue):
    decider = ScriptedDecider()
    params = {"contact_id": "c", "doc": "x" * MAX_PARAMS_BYTES}
    with pytest.raises(InvalidInput, match=f"limit of {MAX_PARAMS_BYTES} bytes"):
        dispatcher(catalogue, Tool(), decider).call(FACTS, "contact.read", params)
    assert decider.asked == []


def test_size_counts_utf8_bytes_not_characters(catalogue):
    # 400,000 characters, 1.2 MB of UTF-8: refused although shorter in characters.
    params = {"contact_id": "c", "doc": "€" * 400_000}
    with pytest.raises(InvalidInput, match="bytes"):
        dispatcher(catalogue, Tool()).call(FACTS, "contact.read", params)


def test_many_small_values_count_towards_the_size(catalogue):
    params = {"contact_id": "c", "doc": [0] * (MAX_PARAMS_BYTES // 2 + 1)}
    with pytest.raises(InvalidInput, match="bytes"):
        dispatcher(catalogue, Tool()).call(FACTS, "contact.read", params)


def test_params_digest_refuses_deep_values_as_invalid_input():
    with pytest.raises(InvalidInput, match="nested deeper"):
        params_digest({"doc": nested(5000)})


def test_canonical_json_refuses_deep_values_as_invalid_input():
    with pytest.raises(InvalidInput, match="nested deeper"):
        canonical_json(nested(5000))


def test_a_self_containing_value_is_refused_not_looped_over():
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(InvalidInput, match="nested deeper"):
        plain_json(loop)


def test_the_copy_is_plain_whatever_subclasses_the_caller_used():
    from enum import IntEnum, StrEnum

    class Tier(IntEnum):
        GOLD = 1

    class Code(StrEnum):
        EUR = "EUR"

    class Sneaky(dict):  # type: ignore[type-arg]
        def items(self):  # what json.dumps would have used
            return [("contact_id", "someone-else")]

    copy = plain_json({"t": Tier.GOLD, "c": Code.EUR, "s": Sneaky(contact_id="c"), "l": (1, 2)})
    assert copy == {"t": 1, "c": "EUR", "s": {"contact_id": "c"}, "l": [1, 2]}
    assert type(copy["t"]) is int
    assert type(copy["c"]) is str
    assert type(copy["s"]) is dict


# -- A: tool output -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("returned", "says"),
    [
        (nested(1000), "nested deeper"),
        (nested(200_000), "nested deeper"),
        ({"doc": "x" * (MAX_OUTPUT_BYTES + 1)}, "bytes"),
        ({1: "int key"}, "key"),
        ({"n": float("nan")}, "finite"),
        ({"s": {1, 2}}, "set"),
    ],
)
def test_output_that_is_too_deep_big_or_not_json_is_an_unknown_outcome(catalogue, returned, says):
    outcome = dispatcher(catalogue, Tool(returns=returned)).call(
        FACTS, "contact.read", {"contact_id": "c"}
    )
    assert outcome.status is OutcomeStatus.UNKNOWN
    assert outcome.recovery == catalogue.tools["contact.read"].recovery
    assert says in (outcome.error or "")
    assert outcome.result is None


def test_output_whose_mapping_fails_while_read_is_an_unknown_outcome(catalogue):
    class Broken(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise RuntimeError("boom")

        def __iter__(self) -> Iterator[str]:
            raise RuntimeError("boom")

        def __len__(self) -> int:
            return 1

    outcome = dispatcher(catalogue, Tool(returns=Broken())).call(
        FACTS, "contact.read", {"contact_id": "c"}
    )
    assert outcome.status is OutcomeStatus.UNKNOWN


def test_agent_session_refuses_deep_params_and_turns_deep_output_into_tool_failed(catalogue, store):
    tool = Tool()
    decider = ScriptedDecider(compose_answer=compose_decision(["contact.read"]))
    agent = session(catalogue, tool, decider, store)
    with pytest.raises(InvalidInput, match=f"limit of {MAX_DEPTH} levels"):
        agent.call_tool("contact.read", contact_id="c", doc=nested(1000))
    assert tool.calls == []

    tool.returns = nested(1000)
    with pytest.raises(ToolFailed) as caught:
        agent.call_tool("contact.read", contact_id="c")
    assert caught.value.outcome.status is OutcomeStatus.UNKNOWN


# -- nothing but capgate errors, for any malformed input ------------------------------


class RaisingMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1


class RaisingIterable:
    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("boom")


def _approval() -> Approval:
    return Approval(
        kind="exact_content_and_recipient",
        tool="contact.read",
        operation_id="op-1",
        tenant="t",
        digest="sha256:" + "0" * 64,
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
        approved_by="p",
        used=False,
    )


Call = Callable[[Dispatcher], Any]


def call(tool: Any = "contact.read", params: Any = None, **kw: Any) -> Call:
    params = {"contact_id": "c"} if params is None else params
    return lambda d: d.call(FACTS, tool, params, **kw)


MALFORMED: dict[str, Call] = {
    "params not a mapping (list)": call(params=[("contact_id", "c")]),
    "params None": lambda d: d.call(FACTS, "contact.read", None),  # type: ignore[arg-type]
    "params a string": call(params="contact_id=c"),
    "params not a mapping (int)": call(params=7),
    "params a mapping that raises": call(params=RaisingMapping()),
    "non-string key": call(params={"contact_id": "c", 1: "x"}),
    "non-string key colliding with a string key": call(
        params={"contact_id": "c", 1: "a", "1": "b"}
    ),
    "tuple key": call(params={("a",): 1, "contact_id": "c"}),
    "bytes value": call(params={"contact_id": b"c"}),
    "bytes key": call(params={b"contact_id": "c"}),
    "huge int": call(params={"contact_id": "c", "doc": 10**5000}),
    "NaN": call(params={"contact_id": "c", "doc": float("nan")}),
    "infinity": call(params={"contact_id": "c", "doc": float("-inf")}),
    "lone surrogate value": call(params={"contact_id": "\udc80"}),
    "lone surrogate key": call(params={"contact_id": "c", "\ud800": 1}),
    "set value": call(params={"contact_id": "c", "doc": {1}}),
    "object value": call(params={"contact_id": "c", "doc": object()}),
    "deep nesting": call(params={"contact_id": "c", "doc": nested(100_000)}),
    "deep list nesting": call(params={"contact_id": "c", "doc": [nested(70)]}),
    "tool name not a string (int)": call(tool=7),
    "tool name unhashable (list)": call(tool=["contact.read"]),
    "tool name None": call(tool=None),
    "tool name bytes": call(tool=b"contact.read"),
    "facts not a ComposeInput": lambda d: d.call({"principal": {}}, "contact.read", {}),
    "facts None": lambda d: d.call(None, "contact.read", {"contact_id": "c"}),
    "operation id not a string": call(operation_id=12),
    "operation id zero": call(operation_id=0),
    "operation id bytes": call(operation_id=b"op-1"),
    "operation id with a space": call(operation_id="has space"),
    "operation id 1 MB": call(operation_id="o" * 1_000_000),
    "approval a dict": call(approval={"kind": "x"}),
    "approval a string": call(approval="yes"),
    "approval a dict of a real approval": call(approval=_approval().model_dump()),
    "stage a string": call(stage="call"),
    "stage None": call(stage=None),
    "budget a dict": call(budget={"remaining": None, "cost": 0}),
    "budget a number": call(budget=10),
    "proposal a dict": call(proposal={"id": "p", "status": "approved"}),
    "proposal an id": call(proposal="p"),
    "evidence one string": call(evidence="invoice_approved"),
    "evidence of ints": call(evidence=[1, 2]),
    "evidence unhashable items": call(evidence=[["a"]]),
    "evidence not iterable": call(evidence=5),
    "evidence raising": call(evidence=RaisingIterable()),
    "evidence with a space": call(evidence=["has space"]),
    "subject id not a string": call(params={"contact_id": 7}),
    "compose facts a dict": lambda d: d.compose({"principal": {}}),  # type: ignore[arg-type]
    "compose facts None": lambda d: d.compose(None),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("attempt", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_input_is_invalid_input_before_opa_and_the_tool(catalogue, attempt):
    tool, decider = Tool(), ScriptedDecider()
    with pytest.raises(InvalidInput):
        attempt(dispatcher(catalogue, tool, decider))
    assert decider.asked == []
    assert decider.composed == []
    assert tool.calls == []


SESSION_MALFORMED: dict[str, Callable[[AgentSession], Any]] = {
    "tool name an int": lambda s: s.call_tool(7),  # type: ignore[arg-type]
    "tool name a list": lambda s: s.call_tool(["contact.read"]),  # type: ignore[arg-type]
    "bytes value": lambda s: s.call_tool("contact.read", contact_id=b"c"),
    "huge int": lambda s: s.call_tool("contact.read", contact_id="c", doc=10**5000),
    "NaN": lambda s: s.call_tool("contact.read", contact_id="c", doc=float("nan")),
    "lone surrogate": lambda s: s.call_tool("contact.read", contact_id="\ud800"),
    "deep": lambda s: s.call_tool("contact.read", contact_id="c", doc=nested(50_000)),
    "non-string key inside": lambda s: s.call_tool("contact.read", contact_id="c", doc={1: 2}),
}


@pytest.mark.parametrize("attempt", SESSION_MALFORMED.values(), ids=SESSION_MALFORMED.keys())
def test_agent_session_refuses_malformed_calls_with_invalid_input(catalogue, store, attempt):
    tool, decider = Tool(), ScriptedDecider(compose_answer=compose_decision(["contact.read"]))
    agent = session(catalogue, tool, decider, store)
    with pytest.raises(InvalidInput):
        attempt(agent)
    assert decider.asked == []
    assert tool.calls == []


# -- a caller cannot assert the facts that grant ---------------------------------------
#
# The old session took evidence and approvals from its caller (and refused malformed
# ones). Now there is no way to pass them at all: the gateway reads them from its store.


REQUEST = {
    "principal": {"agent": "a", "role": "sales", "tenant": "t"},
    "task": {"type": "customer_quote", "id": "task-1"},
    "environment": "production",
}


@pytest.mark.parametrize(
    "extra",
    [
        {"evidence": ["invoice_approved"]},
        {"approval": _approval().model_dump(mode="json")},
        {"approvals": {"contact.read": {"kind": "x"}}},
        {"connections": {"crm": "active"}},
        {"budget_class": "unlimited"},
        {"budget": {"remaining": None, "cost": 0}},
        {"stage": "dispatch"},
        {"proposal": {"id": "p", "status": "approved"}},
    ],
    ids=lambda extra: next(iter(extra)),
)
def test_an_agent_request_has_no_field_for_a_fact_that_grants(extra):
    with pytest.raises(ValidationError) as caught:
        AgentRequest.model_validate({**REQUEST, **extra})
    assert caught.value.error_count() == 1
    assert next(iter(extra)) in str(caught.value)  # the refused field is named


def test_an_agent_request_needs_a_task_id():
    task = {"type": "customer_quote"}
    with pytest.raises(ValidationError, match="task needs an id"):
        AgentRequest.model_validate({**REQUEST, "task": task})


@pytest.mark.parametrize("option", ["evidence", "approvals", "facts"])
def test_a_session_takes_no_evidence_or_approvals(catalogue, store, option):
    gate = gateway(catalogue, Tool(), ScriptedDecider(), store)
    with pytest.raises(TypeError):
        AgentSession(gate, gateway_support.request(), **{option: []})  # type: ignore[call-arg]


def test_evidence_or_approval_passed_as_call_arguments_are_only_tool_parameters(catalogue, store):
    # contact.read's schema here accepts any extra field: what the agent sends under
    # these names reaches the tool as parameters and never becomes a fact OPA reads.
    tool = Tool()
    decider = ScriptedDecider(compose_answer=compose_decision(["contact.read"]))
    agent = session(catalogue, tool, decider, store)
    agent.call_tool(
        "contact.read",
        contact_id="c",
        approval=_approval().model_dump(mode="json"),
        evidence=["invoice_approved"],
        budget={"remaining": None, "cost": 0},
    )
    asked = decider.asked[0]
    assert asked.approval is None
    assert asked.evidence == []
    assert asked.budget == Budget(remaining=None, cost=0)
    assert set(tool.calls[0]) == {"contact_id", "approval", "evidence", "budget"}


def test_agent_session_refuses_a_request_that_is_not_an_agent_request(catalogue, store):
    gate = gateway(catalogue, Tool(), ScriptedDecider(), store)
    with pytest.raises(InvalidInput, match="AgentRequest"):
        AgentSession(gate, FACTS)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="AgentRequest"):
        AgentSession(gate, {"principal": {}})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="AgentRequest"):
        gate.call(FACTS, "contact.read", {"contact_id": "c"})  # type: ignore[arg-type]


# -- the gateway's review and dispatch refuse malformed arguments -----------------------

REVIEWER = Reviewer(id="m", role="sales_manager", tenant="t", authenticated_by="test:fixture")
QUOTE = {"opportunity_id": "opp-1", "amount_cents": 100, "currency": "EUR"}


def _proposed(catalogue: Catalogue, store: Store, decider: ScriptedDecider) -> tuple[Gateway, str]:
    gate = gateway(catalogue, Tool(), decider, store)
    proposal = gate.call(gateway_support.request(), "quote.propose", QUOTE)
    assert not isinstance(proposal, Outcome)
    return gate, proposal.id


@pytest.mark.parametrize(
    "attempt",
    [
        lambda g, p: g.review(
            p, {"agent": "m", "role": "sales_manager", "tenant": "t"}, "approved"
        ),
        lambda g, p: g.review(p, REVIEWER, "maybe"),
        lambda g, p: g.review(p, REVIEWER, None),
        lambda g, p: g.review(p, REVIEWER, "approved", ttl=timedelta(0)),
        lambda g, p: g.review(p, REVIEWER, "approved", ttl=timedelta(seconds=-1)),
        lambda g, p: g.review(7, REVIEWER, "approved"),
        lambda g, p: g.dispatch(["p"]),
    ],
    ids=[
        "reviewer a dict",
        "verdict unknown",
        "verdict None",
        "approval lives zero seconds",
        "approval lives negative time",
        "proposal id an int",
        "dispatch of a list",
    ],
)
def test_review_and_dispatch_refuse_malformed_arguments_before_opa(catalogue, store, attempt):
    decider = ScriptedDecider()
    gate, proposal = _proposed(catalogue, store, decider)
    asked = len(decider.asked)
    with pytest.raises(InvalidInput):
        attempt(gate, proposal)
    assert decider.reviewed == []
    assert len(decider.asked) == asked


@pytest.mark.parametrize(
    "ttl", [timedelta.max, timedelta(days=10**8)], ids=["timedelta.max", "a hundred million days"]
)
def test_an_approval_that_would_outlive_the_calendar_is_invalid_input(catalogue, store, ttl):
    # Its expiry cannot be written down: refused as a capgate error (not an
    # OverflowError from the date arithmetic), and nothing is recorded.
    decider = ScriptedDecider()
    gate, proposal = _proposed(catalogue, store, decider)
    with pytest.raises(InvalidInput):
        gate.review(proposal, REVIEWER, "approved", ttl=ttl)
    with store.transaction(read_only=True) as tx:
        assert tx.reviews(proposal) == []
        stored = tx.get_proposal(proposal)
    assert stored is not None
    assert stored.status.value == "pending"


@pytest.mark.parametrize(
    "failure",
    [RuntimeError("bug"), TimeoutError()],
)
def test_a_review_decider_that_fails_its_own_way_fails_closed(catalogue, store, failure):
    decider = ScriptedDecider()
    gate, proposal = _proposed(catalogue, store, decider)
    decider.error = failure
    with pytest.raises(PolicyUnavailable, match="failing closed"):
        gate.review(proposal, REVIEWER, "approved")
    with store.transaction(read_only=True) as tx:
        assert tx.reviews(proposal) == []


@pytest.mark.parametrize(
    "answer",
    [
        lambda _facts: execute_decision(),
        lambda _facts: {"allow": True, "reasons": []},
        lambda _facts: review_decision(reasons=[Reason(code="self_review", message="m")]),
    ],
    ids=["an execute decision", "a dict", "an allow with reasons"],
)
def test_a_review_answer_that_is_not_a_clean_allow_fails_closed(catalogue, store, answer):
    decider = ScriptedDecider(review_answer=answer)
    gate, proposal = _proposed(catalogue, store, decider)
    with pytest.raises(PolicyUnavailable):
        gate.review(proposal, REVIEWER, "approved")
    with store.transaction(read_only=True) as tx:
        assert tx.reviews(proposal) == []
        stored = tx.get_proposal(proposal)
    assert stored is not None
    assert stored.status.value == "pending"


@pytest.mark.parametrize("failure", [RuntimeError("bug"), TimeoutError(), KeyError("x")])
def test_a_decider_that_fails_its_own_way_fails_closed(catalogue, failure):
    tool = Tool()
    decider = ScriptedDecider(error=failure)
    with pytest.raises(PolicyUnavailable, match="failing closed"):
        dispatcher(catalogue, tool, decider).call(FACTS, "contact.read", {"contact_id": "c"})
    with pytest.raises(PolicyUnavailable):
        dispatcher(catalogue, tool, decider).compose(FACTS)
    assert tool.calls == []


@pytest.mark.parametrize(
    "answer",
    [None, "allow", {"allow": True, "reasons": [], "obligations": []}, object()],
    ids=["None", "a string", "a dict", "an object"],
)
def test_a_decider_answer_of_the_wrong_type_fails_closed(catalogue, answer):
    tool = Tool()
    decider = ScriptedDecider(execute_answer=lambda _facts: answer, compose_answer=answer)
    with pytest.raises(PolicyUnavailable):
        dispatcher(catalogue, tool, decider).call(FACTS, "contact.read", {"contact_id": "c"})
    if answer is not None:  # None means "the default answer" to the scripted decider
        with pytest.raises(PolicyUnavailable):
            dispatcher(catalogue, tool, decider).compose(FACTS)
    assert tool.calls == []


def test_many_small_numbers_under_the_size_limit_are_accepted():
    """The size limit counts what canonical JSON writes: 45,000 times ``0.0`` is about
    180 kB, far under 1 MiB, and must not be refused as too large."""
    from capgate.gateway.digest import MAX_PARAMS_BYTES, plain_params

    params = {"values": [0.0] * 45_000, "flags": [None, True, False] * 10_000}
    copy, canonical = plain_params(params)
    assert len(canonical) < MAX_PARAMS_BYTES
    assert copy["values"][0] == 0.0
    too_big = {"values": [0.123456789] * 120_000}  # about 1.4 MB written out
    with pytest.raises(InvalidInput, match="larger than the limit"):
        plain_params(too_big)
