"""Stand-ins for the sales/support/finance tools of the demo catalogue and their providers.

They touch no real provider. Each keeps what a provider would (sent emails, recorded
quotes, payments, by idempotency key or operation id) so the demo and the tests can
prove what happened: a denied call never reached a tool body (``entered``), an
approved email was sent exactly once (``mailbox``), a payment whose answer was lost
was found by lookup instead of being paid twice (``payments``).

Tools that act through a connection refuse to run without the credential the
gateway resolves at dispatch, and record only the provider account they acted as:
never the secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capgate.adapters.tools.in_process import InProcessTools, current_call
from capgate.gateway.digest import email_digest
from capgate.gateway.model.outcomes import ToolRefused, ToolUnknown

__all__ = ["SalesDesk"]


@dataclass
class SalesDesk:
    """The demo's tool bodies and their providers' records."""

    entered: list[str] = field(default_factory=list)
    #: Contacts in the CRM: whether their email is verified and they agreed to email.
    contacts: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "c-42": {"name": "Ada Lovelace", "email": "ada@example.test", "verified": True,
                     "consent": True},
            "c-77": {"name": "Charles Babbage", "email": "cb@example.test", "verified": False,
                     "consent": False},
        }
    )  # fmt: skip
    invoices: dict[str, bool] = field(default_factory=lambda: {"inv-9": True, "inv-10": False})
    #: What the providers did, by idempotency key (or operation id).
    quotes: dict[str, dict[str, Any]] = field(default_factory=dict)
    mailbox: dict[str, dict[str, Any]] = field(default_factory=dict)
    payments: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Provider accounts the writing tools acted as (never the secret itself).
    accounts: list[str] = field(default_factory=list)
    #: Actions whose next run reaches the provider and then loses the answer.
    lose_answer_once: set[str] = field(default_factory=set)

    # -- reads ------------------------------------------------------------------------

    def contact_read(self, contact_id: str) -> dict[str, Any]:
        self.entered.append("contact.read")
        contact = self._contact(contact_id)
        return {"contact_id": contact_id, "name": contact["name"], "email": contact["email"]}

    def contact_verify_email(self, contact_id: str, email: str) -> dict[str, Any]:
        # The CRM knows the contact's address: another address is not theirs, so
        # the evidence (about the digest of the address asked) is never about it.
        self.entered.append("contact.verify_email")
        contact = self._contact(contact_id)
        if email_digest(email) != email_digest(contact["email"]):
            raise ToolRefused("that is not the contact's email address")
        if not contact["verified"]:
            raise ToolRefused("the contact's email address is not verified")
        return {"contact_id": contact_id, "verified": True}

    def consent_check(self, contact_id: str) -> dict[str, Any]:
        self.entered.append("consent.check")
        if not self._contact(contact_id)["consent"]:
            raise ToolRefused("the contact did not agree to commercial email")
        return {"contact_id": contact_id, "consent": "email"}

    def invoice_check_approval(self, invoice_id: str) -> dict[str, Any]:
        self.entered.append("invoice.check_approval")
        if not self.invoices.get(invoice_id, False):
            raise ToolRefused("the invoice is not approved for payment")
        return {"invoice_id": invoice_id, "approved": True}

    # -- writes (run only for reviewed proposals) ---------------------------------------

    def quote_record_reviewed(
        self, opportunity_id: str, amount_cents: int, currency: str
    ) -> dict[str, Any]:
        self.entered.append("quote.record_reviewed")
        key = self._authorised_key()
        if key not in self.quotes:
            revision = 1 + sum(q["opportunity_id"] == opportunity_id for q in self.quotes.values())
            self.quotes[key] = {
                "quote_id": f"q-{opportunity_id}-{revision}",
                "revision": revision,
                "opportunity_id": opportunity_id,
                "amount_cents": amount_cents,
                "currency": currency,
            }
        quote = self.quotes[key]
        return {"quote_id": quote["quote_id"], "revision": quote["revision"]}

    def quote_dispatch_reviewed(
        self, opportunity_id: str, recipient: str, subject: str, body: str
    ) -> dict[str, Any]:
        self.entered.append("quote.dispatch_reviewed")
        key = self._authorised_key()
        if key not in self.mailbox:  # the provider sends once per idempotency key
            self.mailbox[key] = {
                "message_id": f"msg-{len(self.mailbox) + 1}",
                "to": recipient,
                "subject": subject,
            }
        self._maybe_lose_answer("quote.dispatch_reviewed")
        return {"message_id": self.mailbox[key]["message_id"], "status": "sent"}

    def payment_execute(
        self, invoice_id: str, amount_cents: int, currency: str, beneficiary: str
    ) -> dict[str, Any]:
        self.entered.append("payment.execute")
        key = self._authorised_key()
        if key not in self.payments:
            self.payments[key] = {
                "payment_id": f"pay-{len(self.payments) + 1}-{invoice_id}",
                "amount_cents": amount_cents,
                "beneficiary": beneficiary,
            }
        self._maybe_lose_answer("payment.execute")
        return {"payment_id": self.payments[key]["payment_id"], "status": "submitted"}

    # -- lookups: what an earlier attempt did, by idempotency key ------------------------

    def find_sent(self, operation_id: str) -> dict[str, Any] | None:
        sent = self.mailbox.get(operation_id)
        return None if sent is None else {"message_id": sent["message_id"], "status": "sent"}

    def find_payment(self, operation_id: str) -> dict[str, Any] | None:
        paid = self.payments.get(operation_id)
        return None if paid is None else {"payment_id": paid["payment_id"], "status": "submitted"}

    def find_quote(self, operation_id: str) -> dict[str, Any] | None:
        quote = self.quotes.get(operation_id)
        return (
            None
            if quote is None
            else {"quote_id": quote["quote_id"], "revision": quote["revision"]}
        )

    # -- the adapter -------------------------------------------------------------------

    def tools(self) -> InProcessTools:
        """Every tool and execution action of the demo catalogue, in a new adapter."""
        tools = InProcessTools()
        tools.register("contact.read", "Read one CRM contact.", self.contact_read)
        tools.register("contact.verify_email", "Verify an email.", self.contact_verify_email)
        tools.register("consent.check", "Check email consent.", self.consent_check)
        tools.register(
            "invoice.check_approval", "Check an invoice's approval.", self.invoice_check_approval
        )
        tools.register(
            "quote.record_reviewed",
            "Record a reviewed quote in the CRM.",
            self.quote_record_reviewed,
            lookup=self.find_quote,
        )
        tools.register(
            "quote.dispatch_reviewed",
            "Send a reviewed quote email.",
            self.quote_dispatch_reviewed,
            lookup=self.find_sent,
        )
        tools.register(
            "payment.execute",
            "Pay an approved invoice.",
            self.payment_execute,
            lookup=self.find_payment,
        )
        return tools

    # -- helpers -----------------------------------------------------------------------

    def _contact(self, contact_id: str) -> dict[str, Any]:
        try:
            return self.contacts[contact_id]
        except KeyError:
            raise ToolRefused("no such contact") from None

    def _authorised_key(self) -> str:
        """The provider's idempotency key; refuse to write without key or credential."""
        call = current_call()
        if call.credential is None:
            raise ToolRefused("no credential for the connection: refusing to write")
        self.accounts.append(call.account or "?")
        # A provider keyed by operation: the idempotency key when the policy obliged
        # one, else the operation id (quote.record_reviewed is not idempotent).
        return call.idempotency_key or call.operation_id

    def _maybe_lose_answer(self, action: str) -> None:
        if action in self.lose_answer_once:
            self.lose_answer_once.discard(action)
            raise ToolUnknown("the provider took the request, then the answer was lost")
