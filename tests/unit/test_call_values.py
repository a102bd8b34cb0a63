"""The values a contract lets the policies read (``values:``), its limits on them and
a cost counted from one: what the catalogue accepts, and what the dispatcher reads
from the parameters into ``input.call.values`` (nothing undeclared, nothing of the
wrong type, no parameter's content in an error)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from capgate.gateway.enforce.arguments import MAX_VALUE_CHARS, values_of
from capgate.gateway.errors import InvalidInput
from capgate.gateway.model.contracts import CurrencyTable, ToolContract
from capgate.gateway.model.facts import Call

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "amount_cents": {"type": "integer"},
        "currency": {"type": "string"},
        "recipient": {"type": "string"},
        "urgent": {"type": "boolean"},
        "note": {"type": "string"},
    },
}


def contract(**overrides: Any) -> ToolContract:
    fields: dict[str, Any] = {
        "name": "payment.execute",
        "version": 1,
        "description": "Pay.",
        "mode": "write",
        "roles": ["finance", "sales"],
        "connection_alias": None,
        "subject_type": None,
        "recovery": "retry_safe",
        "idempotency": "idempotent",
        "cost_class": "low",
        "environments": ["production"],
        "input_schema": SCHEMA,
        "values": {
            "amount_cents": {"param": "amount_cents", "type": "integer"},
            "currency": {"param": "currency", "type": "string"},
            "domain": {"param": "recipient", "type": "string", "derive": "email_domain"},
            "urgent": {"param": "urgent", "type": "boolean"},
        },
    }
    fields.update(overrides)
    return ToolContract.model_validate(fields)


def test_only_the_declared_values_are_read_and_derived():
    values = values_of(
        contract(),
        {"amount_cents": 1200, "currency": "EUR", "recipient": "Ada@Example.TEST",
         "urgent": False, "note": "not a value"},
    )  # fmt: skip
    assert values == {"amount_cents": 1200, "currency": "EUR", "domain": "example.test",
                      "urgent": False}  # fmt: skip
    # An absent optional parameter is null, so a rule sees it was not given.
    assert values_of(contract(), {})["amount_cents"] is None
    # The last @ splits: a quoted local part may hold one.
    assert values_of(contract(), {"recipient": '"a@b"@shop.example'})["domain"] == "shop.example"


def test_an_integral_float_is_the_integer():
    assert values_of(contract(), {"amount_cents": 5.0})["amount_cents"] == 5
    assert type(values_of(contract(), {"amount_cents": 5.0})["amount_cents"]) is int


@pytest.mark.parametrize(
    ("params", "rule"),
    [
        ({"amount_cents": True}, "must be of type integer"),  # a boolean is no number
        ({"amount_cents": 1.5}, "must be of type integer"),
        ({"amount_cents": "12"}, "must be of type integer"),
        ({"currency": 978}, "must be of type string"),
        ({"urgent": 1}, "must be of type boolean"),
        ({"recipient": "no-at-sign"}, "must be an email address"),
        ({"recipient": "@example.test"}, "must be an email address"),
        ({"recipient": "ada@"}, "must be an email address"),
        ({"currency": "x" * (MAX_VALUE_CHARS + 1)}, f"at most {MAX_VALUE_CHARS} characters"),
        ({"amount_cents": 2**60}, "at most 2**53 in magnitude"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_naming_it_not_its_content(params, rule):
    with pytest.raises(InvalidInput) as refused:
        values_of(contract(), params)
    text = str(refused.value)
    assert rule in text
    assert "value '" in text
    assert "parameter '" in text
    for given in params.values():
        if isinstance(given, str) and len(given) > 3:
            assert given not in text


def test_a_counted_cost_is_the_value_and_never_negative():
    counted = contract(cost_value="amount_cents")
    assert counted.cost_units == 0
    assert counted.cost_of({"amount_cents": 1200}) == 1200
    assert counted.cost_of({"amount_cents": None}) == 0
    assert contract().cost_of({"amount_cents": 1200}) == 1  # a fixed cost: low
    with pytest.raises(InvalidInput, match="must not be negative"):
        values_of(counted, {"amount_cents": -5})


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (
            {"limits": [{"value": "amount", "max": 5}]},
            "limits[0]: 'amount' is not one of the values",
        ),
        (
            {"limits": [{"value": "currency", "max": 5}]},
            "a limit applies to an integer or a number",
        ),
        (
            {"limits": [{"value": "amount_cents", "max": 5, "roles": ["support"]}]},
            "limits[0].roles: tool 'payment.execute' does not grant role 'support'",
        ),
        ({"limits": [{"value": "amount_cents", "max": "5000"}]}, "max"),
        ({"limits": [{"value": "amount_cents", "max": 5, "roles": []}]}, "roles"),
        (
            {"cost_value": "currency"},
            "cost_value: 'currency' must be one of the values, of type integer",
        ),
        ({"cost_value": "amount_cents", "cost": 3}, "give one"),
        (
            {"values": {"x": {"param": "missing", "type": "string"}}},
            "values['x'].param: parameter 'missing' is not in the input schema's properties",
        ),
        (
            {"values": {"x": {"param": "recipient", "type": "integer", "derive": "email_domain"}}},
            "derive: email_domain gives a string",
        ),
        ({"values": {"x": {"param": "recipient", "type": "text"}}}, "type"),
    ],
)
def test_the_catalogue_refuses_values_and_limits_that_could_not_hold(overrides, problem):
    with pytest.raises(ValidationError) as refused:
        contract(**overrides)
    assert problem in str(refused.value)


def test_a_limit_for_every_role_and_the_facts_model_bound_the_values():
    assert contract(limits=[{"value": "amount_cents", "max": 500000}]).limits[0].roles is None
    base = {
        "tool": "t",
        "version": 1,
        "operation_id": "op-1",
        "params_digest": "sha256:" + "0" * 64,
    }
    assert Call.model_validate({**base, "values": {"a": 1, "b": "x", "c": None, "d": 1.5}})
    for bad in ({"a": [1]}, {"a": {"b": 1}}, {"a": "x" * 1025}, {f"v{n}": 1 for n in range(65)}):
        with pytest.raises(ValidationError):
            Call.model_validate({**base, "values": bad})


def reviewed(**overrides: Any) -> ToolContract:
    return contract(approval="exact_content_and_recipient", reviewers=["finance"], **overrides)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"quorum": [{"approvals": 2, "value": "amount_cents"}]}, "value and above go together"),
        ({"quorum": [{"approvals": 2, "above": 5}]}, "value and above go together"),
        ({"quorum": [{"approvals": 1}]}, "approvals"),
        ({"quorum": [{"approvals": 11}]}, "approvals"),
        (
            {"quorum": [{"approvals": 2, "value": "currency", "above": 5}]},
            "quorum[0]: 'currency' must be one of the values, an integer or a number",
        ),
        (
            {"quorum": [{"approvals": 2, "value": "amount", "above": 5}]},
            "quorum[0]: 'amount' must be one of the values",
        ),
    ],
)
def test_the_catalogue_refuses_a_quorum_that_could_not_be_counted(overrides, problem):
    with pytest.raises(ValidationError) as refused:
        reviewed(**overrides)
    assert problem in str(refused.value)


def test_a_quorum_is_for_reviewed_tools_only():
    assert reviewed(quorum=[{"approvals": 2}]).quorum[0].value is None
    with pytest.raises(ValidationError, match="this tool's calls are never reviewed"):
        contract(quorum=[{"approvals": 2}])


# -- amounts converted into the catalogue's base currency ------------------------------------

#: A value converted by the table: the amount in euro cents, whatever the currency.
CONVERTED = {"param": "amount_cents", "type": "integer", "derive": "converted",
             "currency": "currency"}  # fmt: skip

TABLE = CurrencyTable(base="EUR", rates={"USD": 0.92, "JPY": 0.615})


def converting(**spec: Any) -> ToolContract:
    return contract(values={"amount_eur": {**CONVERTED, **spec}})


@pytest.mark.parametrize(
    ("amount", "currency", "converted"),
    [
        (120_000, "EUR", 120_000),  # the base itself needs no rate
        (100_000, "USD", 92_000),
        (1, "USD", 1),  # 0.92 rounds to 1
        (25, "JPY", 15),  # 15.375 rounds to 15; half to even below
        (10, "JPY", 6),  # 6.15
    ],
)
def test_an_amount_is_converted_by_the_table(amount, currency, converted):
    values = values_of(converting(), {"amount_cents": amount, "currency": currency}, TABLE)
    assert values == {"amount_eur": converted}
    assert type(values["amount_eur"]) is int


def test_an_integer_value_rounds_half_to_even_and_a_number_keeps_its_fraction():
    halves = CurrencyTable(base="EUR", rates={"XAU": 0.5})
    assert values_of(converting(), {"amount_cents": 5, "currency": "XAU"}, halves) == {
        "amount_eur": 2  # 2.5 to even
    }
    assert values_of(converting(), {"amount_cents": 7, "currency": "XAU"}, halves) == {
        "amount_eur": 4  # 3.5 to even
    }
    number = converting(type="number")
    assert values_of(number, {"amount_cents": 7, "currency": "XAU"}, halves) == {"amount_eur": 3.5}


@pytest.mark.parametrize("currency", ["CHF", "zzz", None, 12])
def test_a_currency_without_a_rate_is_refused_without_repeating_it(currency):
    params = {"amount_cents": 100, "currency": currency}
    with pytest.raises(InvalidInput) as refused:
        values_of(converting(), params, TABLE)
    message = str(refused.value)
    assert "value 'amount_eur'" in message
    assert "parameter 'currency'" in message
    assert "has no rate in the catalogue's currency table" in message
    if isinstance(currency, str):  # the caller's text is not repeated back
        assert currency not in message


def test_without_a_table_nothing_is_converted():
    with pytest.raises(InvalidInput, match="no rate"):
        values_of(converting(), {"amount_cents": 100, "currency": "EUR"}, None)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"type": "string"}, "derive: converted gives a number"),
        ({"currency": None}, "derive: converted needs currency"),
        ({"currency": "missing"}, "values['amount_eur'].currency: parameter 'missing' is not"),
    ],
)
def test_a_converted_value_must_be_numeric_and_name_its_currency(spec, problem):
    with pytest.raises(ValidationError, match=re.escape(problem)):
        converting(**spec)


def test_only_a_converted_value_names_a_currency():
    with pytest.raises(ValidationError, match="currency: goes only with derive: converted"):
        contract(values={"x": {"param": "amount_cents", "type": "integer",
                               "currency": "currency"}})  # fmt: skip


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"base": "euro"}, "base"),
        ({"base": "EUR", "rates": {"usd": 1}}, "rates"),
        ({"base": "EUR", "rates": {"USD": 0}}, "rates"),
        ({"base": "EUR", "rates": {"USD": "0.92"}}, "rates"),
        ({"base": "EUR", "rates": {"EUR": 2}}, "the base currency's rate is 1"),
    ],
)
def test_the_currency_table_refuses_what_it_cannot_convert_by(table, problem):
    with pytest.raises(ValidationError, match=re.escape(problem)):
        CurrencyTable.model_validate(table)
