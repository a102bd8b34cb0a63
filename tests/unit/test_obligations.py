"""An allow runs only with exactly the obligations the tool's contract requires.

The dispatcher derives them from the contract (an ``idempotent_with_key`` tool must
receive the call's operation id as its idempotency key; other tools need nothing)
and refuses an allow whose obligations differ in any way, before any adapter is
looked up: missing, extra, repeated, unknown, or with other parameters.
"""

from __future__ import annotations

from typing import Any

import pytest

from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.enforce.verify import required_obligations, verify_execute
from capgate.gateway.errors import ObligationUnsupported
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.decisions import Obligation
from capgate.gateway.model.facts import ComposeInput, ExecuteInput, Stage
from capgate.gateway.model.outcomes import OutcomeStatus
from capgate.gateway.tools.contract import CallContext, Secret
from capgate.gateway.tools.registry import ToolRegistry
from tests.unit.scripted_decider import ScriptedDecider, execute_decision, key_obligation

FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "a", "role": "finance", "tenant": "t"},
        "task": {"type": "invoice_payment"},
        "connections": {"crm": "active", "bank": "active", "sales_mailbox": "active"},
        "environment": "production",
        "budget_class": "unlimited",
    }
)
OPERATION = "pay-inv-9"
PAYMENT = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


class Recorder:
    """An adapter that holds every sales tool and records what each call was given."""

    def __init__(self) -> None:
        self.contexts: list[CallContext] = []

    def names(self) -> list[str]:
        return ["payment.execute", "contact.read"]

    def has(self, name: str) -> bool:
        return name in self.names()

    def describe(self, name: str) -> str | None:
        return None

    def run(self, name: str, params: Any, context: CallContext) -> dict[str, Any]:
        self.contexts.append(context)
        if name == "payment.execute":
            return {"payment_id": "p-1", "status": "executed"}
        return {"contact_id": "c", "name": "n", "email": "n@example.test"}


def _stage(tool: str) -> Stage:
    """Where the tool runs: a payment needs review, so it runs when dispatched."""
    return Stage.DISPATCH if tool == "payment.execute" else Stage.CALL


def call(catalogue: Catalogue, tool: str, obligations: list[Obligation]) -> Recorder:
    adapter = Recorder()
    decider = ScriptedDecider(execute_decision(obligations=obligations))
    params = PAYMENT if tool == "payment.execute" else {"contact_id": "c"}
    outcome = Dispatcher(catalogue, decider, ToolRegistry(adapter)).call(
        FACTS, tool, params, operation_id=OPERATION, stage=_stage(tool)
    )
    assert outcome.status is OutcomeStatus.SUCCESS
    return adapter


def refused(
    catalogue: Catalogue, tool: str, obligations: list[Obligation], stage: Stage | None = None
) -> str:
    adapter = Recorder()
    decider = ScriptedDecider(execute_decision(obligations=obligations))
    params = PAYMENT if tool == "payment.execute" else {"contact_id": "c"}
    with pytest.raises(ObligationUnsupported) as caught:
        Dispatcher(catalogue, decider, ToolRegistry(adapter)).call(
            FACTS, tool, params, operation_id=OPERATION, stage=stage or _stage(tool)
        )
    assert adapter.contexts == []  # the tool was never entered
    assert caught.value.code == "obligation_unsupported"
    assert caught.value.reason_codes
    assert set(caught.value.reason_codes) == {"obligation_unsupported"}
    return str(caught.value)


KEY = key_obligation(OPERATION)


def test_a_keyed_tool_runs_with_the_operation_id_as_its_key(catalogue):
    adapter = call(catalogue, "payment.execute", [KEY])
    assert adapter.contexts[0].idempotency_key == OPERATION
    assert adapter.contexts[0].operation_id == OPERATION


def test_an_unkeyed_tool_runs_with_no_obligation_and_no_key(catalogue):
    adapter = call(catalogue, "contact.read", [])
    assert adapter.contexts[0].idempotency_key is None


@pytest.mark.parametrize(
    ("obligations", "says"),
    [
        ([], "missing"),
        ([KEY, KEY], "given 2 times"),
        ([key_obligation("another-operation")], "exactly the params"),
        ([key_obligation("")], "exactly the params"),
        ([Obligation(code="pass_idempotency_key")], "exactly the params"),
        ([Obligation(code="pass_idempotency_key", params={"key": 7})], "exactly the params"),
        (
            [Obligation(code="pass_idempotency_key", params={"key": OPERATION, "ttl": 60})],
            "exactly the params",
        ),
        ([Obligation(code="pass_idempotency_key", params={"Key": OPERATION})], "exactly the"),
        ([KEY, Obligation(code="notify_regulator")], "not one this dispatcher knows"),
        ([Obligation(code="notify_regulator")], "not one this dispatcher knows"),
    ],
    ids=[
        "missing",
        "duplicated",
        "another operation's key",
        "empty key",
        "no params",
        "a key that is not a string",
        "extra params",
        "misspelt param",
        "an unknown one beside it",
        "an unknown one instead",
    ],
)
def test_a_keyed_tool_refuses_any_other_obligations(catalogue, obligations, says):
    message = refused(catalogue, "payment.execute", obligations)
    assert says in message


