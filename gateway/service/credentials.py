"""Credentials stay on the server: a connection alias becomes a secret at dispatch only.

An agent, a proposal, a log line or the ledger names a connection by its alias and
the provider account it acts as (``sales_mailbox``, ``sales@acme.example``); the
secret behind it is resolved from (tenant, alias) by a :class:`CredentialResolver`
immediately before a tool runs, and handed to the adapter in its CallContext as a
:class:`~gateway.dispatch.transport.Secret`, which never prints its value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from gateway.dispatch.transport import Secret
from gateway.errors import CredentialUnavailable, quote

__all__ = [
    "CredentialResolver",
    "EnvironmentCredentials",
    "NoCredentials",
    "StaticCredentials",
]


@runtime_checkable
class CredentialResolver(Protocol):
    """Turns (tenant, alias) into the connection's secret, or raises CredentialUnavailable."""

    def resolve(self, tenant: str, alias: str) -> Secret: ...


class NoCredentials:
    """The default: no connection has a secret here (tools that need one refuse)."""

    def resolve(self, tenant: str, alias: str) -> Secret:
        raise CredentialUnavailable(
            f"no credential resolver is configured, so connection {quote(alias)} of "
            f"tenant {quote(tenant)} has no secret"
        )


class StaticCredentials:
    """Secrets held in memory, by (tenant, alias): for tests, demos and small services."""

    def __init__(self, secrets: Mapping[tuple[str, str], str]) -> None:
        self._secrets = {key: Secret(value) for key, value in secrets.items()}

    def resolve(self, tenant: str, alias: str) -> Secret:
        try:
            return self._secrets[(tenant, alias)]
        except KeyError:
            raise CredentialUnavailable(
                f"no secret for connection {quote(alias)} of tenant {quote(tenant)}"
            ) from None

    def __repr__(self) -> str:
        return f"StaticCredentials({len(self._secrets)} secret(s))"


class EnvironmentCredentials:
    """Secrets from environment variables: ``CAPGATE_SECRET_<TENANT>__<ALIAS>``.

    Tenant and alias are upper-cased, and every character that is not a letter or a
    digit becomes ``_`` (``acme`` / ``sales_mailbox`` reads
    ``CAPGATE_SECRET_ACME__SALES_MAILBOX``). The variable is read at each dispatch,
    so a rotated secret is used from the next call on.
    """

    def __init__(self, prefix: str = "CAPGATE_SECRET_") -> None:
        self.prefix = prefix

    def variable(self, tenant: str, alias: str) -> str:
        def part(text: str) -> str:
            return re.sub(r"[^A-Za-z0-9]", "_", text).upper()

        return f"{self.prefix}{part(tenant)}__{part(alias)}"

    def resolve(self, tenant: str, alias: str) -> Secret:
        name = self.variable(tenant, alias)
        value = os.environ.get(name)
        if not value:
            raise CredentialUnavailable(
                f"no secret for connection {quote(alias)} of tenant {quote(tenant)} "
                f"(${name} is not set)"
            )
        return Secret(value)
