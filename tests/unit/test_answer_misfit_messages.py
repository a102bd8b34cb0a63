"""A decision that does not fit its model is refused with a short message, whatever
the answer's keys: they are chosen by OPA, or by whatever answers in its place."""

from __future__ import annotations

import pytest

from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.decisions import ComposeDecision
from capgate.gateway.policy.answer import Envelope, validate


def _envelope(result: object) -> Envelope:
    return Envelope(result=result, decision_id=None, opa_version=None, bundle_revisions={})


def test_a_long_key_is_cut_short_in_the_refusal() -> None:
    # Found by the atheris answer target: one 1,300-character key under excluded
    # made a 1,391-character message.
    key = "x" * 1300
    with pytest.raises(PolicyUnavailable) as caught:
        validate("capgate/compose/decision", ComposeDecision, _envelope({"excluded": {key: 1}}))
    message = str(caught.value)
    assert "does not fit ComposeDecision" in message
    assert key not in message
    assert len(message) <= 1000


def test_many_misfits_are_counted_not_listed() -> None:
    result = {f"field_{i}": i for i in range(40)}
    with pytest.raises(PolicyUnavailable) as caught:
        validate("capgate/compose/decision", ComposeDecision, _envelope(result))
    message = str(caught.value)
    assert "more)" in message
    assert len(message) <= 1000
