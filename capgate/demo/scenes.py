"""The demo: both seed examples, end to end against a real OPA, with a printed trace.

Every step states what it expects; the demo checks its own claims and returns a
non-zero exit status if the gateway did anything else (a denied tool entered, an
omen that changed between two identical draws, a missing reason code), so it is a
smoke test as well as a show.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TextIO

from adapters.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.oracle import ORACLE_DESCRIPTION, oracle
from capgate.demo.tools.sales_desk import SalesDesk
from gateway.catalogue import load_catalogue
from gateway.digest import params_digest
from gateway.dispatch.agent import AgentSession
from gateway.dispatch.dispatcher import DecisionEvent, Dispatcher
from gateway.dispatch.registry import ToolRegistry
from gateway.errors import CapabilityViolation
from gateway.model.contracts import Catalogue
from gateway.model.facts import Approval, ComposeInput
from gateway.opa.sidecar import PolicySidecar

__all__ = ["run_demo"]


@dataclass
class _Trace:
    out: TextIO
    failures: list[str] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def observe(self, event: DecisionEvent) -> None:
        decision = f"decision_id={event.decision_id or '-'}"
        if event.kind == "compose":
            visible = ", ".join(event.visible) or "(none)"
            self.say(f"  compose  {event.agent:<16} visible: {visible}   {decision}")
        else:
            verdict = "ALLOW" if event.allow else "DENY "
            detail = event.status if event.allow else ", ".join(event.reason_codes)
            self.say(
                f"  execute  {event.agent:<16} {event.tool:<20} {verdict} {detail}   {decision}"
            )

    def expect(self, ok: bool, claim: str) -> None:
        self.say(f"    {'ok  ' if ok else 'FAIL'} {claim}")
        if not ok:
            self.failures.append(claim)


@contextmanager
def _dispatcher(
    catalogue: Catalogue, registry: ToolRegistry, trace: _Trace
) -> Iterator[Dispatcher]:
    # A generous timeout: the demo runs on busy shared machines too, and a flaky demo
    # teaches nothing. Services keep the short default (docs/architecture.md).
    with PolicySidecar(catalogue, timeout=5.0) as sidecar:
        for line in sidecar.describe_lines():
            trace.say(f"  {line}")
        yield Dispatcher(catalogue, sidecar.client, registry, observer=trace.observe)


def _denied(call: Callable[[], Any]) -> CapabilityViolation | None:
    try:
        call()
    except CapabilityViolation as exc:
        return exc
    return None


def _oracle_grove(trace: _Trace) -> None:
    trace.say("== oracle-grove: a tool-using agent beside a tool-less one ==")
    catalogue = load_catalogue(demo_catalogue_dir("oracle-grove"))
    tools = InProcessTools()
    tools.register("oracle", ORACLE_DESCRIPTION, oracle)
    registry = ToolRegistry(tools)

    def facts(agent: str) -> ComposeInput:
        return ComposeInput.model_validate(
            {
                "principal": {"agent": agent, "role": agent, "tenant": "grove"},
                "task": {"type": "scene"},
                "environment": "development",
                "budget_class": "standard",
            }
        )

    with _dispatcher(catalogue, registry, trace) as dispatcher:
        teller = AgentSession(dispatcher, facts("fortune-teller"))
        trace.say("    prompt block: " + teller.available_tools_block().replace("\n", " | "))
        first = teller.call_tool("oracle", seed="harvest-moon")
        event = {"type": "oracle.spoke", "payload": {"omen": first["omen"], "seed": first["seed"]}}
        trace.say(f"    emitted {event}")
        again = teller.call_tool("oracle", seed="harvest-moon")
        trace.expect(again["omen"] == first["omen"], "same seed, same omen")

        whisperer = AgentSession(dispatcher, facts("scene-whisperer"))
        trace.say("    prompt block: " + whisperer.available_tools_block())
        trace.expect(whisperer.visible_tools == [], "scene-whisperer sees no tool")
        denial = _denied(lambda: whisperer.call_tool("oracle", seed="harvest-moon"))
        trace.expect(
            denial is not None and "role_not_granted" in denial.reason_codes,
            "scene-whisperer's oracle call is denied: role_not_granted",
        )
        trace.say("    emitted {'type': 'world.observed', 'payload': {'omen': None}}")


def _sales(trace: _Trace) -> None:
    trace.say("")
    trace.say("== sales / support / finance: compose by intersection, check every call ==")
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    desk = SalesDesk()
    registry = ToolRegistry(desk.tools())

    def facts(agent: str, role: str, **changes: Any) -> ComposeInput:
        base: dict[str, Any] = {
            "principal": {"agent": agent, "role": role, "tenant": "acme"},
            "task": {
                "type": "customer_quote",
                "needs": ["contact.read", "quote.propose", "payment.execute"],
                "linked_resources": [
                    {"type": "contact", "id": "c-42"},
                    {"type": "opportunity", "id": "opp-17"},
                    {"type": "invoice", "id": "inv-9"},
                ],
            },
            "connections": {"crm": "active", "sales_mailbox": "active", "bank": "active"},
            "environment": "production",
            "budget_class": "unlimited",
        }
        base.update(changes)
        return ComposeInput.model_validate(base)

    with _dispatcher(catalogue, registry, trace) as dispatcher:
        trace.say("  -- a sales agent")
        sales = AgentSession(dispatcher, facts("sales-bot", "sales"))
        trace.expect(
            sales.visible_tools == ["contact.read", "quote.propose"],
            "sales sees contact.read and quote.propose only",
        )
        trace.expect(
            sales.composition.reasons_for("payment.execute") == ["role_not_granted"],
            "payment.execute is hidden from sales by role alone",
        )
        sales.call_tool("contact.read", contact_id="c-42")
        payment = {
            "invoice_id": "inv-9",
            "amount_cents": 120_000,
            "currency": "EUR",
            "beneficiary": "DE44500105175407324931",
        }
        denial = _denied(lambda: sales.call_tool("payment.execute", **payment))
        trace.expect(
            denial is not None and "role_not_granted" in denial.reason_codes,
            "sales' payment.execute is denied, role_not_granted among the reasons",
        )
        trace.expect(
            "payment.execute" not in desk.entered, "the payment function was never entered"
        )
        denial = _denied(lambda: sales.call_tool("contact.read", contact_id="c-99"))
        trace.expect(
            denial is not None and denial.reason_codes == ["subject_out_of_scope"],
            "a contact the task does not link is out of scope",
        )

        trace.say("  -- a finance agent paying the linked invoice")
        finance_facts = facts(
            "finance-bot",
            "finance",
            task={
                "type": "invoice_payment",
                "linked_resources": [{"type": "invoice", "id": "inv-9"}],
            },
        )
        soon = datetime.now(UTC) + timedelta(minutes=10)

        def approval(of: dict[str, Any], expires_at: datetime = soon) -> Approval:
            return Approval(
                kind="exact_content_and_recipient",
                tool="payment.execute",
                operation_id="pay-inv-9",
                tenant="acme",
                digest=params_digest(of),
                expires_at=expires_at,
                approved_by="founder",
            )

        def pay(with_facts: ComposeInput, given: Approval | None) -> dict[str, Any]:
            session = AgentSession(
                dispatcher,
                with_facts,
                evidence=["invoice_approved"],
                approvals={"payment.execute": given} if given else None,
            )
            return session.call_tool("payment.execute", **payment)

        elsewhere = {**payment, "beneficiary": "FR7630006000011234567890189"}
        yesterday = datetime.now(UTC) - timedelta(days=1)
        for given, code, claim in (
            (None, "approval_required", "no approval yet"),
            (approval(elsewhere), "approval_mismatch", "an approval for another beneficiary"),
            (approval(payment, yesterday), "approval_expired", "yesterday's approval"),
        ):
            denial = _denied(partial(pay, finance_facts, given))
            trace.expect(denial is not None and denial.reason_codes == [code], f"{claim}: {code}")
        receipt = pay(finance_facts, approval(payment))
        trace.expect(
            receipt.get("status") == "submitted" and "payment.execute" in desk.entered,
            "approved exact content and recipient: the payment runs",
        )

        trace.say("  -- the same approval, used again")
        again = pay(finance_facts, approval(payment))
        trace.expect(
            again == receipt and len(desk.payments) == 1,
            "a second call continues the approved operation: same key, paid once",
        )
        denial = _denied(
            lambda: dispatcher.call(
                finance_facts,
                "payment.execute",
                payment,
                operation_id="pay-inv-9-again",
                approval=approval(payment),
                evidence=["invoice_approved"],
            )
        )
        trace.expect(
            denial is not None and denial.reason_codes == ["approval_mismatch"],
            "replayed as a new operation: approval_mismatch",
        )
        other_tenant = ComposeInput.model_validate(
            {
                **finance_facts.model_dump(),
                "principal": {"agent": "finance-bot", "role": "finance", "tenant": "globex"},
            }
        )
        denial = _denied(lambda: pay(other_tenant, approval(payment)))
        trace.expect(
            denial is not None and denial.reason_codes == ["approval_mismatch"],
            "borrowed by another tenant: approval_mismatch",
        )

        trace.say("  -- the bank connection is revoked while a payment is queued")
        revoked = ComposeInput.model_validate(
            {**finance_facts.model_dump(), "connections": {"bank": "revoked"}}
        )
        denial = _denied(lambda: pay(revoked, approval(payment)))
        trace.expect(
            denial is not None and denial.reason_codes == ["connection_revoked"],
            "a revoked connection stops the queued payment: connection_revoked",
        )


def run_demo(out: TextIO = sys.stdout) -> int:
    """Run both scenes; return 0 when every expectation held, 1 otherwise."""
    trace = _Trace(out)
    _oracle_grove(trace)
    _sales(trace)
    trace.say("")
    if trace.failures:
        trace.say(f"DEMO FAILED: {len(trace.failures)} expectation(s) did not hold")
        return 1
    trace.say("demo finished: every expectation held")
    return 0
