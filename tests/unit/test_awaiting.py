"""Resume states of reviewed calls awaiting their decision: the server's word, for one
caller and one call, until it expires, once."""

from __future__ import annotations

import pytest

from capgate.adapters.fronts.mcp.awaiting import ResumeStates, call_digest
from capgate.gateway.errors import InvalidInput, ResumeStateInvalid

QUOTE = {"opportunity_id": "opp-17", "amount_cents": 1200, "currency": "EUR"}


def states(clock: list[float]) -> ResumeStates:
    return ResumeStates(key=b"k" * 32, ttl_seconds=60, now=lambda: clock[0])


def test_a_state_is_redeemed_once_by_its_caller_for_its_call():
    clock = [1000.0]
    issued = states(clock)
    digest = call_digest("quote.propose", QUOTE)
    token = issued.issue("sales", "prop-1", digest)
    assert issued.redeem(token, "sales", digest) == "prop-1"
    with pytest.raises(ResumeStateInvalid, match="used already"):
        issued.redeem(token, "sales", digest)


@pytest.mark.parametrize(
    ("caller", "arguments", "says"),
    [
        ("support", QUOTE, "another caller"),
        ("sales", {**QUOTE, "amount_cents": 1}, "other arguments"),
    ],
)
def test_another_caller_or_other_arguments_are_refused_and_leave_the_state(caller, arguments, says):
    clock = [1000.0]
    issued = states(clock)
    digest = call_digest("quote.propose", QUOTE)
    token = issued.issue("sales", "prop-1", digest)
    with pytest.raises(ResumeStateInvalid, match=says) as refused:
        issued.redeem(token, caller, call_digest("quote.propose", arguments))
    assert refused.value.code == "resume_state_invalid"
    assert isinstance(refused.value, InvalidInput)
    assert token not in str(refused.value)
    assert issued.redeem(token, "sales", digest) == "prop-1"  # still the caller's own


def test_a_state_expires_and_another_keys_states_do_not_verify():
    clock = [1000.0]
    issued = states(clock)
    digest = call_digest("quote.propose", QUOTE)
    token = issued.issue("sales", "prop-1", digest)
    clock[0] += 61
    with pytest.raises(ResumeStateInvalid, match="expired"):
        issued.redeem(token, "sales", digest)
    other = ResumeStates(key=b"o" * 32, now=lambda: clock[0])
    with pytest.raises(ResumeStateInvalid, match="signature does not verify"):
        other.redeem(issued.issue("sales", "prop-1", digest), "sales", digest)


@pytest.mark.parametrize("token", [None, 7, "", "a.b.c", "not-base64!.x", "x" * 5000, "e30.e30"])
def test_what_is_not_a_state_is_refused_as_such(token):
    with pytest.raises(ResumeStateInvalid):
        states([1000.0]).redeem(token, "sales", call_digest("t", {}))


def test_a_changed_tool_is_another_call():
    assert call_digest("quote.propose", QUOTE) != call_digest("quote.prepare_send", QUOTE)
