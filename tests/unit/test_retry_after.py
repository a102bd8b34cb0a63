"""A tool's suggested wait is untrusted output: only a usable number survives.

The life-cycle fuzz property found that a NaN ``retry_after_seconds`` came back as
an InvalidInput from the gateway's record of the outcome, after the tool had run.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from adapters.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from gateway.catalogue import load_catalogue
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.registry import ToolRegistry
from gateway.model.contracts import Catalogue
from gateway.model.facts import ComposeInput
from gateway.model.outcomes import OutcomeStatus, ToolRetryable
from tests.unit.scripted_decider import ScriptedDecider


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


@pytest.fixture
def facts() -> ComposeInput:
    return ComposeInput.model_validate(
        {
            "principal": {"agent": "a", "role": "sales", "tenant": "t"},
            "task": {
                "type": "customer_quote",
                "linked_resources": [{"type": "contact", "id": "c-42"}],
            },
            "connections": {"crm": "active"},
            "environment": "production",
            "budget_class": "standard",
        }
    )


@pytest.mark.parametrize(
    ("offered", "kept"),
    [
        (3, 3.0),
        (0, 0.0),
        (2.5, 2.5),
        (math.nan, None),
        (math.inf, None),
        (-math.inf, None),
        (-1, None),
        (True, None),
        ("5", None),
        (1e12, 86_400.0),
    ],
)
def test_only_a_finite_non_negative_wait_is_kept(
    catalogue: Catalogue, facts: ComposeInput, offered: Any, kept: float | None
) -> None:
    def busy(**_: Any) -> dict[str, Any]:
        raise ToolRetryable("busy", retry_after_seconds=offered)

    tools = InProcessTools()
    tools.register("contact.read", "reads a contact", busy)
    outcome = Dispatcher(catalogue, ScriptedDecider(), ToolRegistry(tools)).call(
        facts, "contact.read", {"contact_id": "c"}
    )
    assert outcome.status is OutcomeStatus.RETRYABLE
    assert outcome.retry_after_seconds == kept
    # Whatever the tool said, the outcome is plain JSON a store can record.
    json.dumps(outcome.model_dump(mode="json"), allow_nan=False)
