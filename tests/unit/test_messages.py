"""Error messages stay short whatever the caller sent: quoted values are cut.

A megabyte-long tool name or connection alias must not come back as a
megabyte-long message (into a log line, an agent transcript, the model's context).
Every caller-supplied value a message quotes goes through ``capgate.gateway.errors.quote``.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from capgate.adapters.fronts.session import AgentSession
from capgate.adapters.tools.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    InvalidInput,
    PolicyUnavailable,
    ToolNotRegistered,
    quote,
)
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import Reason
from capgate.gateway.model.facts import ComposeInput, Reviewer
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state import UnknownProposal
from capgate.gateway.tools.registry import ToolRegistry, require_catalogue_names
from tests.unit import gateway_support
from tests.unit.scripted_decider import ScriptedDecider, compose_decision, execute_decision

MB = 1_000_000
SHORT = 500  # "a few hundred characters"
HUGE_NAME = "t" * MB
BASE: dict[str, Any] = {
    "principal": {"agent": "a", "role": "sales", "tenant": "t"},
    "task": {"type": "customer_quote"},
    "environment": "production",
    "budget_class": "standard",
}
FACTS = ComposeInput.model_validate({**BASE, "connections": {"crm": "active"}})


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


def dispatcher(catalogue: Catalogue, decider: ScriptedDecider) -> Dispatcher:
    tools = InProcessTools()
    tools.register("contact.read", "d", lambda contact_id: {})
    return Dispatcher(catalogue, decider, ToolRegistry(tools))


def short(exc: BaseException) -> str:
    message = str(exc)
    assert len(message) < SHORT, f"{len(message)} characters: {message[:200]}..."
    return message


# -- the helper -----------------------------------------------------------------------


def test_quote_keeps_short_values_as_their_repr():
    assert quote("contact.read") == "'contact.read'"
    assert quote("a'b") == repr("a'b")
    assert quote(7) == "7"


def test_quote_cuts_long_values_and_says_how_long_they_were():
    quoted = quote("x" * MB)
    assert quoted.startswith("'xxxx")
    assert quoted.endswith(f"… ({MB} characters)")
    assert len(quoted) < 120


def test_quote_cuts_values_whose_escapes_are_long():
    quoted = quote("\U0010ffff" * 1000)
    assert len(quoted) < 120
    assert "(1000 characters)" in quoted


@pytest.mark.parametrize(
    "value",
    [["x" * MB], {"k": "x" * MB}, 10**5000, b"x" * MB],
    ids=["list", "dict", "huge int", "bytes"],
)
def test_quote_survives_any_value(value):
    assert len(quote(value)) < 120


def test_quote_survives_a_hostile_repr():
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert "Hostile" in quote(Hostile())


# -- 1 MB caller values through the dispatcher -------------------------------------------


def test_a_megabyte_tool_name_gives_a_short_message_from_call(catalogue):
    decider = ScriptedDecider()
    with pytest.raises(InvalidInput) as caught:
        dispatcher(catalogue, decider).call(FACTS, HUGE_NAME, {"contact_id": "c"})
    assert "(1000000 characters)" in short(caught.value)
    assert decider.asked == []


def test_a_megabyte_tool_name_gives_a_short_message_from_the_agent_session(catalogue, store):
    decider = ScriptedDecider(compose_answer=compose_decision(["contact.read"]))
    gateway = gateway_support.gateway(catalogue, decider, store)
    agent = AgentSession(gateway, gateway_support.request())
    with pytest.raises(InvalidInput) as caught:
        agent.call_tool(HUGE_NAME)
    short(caught.value)
    assert decider.asked == []


def test_a_megabyte_proposal_id_gives_a_short_message(catalogue, store):
    gateway = gateway_support.gateway(catalogue, ScriptedDecider(), store)
    reviewer = Reviewer(id="m", role="sales_manager", tenant="t", authenticated_by="test:fixture")
    with pytest.raises(UnknownProposal) as caught:
        gateway.review(HUGE_NAME, reviewer, "approved")
    assert "(1000000 characters)" in short(caught.value)
    with pytest.raises(UnknownProposal) as caught:
        gateway.dispatch(HUGE_NAME)
    assert "(1000000 characters)" in short(caught.value)


def test_a_megabyte_unknown_field_of_an_agent_request_gives_a_short_message():
    # Like every facts model (below), the request an agent loop or a service builds
    # from what it was sent must not echo a huge unknown key back whole.
    request = {
        "principal": {"agent": "a", "role": "sales", "tenant": "t"},
        "task": {"type": "customer_quote", "id": "task-1"},
        "environment": "production",
    }
    with pytest.raises(ValidationError) as caught:
        AgentRequest.model_validate({**request, HUGE_NAME: 1})
    short(caught.value)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (execute_decision(allow=False, reasons=[Reason(code="unknown_tool", message="m")]), None),
        (execute_decision(allow=True), PolicyUnavailable),
    ],
    ids=["deny", "allow of a tool the catalogue lacks"],
)
def test_tool_names_in_decision_errors_are_cut(catalogue, answer, error):
    long_name = "t" * 128  # as long as a valid name may be
    with pytest.raises(error or CapabilityViolation) as caught:
        dispatcher(catalogue, ScriptedDecider(answer)).call(FACTS, long_name, {})
    assert "(128 characters)" in short(caught.value)


def test_a_megabyte_connection_alias_key_gives_a_short_message(catalogue):
    with pytest.raises(ValidationError) as caught:
        ComposeInput.model_validate({**BASE, "connections": {HUGE_NAME: "active"}})
    short(caught.value)
    assert "connection alias" in str(caught.value)
    wrapped = InvalidInput.from_validation(caught.value, "facts")
    assert "connections" in short(wrapped)


def test_a_megabyte_unknown_field_name_gives_a_short_message():
    with pytest.raises(ValidationError) as caught:
        ComposeInput.model_validate({**BASE, HUGE_NAME: 1})
    assert "unknown field" in short(caught.value)
    with pytest.raises(ValidationError) as caught:
        ComposeInput.model_validate({**BASE, "task": {"type": "x", HUGE_NAME: 1}})
    assert "unknown field" in short(caught.value)


def test_many_bad_fields_are_counted_not_all_listed():
    bad = {**BASE, "connections": {f"c{i}": "gone" for i in range(10_000)}}
    with pytest.raises(ValidationError) as caught:
        ComposeInput.model_validate(bad)
    message = short(InvalidInput.from_validation(caught.value, "facts"))
    assert "and 9997 more problem(s)" in message


def test_a_megabyte_operation_id_gives_a_short_message(catalogue):
    with pytest.raises(InvalidInput) as caught:
        dispatcher(catalogue, ScriptedDecider()).call(
            FACTS, "contact.read", {"contact_id": "c"}, operation_id="o" * MB
        )
    assert "operation_id" in short(caught.value)


def test_megabyte_parameter_names_give_short_messages(catalogue):
    with pytest.raises(InvalidInput) as caught:
        dispatcher(catalogue, ScriptedDecider()).call(
            FACTS, "contact.read", {"contact_id": "c", HUGE_NAME: 1}
        )
    short(caught.value)
    deep_key: dict[str, Any] = {"contact_id": "c", "x": {HUGE_NAME: {1: 2}}}
    with pytest.raises(InvalidInput) as caught:
        dispatcher(catalogue, ScriptedDecider()).call(FACTS, "contact.read", deep_key)
    short(caught.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ToolNotRegistered(HUGE_NAME),
        lambda: CapabilityViolation(HUGE_NAME, [Reason(code="x" * MB, message="m")]),
        lambda: require_catalogue_names([HUGE_NAME, *[f"n{i}" for i in range(100)]], []),
    ],
    ids=["not registered", "denied", "not in catalogue"],
)
def test_every_error_with_a_name_cuts_it(make):
    try:
        error = make()
    except CapgateError as raised:
        error = raised
    short(error)


def test_catalogue_lookups_cut_the_name():
    with pytest.raises(KeyError) as caught:
        load_catalogue(demo_catalogue_dir("sales")).tool(HUGE_NAME)
    short(caught.value)


def test_tool_error_text_kept_in_the_outcome_is_bounded(catalogue):
    def loud(contact_id: str) -> dict[str, Any]:
        raise RuntimeError("x" * MB)

    tools = InProcessTools()
    tools.register("contact.read", "d", loud)
    outcome = Dispatcher(catalogue, ScriptedDecider(), ToolRegistry(tools)).call(
        FACTS, "contact.read", {"contact_id": "c"}
    )
    assert len(outcome.error or "") < 2100
