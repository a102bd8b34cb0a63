"""Stand-ins for the sales/support/finance tools of the demo catalogue.

They touch no provider: each returns a plausible receipt and records that it was
entered, so the demo and the tests can prove a denied call never reached the tool
body (``SalesDesk.entered``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters.in_process import InProcessTools, current_call
from gateway.model.outcomes import ToolRefused

__all__ = ["SalesDesk"]


@dataclass
class SalesDesk:
    """The demo's tool bodies, with a record of every function actually entered."""

    entered: list[str] = field(default_factory=list)
    #: Payments made, by idempotency key: a repeated key returns the first receipt,
    #: as a real payment provider's idempotency keys do.
    payments: dict[str, dict[str, Any]] = field(default_factory=dict)

    def contact_read(self, contact_id: str) -> dict[str, Any]:
        self.entered.append("contact.read")
        return {"contact_id": contact_id, "name": "Ada Lovelace", "email": "ada@example.test"}

    def quote_propose(
        self, opportunity_id: str, amount_cents: int, currency: str
    ) -> dict[str, Any]:
        self.entered.append("quote.propose")
        return {"proposal_id": f"prop-{opportunity_id}", "status": "proposed"}

    def quote_prepare_send(
        self, opportunity_id: str, recipient: str, subject: str, body: str
    ) -> dict[str, Any]:
        self.entered.append("quote.prepare_send")
        return {"proposal_id": f"send-{opportunity_id}", "status": "queued_for_review"}

    def payment_execute(
        self, invoice_id: str, amount_cents: int, currency: str, beneficiary: str
    ) -> dict[str, Any]:
        self.entered.append("payment.execute")
        key = current_call().idempotency_key
        if key is None:  # the contract promises a key; without one, refuse to move money
            raise ToolRefused("no idempotency key: refusing to pay")
        if key not in self.payments:
            self.payments[key] = {
                "payment_id": f"pay-{len(self.payments) + 1}-{invoice_id}",
                "status": "submitted",
            }
        return dict(self.payments[key])

    def tools(self) -> InProcessTools:
        """The four tools, registered in a new in-process adapter."""
        tools = InProcessTools()
        tools.register("contact.read", "Read one CRM contact.", self.contact_read)
        tools.register("quote.propose", "Propose a quote.", self.quote_propose)
        tools.register("quote.prepare_send", "Prepare a quote email.", self.quote_prepare_send)
        tools.register("payment.execute", "Pay an approved invoice.", self.payment_execute)
        return tools
