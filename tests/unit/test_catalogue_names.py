"""Names a request gives that the catalogue lacks: the did-you-mean, and the library's
warning once per name (capgate.gateway.catalogue.names)."""

from __future__ import annotations

import logging

import pytest

from capgate.gateway.catalogue import undeclared_names
from capgate.gateway.catalogue.names import Undeclared, UndeclaredWatch, declared_names
from capgate.gateway.model.contracts import Catalogue

LOGGER = "capgate.catalogue"


def test_a_typo_is_named_with_a_suggestion_and_the_declared_values(sales_catalogue: Catalogue):
    [problem] = undeclared_names(sales_catalogue, "salse", "customer_quote", "production")

    assert problem == Undeclared(
        "role",
        "salse",
        ("controller", "finance", "sales", "sales_manager", "support"),
        "sales",
    )
    assert problem.message() == (
        "role 'salse' is not declared in the catalogue; did you mean 'sales'? "
        "(declared: 'controller', 'finance', 'sales', 'sales_manager', 'support')"
    )


def test_a_case_difference_suggests_the_declared_spelling(sales_catalogue: Catalogue):
    problems = undeclared_names(sales_catalogue, "Sales", "Customer_Quote", "PRODUCTION")

    assert [(p.field, p.value, p.suggestion) for p in problems] == [
        ("role", "Sales", "sales"),
        ("task type", "Customer_Quote", "customer_quote"),
        ("environment", "PRODUCTION", "production"),
    ]


def test_nothing_close_suggests_nothing_and_lists_what_is_declared(sales_catalogue: Catalogue):
    [problem] = undeclared_names(sales_catalogue, "sales", "customer_quote", "mars")

    assert problem.suggestion is None
    assert "did you mean" not in problem.message()
    assert problem.message().endswith("(declared: 'development', 'production', 'staging')")


def test_all_declared_is_nothing_to_say(sales_catalogue: Catalogue):
    assert undeclared_names(sales_catalogue, "sales", "customer_quote", "production") == []
    declared = declared_names(sales_catalogue)
    assert undeclared_names(declared, "finance", "invoice_payment", "staging") == []


def test_a_long_declared_list_is_cut_and_a_long_value_quoted_short():
    problem = Undeclared("role", "x" * 1000, tuple(f"role{i}" for i in range(12)), None)

    message = problem.message()
    assert "'role0', 'role1', 'role2', 'role3', 'role4' and 7 more" in message
    assert "(1000 characters)" in message
    assert len(message) < 300


def test_the_watch_warns_once_per_name_and_never_about_declared_ones(
    sales_catalogue: Catalogue, caplog: pytest.LogCaptureFixture
):
    watch = UndeclaredWatch(sales_catalogue)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        watch.check("sales", "customer_quote", "production")
        for _ in range(3):
            watch.check("salse", "customer_quote", "production")
        watch.check("salse", "customer_quote", "prod")

    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 2
    assert "role 'salse'" in warned[0]
    assert "did you mean 'sales'?" in warned[0]
    assert "environment 'prod'" in warned[1]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_the_watch_remembers_a_bounded_number_of_names(
    sales_catalogue: Catalogue, caplog: pytest.LogCaptureFixture
):
    watch = UndeclaredWatch(sales_catalogue, remember=3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for number in range(10):
            watch.check(f"role{number}", "customer_quote", "production")

    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 4  # three names, then once: no more are logged
    assert "no more are logged" in warned[-1]
    assert len(watch._warned) == 3
