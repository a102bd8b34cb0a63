"""Credentials stay on the server: a connection alias becomes a secret at dispatch only.

An agent, a proposal, a log line or the ledger names a connection by its alias and
the provider account it acts as (``sales_mailbox``, ``sales@acme.example``); the
secret behind it is resolved from (tenant, alias) by a :class:`CredentialResolver`
immediately before a tool runs, and handed to the adapter in its CallContext as a
:class:`~capgate.gateway.tools.contract.Secret`, which never prints its value.

Each resolver keeps pairs apart: the secret of one (tenant, alias) is never where
another pair's is looked for, however alike their names (``acme.eu`` and
``acme-eu``, ``Acme`` and ``acme``), so one tenant's tools never run with another
tenant's secret. A resolver of one's own (``credentials:`` in ``capgate serve``'s
configuration) must keep that promise too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Final, Protocol, runtime_checkable

from pydantic import TypeAdapter, ValidationError

from capgate.gateway.errors import CredentialUnavailable, InvalidInput, quote
from capgate.gateway.model.facts import Identifier
from capgate.gateway.tools.contract import Secret

__all__ = [
    "VARIABLE_PREFIX",
    "CredentialResolver",
    "EnvironmentCredentials",
    "NoCredentials",
    "StaticCredentials",
]

#: The prefix of the variables :class:`EnvironmentCredentials` reads by default.
VARIABLE_PREFIX: Final = "CAPGATE_SECRET_"
#: Between the tenant's part and the alias's part of a variable.
_SEPARATOR: Final = "__"
#: A prefix: the start of a variable name, in the alphabet shells, Docker and
#: Kubernetes accept, ending with ``_`` so that a reader sees where the names begin.
_PREFIX: Final = re.compile(r"[A-Z][A-Z0-9_]{0,62}_")
#: Tenant and alias are capgate names: the facts' Identifier rule (one source of it).
_NAME: Final = TypeAdapter(Identifier)
#: A name written as it is (upper-cased): no leading, trailing or doubled ``_``.
_PLAIN: Final = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
#: A variable's part: a plain name upper-cased, or ``_`` and the hex of a name's bytes.
_PART: Final = r"(?:[A-Z0-9]+(?:_[A-Z0-9]+)*|_[0-9A-F]+)"
_PARTS: Final = re.compile(rf"(?P<tenant>{_PART}){_SEPARATOR}(?P<alias>{_PART})")


@runtime_checkable
class CredentialResolver(Protocol):
    """Turns (tenant, alias) into the connection's secret, or raises CredentialUnavailable.

    Two different pairs never resolve through one secret (see the module's doc).
    """

    def resolve(self, tenant: str, alias: str) -> Secret: ...


class NoCredentials:
    """The default: no connection has a secret here (tools that need one refuse)."""

    def resolve(self, tenant: str, alias: str) -> Secret:
        raise CredentialUnavailable(
            f"no credential resolver is configured, so connection {quote(alias)} of "
            f"tenant {quote(tenant)} has no secret"
        )


class StaticCredentials:
    """Secrets held in memory, by (tenant, alias): for tests, demos and small services.

    Keyed by the exact pair, so two pairs never share a secret, whatever the names.
    """

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
    """Secrets from environment variables, one per (tenant, alias), read at each dispatch.

    The variable is the prefix (``CAPGATE_SECRET_``), the tenant's part, ``__`` and
    the alias's part. A part is written one of two ways:

    - **plain**: a name of lower-case letters and digits, with single underscores
      between them (``acme``, ``sales_mailbox``, ``crm2``), is upper-cased:
      ``acme`` / ``sales_mailbox`` reads ``CAPGATE_SECRET_ACME__SALES_MAILBOX``;
    - **escaped**: any other name (upper case, ``.``, ``-``, ``:``, ``/``, a leading,
      trailing or doubled ``_``) is ``_`` and the upper-case hex of its UTF-8 bytes:
      ``acme-eu`` / ``crm`` reads ``CAPGATE_SECRET__61636D652D6575__CRM``.

    The mapping is injective, so no two (tenant, alias) pairs read one variable:
    a plain part has no ``__`` and neither starts nor ends with ``_``, and an escaped
    part starts with ``_`` and has only hex digits after it, so the first ``__``
    after the prefix is always the separator, and each part says how it is written.
    :meth:`names_of` is the inverse, and refuses a variable that no pair maps to.
    (The mapping this replaces turned every character but a letter or digit into
    ``_`` and upper-cased the rest, so ``acme.eu``, ``acme-eu``, ``acme_eu`` and
    ``ACME_EU`` read one variable, and so did (``a``, ``b__crm``) and (``a__b``,
    ``crm``): one tenant's tools ran with another tenant's secret.)

    Why this form: the names most tenants and aliases have keep the variable an
    operator would guess, and the variables of such names are the ones they were;
    every other name gets one uniform escape whose proof fits in the paragraph
    above, where per-character escapes would be barely more readable and need a
    longer proof. Refusing the other names instead would leave tenants like
    ``acme-eu`` without environment credentials at all. Variables hold only
    ``A-Z``, ``0-9`` and ``_``, which shells, Docker's ``env_file`` and Kubernetes
    accept. An operator finds a name with ``capgate connections variable TENANT
    ALIAS``; the error for a variable that is not set names it too. The environment
    is read at each dispatch, so a rotated secret is used from the next call on; an
    empty variable is not set.

    ``prefix`` must be upper-case letters, digits and ``_``, start with a letter and
    end with ``_``; ``environ`` (default ``os.environ``) is where the variables are
    read, for tests and for services that load them from elsewhere.
    """

    def __init__(
        self, prefix: str = VARIABLE_PREFIX, *, environ: Mapping[str, str] | None = None
    ) -> None:
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise InvalidInput(
                f"credential variable prefix {quote(prefix, 40)} is not 2 to 64 upper-case "
                "letters, digits and _, starting with a letter and ending with _ "
                f"(e.g. {VARIABLE_PREFIX})"
            )
        self.prefix = prefix
        self._environ = os.environ if environ is None else environ

    def variable(self, tenant: str, alias: str) -> str:
        """The variable holding the secret of ``tenant``'s connection ``alias``.

        Raises InvalidInput when either is not a capgate name (an Identifier).
        """
        return f"{self.prefix}{_part(tenant, 'tenant')}{_SEPARATOR}{_part(alias, 'alias')}"

    def names_of(self, variable: str) -> tuple[str, str]:
        """The (tenant, alias) whose secret ``variable`` holds: the inverse of
        :meth:`variable`. Raises InvalidInput for a variable no pair maps to."""
        found = None
        if isinstance(variable, str) and variable.startswith(self.prefix):
            found = _PARTS.fullmatch(variable, len(self.prefix))
        tenant = alias = None
        if found is not None:
            tenant, alias = _name_of(found["tenant"]), _name_of(found["alias"])
        if tenant is None or alias is None:
            raise InvalidInput(
                f"{quote(variable, 160)} is not a credential variable "
                f"({self.prefix}<TENANT>__<ALIAS>, as `capgate connections variable` names it)"
            )
        return tenant, alias

    def resolve(self, tenant: str, alias: str) -> Secret:
        try:
            name = self.variable(tenant, alias)
        except InvalidInput as exc:
            raise CredentialUnavailable(str(exc)) from None
        value = self._environ.get(name)
        if not value:
            raise CredentialUnavailable(
                f"no secret for connection {quote(alias)} of tenant {quote(tenant)} "
                f"(${name} is not set)"
            )
        return Secret(value)

    def __repr__(self) -> str:  # never the environment: it holds the secrets
        return f"EnvironmentCredentials(prefix={self.prefix!r})"


def _part(name: str, what: str) -> str:
    """A name's part of a variable: plain (upper-cased) or escaped (``_`` + hex)."""
    try:
        _NAME.validate_python(name, strict=True)
    except ValidationError:
        raise InvalidInput(
            f"{what} {quote(name, 40)} is not a capgate name (1 to 128 letters, digits and "
            "_ . : / -, starting with a letter or digit), so it has no credential variable"
        ) from None
    if _PLAIN.fullmatch(name):
        return name.upper()
    return "_" + name.encode("utf-8").hex().upper()


def _name_of(part: str) -> str | None:
    """The name ``part`` was written from, or None when :func:`_part` writes no such
    part (hex that is not UTF-8 or not a name, a name that is written plain)."""
    if part.startswith("_"):
        try:
            name = bytes.fromhex(part[1:]).decode("utf-8")
        except ValueError:  # odd length, or not UTF-8 (UnicodeDecodeError)
            return None
    else:
        name = part.lower()
    try:
        written = _part(name, "name")
    except InvalidInput:
        return None
    return name if written == part else None
