"""A Gateway for unit tests: a real SQLite store, a scripted decider standing in for OPA.

The store is never mocked: each test gets a fresh SQLite file in its ``tmp_path``,
seeded the way an operator would seed it (a tenant, its budget class and limit, its
connections), and the gateway reads every fact that grants from there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state import open_store
from capgate.gateway.state.store import Store
from capgate.gateway.tools.contract import Adapter
from capgate.gateway.tools.registry import ToolRegistry

TENANT: Final = "t"
#: Every demo connection of the tenant, active, with a secret behind it.
CONNECTIONS: Final = {"crm": "t@crm.example", "sales_mailbox": "t@mail.example", "bank": "t@bank"}
SECRETS: Final = {(TENANT, alias): f"secret-{alias}-0451" for alias in CONNECTIONS}


def open_seeded_store(
    tmp_path: Path,
    *,
    budget_class: str = "standard",
    budget_limit: int | None = None,
    connections: Mapping[str, ConnectionStatus] | None = None,
) -> Store:
    """A fresh SQLite store holding tenant ``t`` and its connections (all active)."""
    store = open_store(str(tmp_path / "state.db"))
    statuses = connections or dict.fromkeys(CONNECTIONS, ConnectionStatus.ACTIVE)
    with store.transaction() as tx:
        tx.put_tenant(TENANT, budget_class=budget_class, budget_limit=budget_limit)
        for alias, status in statuses.items():
            tx.put_connection(TENANT, alias, status=status, account=CONNECTIONS.get(alias, alias))
    return store


def gateway(
    catalogue: Catalogue, decider: Any, store: Store, *adapters: Adapter, **options: Any
) -> Gateway:
    """A gateway over ``store`` asking ``decider``, with the tenant's secrets."""
    return Gateway(
        catalogue,
        decider,
        ToolRegistry(*adapters),
        store,
        credentials=StaticCredentials(SECRETS),
        **options,
    )


def request(role: str = "sales", task: Mapping[str, Any] | None = None) -> AgentRequest:
    """An agent of tenant ``t`` in ``role``, on a task with an id (as the gateway needs)."""
    return AgentRequest.model_validate(
        {
            "principal": {"agent": "a", "role": role, "tenant": TENANT},
            "task": task
            or {
                "type": "customer_quote",
                "id": "task-1",
                "linked_resources": [{"type": "contact", "id": "c"}],
            },
            "environment": "production",
        }
    )


def closing(store: Store) -> Iterator[Store]:
    """For a fixture: yield the store, close it afterwards."""
    try:
        yield store
    finally:
        store.close()
