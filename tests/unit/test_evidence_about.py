"""Evidence with a subject (#21): what the catalogue accepts of ``produces`` and
``requires`` entries, what the compiled policy data says each requirement is about,
the ``email_digest`` derivation, and the subject the gateway records a piece about."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from capgate.gateway.catalogue.compile import compile_catalogue
from capgate.gateway.digest import email_digest
from capgate.gateway.enforce.arguments import values_of
from capgate.gateway.errors import InvalidInput
from capgate.gateway.model.contracts import (
    Catalogue,
    ProducedEvidence,
    RequiredEvidence,
    ToolContract,
)
from capgate.gateway.model.facts import EvidencePiece, EvidenceSubject
from capgate.gateway.service.settle import call_about, evidence_subject

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "invoice_id": {"type": "string"},
        "recipient": {"type": "string"},
        "amount_cents": {"type": "integer"},
    },
}


def contract(name: str = "mail.send", **overrides: Any) -> ToolContract:
    fields: dict[str, Any] = {
        "name": name,
        "version": 1,
        "description": "Send.",
        "mode": "write",
        "roles": ["sales"],
        "connection_alias": None,
        "subject_type": "invoice",
        "recovery": "retry_safe",
        "idempotency": "idempotent",
        "cost_class": "low",
        "environments": ["production"],
        "input_schema": SCHEMA,
        "values": {
            "recipient_digest": {"param": "recipient", "type": "string", "derive": "email_digest"},
            "amount_cents": {"param": "amount_cents", "type": "integer"},
        },
    }
    fields.update(overrides)
    return ToolContract.model_validate(fields)


def catalogue(*tools: ToolContract) -> Catalogue:
    roles = {"sales": {"description": "Sells."}}
    return Catalogue.model_validate(
        {
            "tools": {tool.name: tool for tool in tools},
            "roles": roles,
            "task_types": {},
            "budget_classes": {},
        }
    )


def test_plain_names_keep_their_meaning():
    plain = contract(produces=["checked"], requires=["checked"])
    assert plain.produces == [ProducedEvidence(name="checked")]
    assert plain.requires == [RequiredEvidence(name="checked")]
    # A plain produced name is about the call's subject, when it has one; a plain
    # requirement is about anything.
    assert plain.produced_about(plain.produces[0]) == "subject"
    assert (
        contract(subject_type=None, produces=["x"]).produced_about(ProducedEvidence(name="x"))
        is None
    )
    assert compile_catalogue(catalogue(plain))["tools"]["mail.send"]["requires_about"] == {}


def test_bindings_compile_to_what_each_requirement_is_about():
    bound = contract(
        requires=[
            {"name": "verified_recipient", "about": "recipient_digest"},
            {"name": "invoice_approved", "about": "subject"},
        ]
    )
    producer = contract(
        "verify",
        produces=[
            {"name": "verified_recipient", "about": "recipient_digest", "ttl_seconds": 60},
            "invoice_approved",
        ],
    )
    compiled = compile_catalogue(catalogue(bound, producer))["tools"]
    assert compiled["mail.send"]["requires"] == ["verified_recipient", "invoice_approved"]
    assert compiled["mail.send"]["requires_about"] == {
        "verified_recipient": {"about": "recipient_digest", "type": "email_digest"},
        "invoice_approved": {"about": "subject", "type": "invoice"},
    }
    assert compiled["verify"]["produces"] == ["verified_recipient", "invoice_approved"]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            {"requires": [{"name": "verified_recipient", "about": "recipient"}]},
            "requires[0].about: 'recipient' is neither 'subject' nor one of the values",
        ),
        (
            {"produces": [{"name": "verified_recipient", "about": "nowhere"}]},
            "produces[0].about: 'nowhere' is neither 'subject' nor one of the values",
        ),
        (
            {"requires": [{"name": "big", "about": "amount_cents"}]},
            "requires[0].about: value 'amount_cents' is a integer; evidence is about a string",
        ),
        (
            {"subject_type": None, "requires": [{"name": "x", "about": "subject"}]},
            "requires[0].about: tool 'mail.send' has no subject",
        ),
        (
            {"requires": ["x", {"name": "x", "about": "subject"}]},
            "requires[1]: evidence 'x' is listed twice",
        ),
        ({"produces": [{"name": "x", "ttl_seconds": 0}]}, "ttl_seconds"),
        ({"produces": [{"name": "x", "ttl_seconds": "60"}]}, "ttl_seconds"),
        ({"produces": [{"name": "x", "for": "subject"}]}, "for"),
        (
            {"values": {"d": {"param": "recipient", "type": "integer", "derive": "email_digest"}}},
            "derive: email_digest gives a string",
        ),
    ],
)
def test_a_binding_the_contract_cannot_fill_is_a_load_error_naming_the_field(overrides, problem):
    with pytest.raises(ValidationError) as refused:
        contract(**overrides)
    assert problem in str(refused.value)


def test_a_requirement_about_a_kind_nothing_produces_is_a_catalogue_problem():
    consumer = contract(requires=[{"name": "verified_recipient", "about": "recipient_digest"}])
    about_subject = contract("verify", produces=["verified_recipient"])  # about an invoice
    with pytest.raises(ValidationError) as refused:
        catalogue(consumer, about_subject)
    assert (
        "tool 'mail.send': field 'requires[0]': no tool produces evidence 'verified_recipient' "
        "about a 'email_digest'"
    ) in str(refused.value)
    # Required about anything, any producer will do.
    catalogue(contract(requires=["verified_recipient"]), about_subject)


def test_email_digest_is_one_spelling_of_one_address():
    assert email_digest("Ada@Example.TEST ") == email_digest("ada@example.test")
    assert email_digest("ada@example.test") != email_digest("cb@example.test")
    assert email_digest("ada@example.test").startswith("sha256:")
    values = values_of(contract(), {"recipient": "Ada@Example.TEST"})
    assert values["recipient_digest"] == email_digest("ada@example.test")
    with pytest.raises(InvalidInput, match="must be an email address"):
        values_of(contract(), {"recipient": "no-at-sign"})


def test_the_subject_recorded_is_the_calls_subject_or_value():
    producer = contract(
        produces=[{"name": "verified_recipient", "about": "recipient_digest"}, "invoice_approved"]
    )
    digest = email_digest("ada@example.test")
    call = call_about({"type": "invoice", "id": "inv-9"}, {"recipient_digest": digest})
    by_value, by_subject = (
        evidence_subject(producer, producer.produced_about(p), call) for p in producer.produces
    )
    assert by_value == EvidenceSubject(type="email_digest", id=digest)
    assert by_subject == EvidenceSubject(type="invoice", id="inv-9")
    # Not known, or an absent optional value: about nothing, which meets only
    # requirements about anything.
    assert evidence_subject(producer, "subject", None) is None
    assert evidence_subject(producer, "recipient_digest", call_about(None, {})) is None
    assert evidence_subject(producer, "subject", call_about(None, {})) is None


def test_an_evidence_piece_is_checked():
    piece = EvidencePiece(
        name="verified_recipient",
        subject={"type": "email_digest", "id": email_digest("a@b.test")},
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert piece.model_dump(mode="json")["expires_at"] == "2030-01-01T00:00:00Z"
    with pytest.raises(ValidationError):
        EvidencePiece(name="x", subject={"type": "invoice", "id": ""})
    with pytest.raises(ValidationError):
        EvidencePiece(name="x", expires_at=datetime(2030, 1, 1))  # naive: no time zone
