"""Evidence with a subject and an expiry, against a real OPA and both stores (#21).

In the demo catalogue contact.verify_email records verified_recipient about the
digest of the address it verified, for a day, and quote.prepare_send requires it
about the digest of its recipient; payment.execute requires invoice_approved about
the invoice it pays. So verifying Ada's address licenses mail to Ada only (not to
another contact of the same task), a verification that expired licenses nothing
until it is shown again, and approving inv-9 does not license paying inv-10. The
address itself is neither stored nor sent to OPA: only its digest.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from capgate.gateway.digest import email_digest
from capgate.gateway.errors import CapabilityViolation
from capgate.gateway.model.facts import EvidenceSubject
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state.records import ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from tests.integration import lifecycle_support as lifecycle_fixtures
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_support import (
    EMAIL,
    FINANCE,
    MANAGER,
    PAY_TASK,
    PAYMENT,
    QUOTE,
    QUOTE_TASK,
    SALES,
    TENANT,
    ShiftClock,
    agent_request,
    recipient,
)
from tests.integration.store_support import raw_query

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url
clock = lifecycle_fixtures.clock
store = lifecycle_fixtures.store
desk = lifecycle_fixtures.desk
gateway = lifecycle_fixtures.gateway

SALES_REQUEST = agent_request(SALES, QUOTE_TASK)
#: Both invoices linked to the task, so that only the evidence tells them apart.
TWO_INVOICES = agent_request(
    FINANCE,
    {
        **PAY_TASK,
        "linked_resources": [
            {"type": "invoice", "id": "inv-9"},
            {"type": "invoice", "id": "inv-10"},
        ],
    },
)
ADA = EMAIL["recipient"]
#: The address of c-77, the other contact the quote task links.
CHARLES = "cb@example.test"


def denied(call: Any) -> CapabilityViolation:
    with pytest.raises(CapabilityViolation) as caught:
        call()
    return caught.value


def quote_revision_and_consent(gateway: Gateway) -> None:
    """Everything quote.prepare_send requires but the verified recipient."""
    gateway.call(SALES_REQUEST, "consent.check", {"contact_id": "c-42"})
    quote = gateway.call(SALES_REQUEST, "quote.propose", QUOTE)
    assert isinstance(quote, ProposalRecord)
    gateway.review(quote.id, MANAGER, "approved")
    assert gateway.dispatch(quote.id).ok


def verify(gateway: Gateway, address: str = ADA) -> Outcome:
    outcome = gateway.call(
        SALES_REQUEST, "contact.verify_email", {"contact_id": "c-42", "email": address}
    )
    assert isinstance(outcome, Outcome)
    return outcome


def propose_to(gateway: Gateway, address: str) -> Any:
    return gateway.call(SALES_REQUEST, "quote.prepare_send", {**EMAIL, "recipient": address})


def test_a_verified_recipient_licenses_mail_to_that_address_only(
    gateway: Gateway, store: Store, store_url: str
):
    quote_revision_and_consent(gateway)
    verify(gateway)
    to_ada = propose_to(gateway, ADA)
    assert isinstance(to_ada, ProposalRecord)
    assert to_ada.status is ProposalStatus.PENDING
    # One address, however it is spelt.
    assert isinstance(propose_to(gateway, "Ada@Example.TEST"), ProposalRecord)
    # Another contact linked to the same task: not verified, so not licensed.
    elsewhere = denied(lambda: propose_to(gateway, CHARLES))
    assert elsewhere.reason_codes == ["evidence_missing"]
    [reason] = elsewhere.reasons
    assert '"verified_recipient"' in reason.message
    # What the store holds: the digest of the address, for a day; never the address.
    with store.transaction(read_only=True) as tx:
        pieces = {r.name: r for r in tx.evidence_records(TENANT, QUOTE_TASK["id"])}
    verified = pieces["verified_recipient"]
    assert verified.subject == EvidenceSubject(type="email_digest", id=email_digest(ADA))
    assert verified.expires_at == verified.recorded_at + timedelta(days=1)
    # The others are about the producing call's subject and never expire.
    assert pieces["communication_permission"].subject == EvidenceSubject(type="contact", id="c-42")
    assert pieces["current_quote_revision"].subject == EvidenceSubject(
        type="opportunity", id="opp-17"
    )
    assert pieces["communication_permission"].expires_at is None
    stored = repr(raw_query(store_url, "SELECT * FROM evidence"))
    assert "example.test" not in stored


def test_a_verification_of_an_address_not_the_contacts_records_nothing(
    gateway: Gateway, store: Store
):
    quote_revision_and_consent(gateway)
    refused = verify(gateway, CHARLES)  # c-42's record says ada@: the desk refuses
    assert refused.status is OutcomeStatus.REFUSED
    assert "not the contact's email address" in (refused.error or "")
    assert "verified_recipient" not in lifecycle_fixtures.evidence_of(store, QUOTE_TASK["id"])
    assert denied(lambda: propose_to(gateway, CHARLES)).reason_codes == ["evidence_missing"]


def test_an_expired_verification_is_not_evidence_until_shown_again(
    gateway: Gateway, store: Store, clock: ShiftClock
):
    quote_revision_and_consent(gateway)
    clock.offset = -timedelta(days=2)  # verified two days ago, good for one
    try:
        verify(gateway)
    finally:
        clock.offset = timedelta(0)
    with store.transaction(read_only=True) as tx:
        [old] = [
            r for r in tx.evidence_records(TENANT, QUOTE_TASK["id"]) if r.subject == recipient()
        ]
    assert old.expires_at is not None
    expired = denied(lambda: propose_to(gateway, ADA))
    assert expired.reason_codes == ["evidence_missing"]
    # Verified again now: the piece is renewed, and licenses the address again.
    verify(gateway)
    with store.transaction(read_only=True) as tx:
        [renewed] = [
            r for r in tx.evidence_records(TENANT, QUOTE_TASK["id"]) if r.subject == recipient()
        ]
    assert renewed.expires_at is not None
    assert renewed.expires_at > old.expires_at
    assert isinstance(propose_to(gateway, ADA), ProposalRecord)


def test_approving_one_invoice_does_not_license_paying_another(gateway: Gateway, store: Store):
    gateway.call(TWO_INVOICES, "invoice.check_approval", {"invoice_id": "inv-9"})
    other = denied(
        lambda: gateway.call(TWO_INVOICES, "payment.execute", {**PAYMENT, "invoice_id": "inv-10"})
    )
    assert other.reason_codes == ["evidence_missing"]
    assert '"invoice_approved"' in other.reasons[0].message
    this = gateway.call(TWO_INVOICES, "payment.execute", PAYMENT)
    assert isinstance(this, ProposalRecord)
    with store.transaction(read_only=True) as tx:
        [approved] = tx.evidence_records(TENANT, PAY_TASK["id"])
    assert (approved.name, approved.subject) == (
        "invoice_approved",
        EvidenceSubject(type="invoice", id="inv-9"),
    )
