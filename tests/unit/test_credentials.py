"""Credential resolvers: each (tenant, alias) has a secret of its own, or none.

Issue #17: ``EnvironmentCredentials`` used to turn every character but a letter or
digit into ``_`` and upper-case the rest, so ``acme.eu``, ``acme-eu``, ``acme_eu``
and ``ACME_EU`` read one variable, and so did (``a``, ``b__crm``) and (``a__b``,
``crm``): a call of tenant ``acme-eu`` ran with ``acme.eu``'s secret. These tests
hold the fixed examples and the attack through a Gateway; the properties over
generated names are in ``tests/fuzz/test_credential_properties.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest

from capgate.adapters.fronts.session import AgentSession
from capgate.adapters.tools.in_process import InProcessTools, current_call
from capgate.cli.commands.common import EXIT_ERROR, EXIT_OK
from capgate.cli.main import main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import CredentialUnavailable, InvalidInput
from capgate.gateway.model.facts import ConnectionStatus
from capgate.gateway.service.credentials import (
    VARIABLE_PREFIX,
    EnvironmentCredentials,
    NoCredentials,
    StaticCredentials,
)
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state import open_store
from capgate.gateway.tools.registry import ToolRegistry
from tests.unit.scripted_decider import ScriptedDecider, compose_decision

#: Name pairs that the old mapping sent to one variable, grouped.
COLLIDING: Final = [
    [("acme.eu", "crm"), ("acme-eu", "crm"), ("acme_eu", "crm"), ("ACME_EU", "crm")],
    [("a", "b__crm"), ("a__b", "crm")],
    [("acme", "crm"), ("Acme", "crm"), ("acme", "CRM")],
    [("acme", "sales_mailbox"), ("acme", "sales-mailbox"), ("acme", "sales.mailbox")],
    [("t", "a_"), ("t", "a-"), ("t", "a.")],
    [("t_", "a"), ("t:", "a"), ("t/", "a")],
    [("x", "y:z"), ("x", "y/z"), ("x", "y_z")],
]
SECRET: Final = "s3cr3t-of-acme.eu-0451"


def test_names_the_old_mapping_confused_read_different_variables():
    credentials = EnvironmentCredentials()
    for group in COLLIDING:
        variables = [credentials.variable(tenant, alias) for tenant, alias in group]
        assert len(set(variables)) == len(group), dict(zip(group, variables, strict=True))


def test_common_names_keep_their_readable_variable():
    credentials = EnvironmentCredentials()
    assert credentials.variable("acme", "crm") == "CAPGATE_SECRET_ACME__CRM"
    assert credentials.variable("acme", "sales_mailbox") == "CAPGATE_SECRET_ACME__SALES_MAILBOX"
    assert credentials.variable("t2", "bank") == "CAPGATE_SECRET_T2__BANK"


def test_other_names_are_escaped_as_the_hex_of_their_bytes():
    credentials = EnvironmentCredentials()
    assert credentials.variable("acme-eu", "crm") == "CAPGATE_SECRET__61636D652D6575__CRM"
    assert credentials.variable("acme.eu", "crm") == "CAPGATE_SECRET__61636D652E6575__CRM"
    assert credentials.variable("Acme", "crm") == "CAPGATE_SECRET__41636D65__CRM"
    assert credentials.variable("a", "b__crm") == "CAPGATE_SECRET_A___625F5F63726D"
    assert credentials.variable("a__b", "crm") == "CAPGATE_SECRET__615F5F62__CRM"


def test_names_of_is_the_inverse_of_variable():
    credentials = EnvironmentCredentials()
    for group in COLLIDING:
        for pair in group:
            assert credentials.names_of(credentials.variable(*pair)) == pair


@pytest.mark.parametrize(
    "variable",
    [
        "CAPGATE_SECRET_ACME",  # no separator
        "CAPGATE_SECRET_ACME__",  # no alias
        "CAPGATE_SECRET___CRM",  # no tenant ("_" alone is not a part)
        "CAPGATE_SECRET_ACME___CRM",  # "_CRM" is not hex
        "CAPGATE_SECRET_ACME__CRM_",  # a trailing "_"
        "CAPGATE_SECRET__61636D65__CRM",  # "acme" escaped: it is written ACME
        "CAPGATE_SECRET__61636d652D6575__CRM",  # lower-case hex
        "CAPGATE_SECRET__616__CRM",  # odd hex
        "CAPGATE_SECRET__FF__CRM",  # not UTF-8
        "CAPGATE_SECRET__2D61__CRM",  # "-a" is not a name
        "CAPGATE_SECRET_acme__CRM",  # lower case
        "OTHER_ACME__CRM",  # another prefix
        "CAPGATE_SECRET_A__B__C",  # two separators: "B__C" is no part
    ],
)
def test_names_of_refuses_what_no_pair_maps_to(variable):
    with pytest.raises(InvalidInput, match="is not a credential variable"):
        EnvironmentCredentials().names_of(variable)


def test_each_pair_reads_its_own_variable_and_nothing_else(monkeypatch):
    credentials = EnvironmentCredentials()
    for group in COLLIDING:
        set_pair, *others = group
        monkeypatch.setenv(credentials.variable(*set_pair), SECRET)
        assert credentials.resolve(*set_pair).reveal() == SECRET
        for tenant, alias in others:
            with pytest.raises(CredentialUnavailable) as caught:
                credentials.resolve(tenant, alias)
            message = str(caught.value)
            assert SECRET not in message
            assert f"${credentials.variable(tenant, alias)} is not set" in message
        monkeypatch.delenv(credentials.variable(*set_pair))


def test_an_empty_variable_is_not_set():
    credentials = EnvironmentCredentials(environ={"CAPGATE_SECRET_ACME__CRM": ""})
    with pytest.raises(CredentialUnavailable, match=r"\$CAPGATE_SECRET_ACME__CRM is not set"):
        credentials.resolve("acme", "crm")


def test_a_name_that_is_not_an_identifier_has_no_variable():
    credentials = EnvironmentCredentials(environ={})
    for tenant, alias in [("", "crm"), ("acme", "c rm"), ("-acme", "crm"), ("a" * 129, "crm")]:
        with pytest.raises(InvalidInput, match="is not a capgate name"):
            credentials.variable(tenant, alias)
        with pytest.raises(CredentialUnavailable, match="is not a capgate name"):
            credentials.resolve(tenant, alias)


@pytest.mark.parametrize(
    "prefix", ["", "SECRET", "secret_", "_SECRET_", "MY-SECRET_", "9SECRET_", "S" * 64 + "_"]
)
def test_a_prefix_must_be_a_variable_name_ending_in_underscore(prefix):
    with pytest.raises(InvalidInput, match="prefix"):
        EnvironmentCredentials(prefix)


def test_another_prefix_maps_the_same_way():
    credentials = EnvironmentCredentials("MY_APP_", environ={"MY_APP__61636D652D6575__CRM": "x"})
    assert credentials.variable("acme-eu", "crm") == "MY_APP__61636D652D6575__CRM"
    assert credentials.names_of("MY_APP__61636D652D6575__CRM") == ("acme-eu", "crm")
    assert credentials.resolve("acme-eu", "crm").reveal() == "x"
    assert VARIABLE_PREFIX == EnvironmentCredentials().prefix == "CAPGATE_SECRET_"


def test_the_environment_is_never_shown():
    credentials = EnvironmentCredentials(environ={"CAPGATE_SECRET_ACME__CRM": SECRET})
    assert SECRET not in repr(credentials)
    assert repr(credentials) == "EnvironmentCredentials(prefix='CAPGATE_SECRET_')"


def test_static_and_no_credentials_keep_pairs_apart():
    static = StaticCredentials({pair: f"secret-{n}" for n, pair in enumerate(COLLIDING[0])})
    for n, pair in enumerate(COLLIDING[0]):
        assert static.resolve(*pair).reveal() == f"secret-{n}"
    with pytest.raises(CredentialUnavailable):
        static.resolve("acme", "crm")
    with pytest.raises(CredentialUnavailable):
        NoCredentials().resolve("acme.eu", "crm")


def test_capgate_connections_variable_prints_the_name_the_resolver_reads(capsys):
    for tenant, alias in [pair for group in COLLIDING for pair in group]:
        assert main(["connections", "variable", tenant, alias]) == EXIT_OK
        out = capsys.readouterr().out
        assert out == EnvironmentCredentials().variable(tenant, alias) + "\n"
    assert main(["connections", "variable", "acme eu", "crm"]) == EXIT_ERROR
    assert "TENANT: 'acme eu' is not a valid name" in capsys.readouterr().err


# -- the attack of issue #17, through the public API ----------------------------------


def _agent(tenant: str) -> AgentRequest:
    return AgentRequest.model_validate(
        {
            "principal": {"agent": "a", "role": "sales", "tenant": tenant},
            "task": {
                "type": "customer_quote",
                "id": "task-1",
                "linked_resources": [{"type": "contact", "id": "c"}],
            },
            "environment": "production",
        }
    )


def test_a_tenant_never_runs_with_the_secret_of_a_tenant_whose_name_looks_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Tenant acme-eu's call must not receive acme.eu's secret: it has none, so the
    tool is not entered; acme.eu's own call gets its own."""
    store = open_store(str(tmp_path / "state.db"))
    try:
        with store.transaction() as tx:
            for tenant in ("acme.eu", "acme-eu"):
                tx.put_tenant(tenant, budget_class="standard", budget_limit=None)
                tx.put_connection(
                    tenant, "crm", status=ConnectionStatus.ACTIVE, account=f"{tenant}@crm.example"
                )
        held: list[tuple[str, str]] = []

        def read(contact_id: str) -> dict[str, Any]:
            call = current_call()
            assert call.credential is not None
            held.append((call.tenant, call.credential.reveal()))
            return {"contact_id": contact_id, "name": "n", "email": "n@example.test"}

        tools = InProcessTools()
        tools.register("contact.read", "d", read)
        gateway = Gateway(
            load_catalogue(demo_catalogue_dir("sales")),
            ScriptedDecider(compose_answer=compose_decision(["contact.read"])),
            ToolRegistry(tools),
            store,
            credentials=EnvironmentCredentials(),
        )
        # Only acme.eu's secret is set, under its variable and under the one the old
        # mapping gave both tenants: neither is acme-eu's.
        monkeypatch.setenv(EnvironmentCredentials().variable("acme.eu", "crm"), SECRET)
        monkeypatch.setenv("CAPGATE_SECRET_ACME_EU__CRM", SECRET)

        with pytest.raises(CredentialUnavailable) as caught:
            AgentSession(gateway, _agent("acme-eu")).call_tool("contact.read", contact_id="c")
        assert SECRET not in str(caught.value)
        assert "$CAPGATE_SECRET__61636D652D6575__CRM is not set" in str(caught.value)
        assert held == []

        AgentSession(gateway, _agent("acme.eu")).call_tool("contact.read", contact_id="c")
        assert held == [("acme.eu", SECRET)]
    finally:
        store.close()