@pytest.mark.parametrize("stage", [Stage.CALL, Stage.DISPATCH])
def test_a_keyed_tool_needs_its_key_at_every_stage_that_runs_it(catalogue, stage):
    assert "missing" in refused(catalogue, "payment.execute", [], stage=stage)


@pytest.mark.parametrize(
    "obligations",
    [[KEY], [Obligation(code="notify_regulator")]],
    ids=["the key obligation", "an unknown one"],
)
def test_a_proposal_refuses_any_obligation(catalogue, obligations):
    # Proposing runs nothing, so nothing can be obliged: OPA gives no obligation there.
    refused(catalogue, "payment.execute", obligations, stage=Stage.PROPOSE)


@pytest.mark.parametrize(
    "obligations",
    [[KEY], [key_obligation("x")], [Obligation(code="notify_regulator")]],
    ids=["the key obligation", "another key", "an unknown one"],
)
def test_an_unkeyed_tool_refuses_any_obligation(catalogue, obligations):
    refused(catalogue, "contact.read", obligations)


def test_the_refusal_says_what_differs_without_quoting_the_policy(catalogue):
    message = refused(catalogue, "payment.execute", [])
    assert "pass_idempotency_key" in message
    assert "idempotent_with_key" in message


def test_required_obligations_follow_the_contract(catalogue):
    keyed = catalogue.tools["payment.execute"]
    assert required_obligations(keyed, "op-1") == [
        {"code": "pass_idempotency_key", "params": {"key": "op-1"}}
    ]
    assert required_obligations(catalogue.tools["contact.read"], "op-1") == []
    assert required_obligations(catalogue.tools["quote.propose"], "op-1") == []  # not_idempotent
    assert required_obligations(keyed, "op-1", Stage.DISPATCH) == required_obligations(
        keyed, "op-1"
    )
    assert required_obligations(keyed, "op-1", Stage.PROPOSE) == []  # nothing runs


def test_verify_execute_returns_the_grant_the_adapter_runs_under(catalogue):
    request = ExecuteInput.model_validate(
        {
            **FACTS.model_dump(),
            "call": {
                "tool": "payment.execute",
                "version": 1,
                "operation_id": OPERATION,
                "subject": {"type": "invoice", "id": "inv-9"},
                "params_digest": "sha256:" + "0" * 64,
            },
        }
    )
    grant = verify_execute(catalogue, request, execute_decision(obligations=[KEY]))
    assert grant.contract is catalogue.tools["payment.execute"]
    assert grant.idempotency_key == OPERATION
    with pytest.raises(ObligationUnsupported):
        verify_execute(catalogue, request, execute_decision(obligations=[]))
    proposal = request.model_copy(update={"stage": Stage.PROPOSE})
    grant = verify_execute(catalogue, proposal, execute_decision(obligations=[]))
    assert grant.idempotency_key is None


def test_the_demo_desk_gets_its_key_through_the_whole_path(catalogue):
    desk = SalesDesk()
    decider = ScriptedDecider()  # answers like OPA: the key exactly for keyed tools
    dispatcher = Dispatcher(catalogue, decider, ToolRegistry(desk.tools()))

    def dispatch() -> Any:
        prepared = dispatcher.prepare("payment.execute", PAYMENT)
        request = dispatcher.execute_input(
            FACTS, prepared, operation_id=OPERATION, stage=Stage.DISPATCH
        )
        authorised = dispatcher.authorise(prepared, request)
        return dispatcher.run(authorised, account="t@bank", credential=Secret("bank-secret"))

    first, again = dispatch(), dispatch()
    assert first.status is again.status is OutcomeStatus.SUCCESS
    assert first.result == again.result  # the same key: the provider applied it once
    assert list(desk.payments) == [OPERATION]
    assert desk.accounts == ["t@bank", "t@bank"]


def test_the_demo_desk_refuses_to_write_without_the_gateways_credential(catalogue):
    desk = SalesDesk()
    dispatcher = Dispatcher(catalogue, ScriptedDecider(), ToolRegistry(desk.tools()))
    outcome = dispatcher.call(
        FACTS, "payment.execute", PAYMENT, operation_id=OPERATION, stage=Stage.DISPATCH
    )
    assert outcome.status is OutcomeStatus.REFUSED
    assert desk.payments == {}
