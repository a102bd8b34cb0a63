"""Where OPA is, and what the policy client may present to it.

Addresses are restricted to loopback IP literals and unix sockets. Policy traffic
carries who-may-do-what facts and the answer is trusted as the security decision,
so it must not leave the machine, and it must not depend on name resolution
(``localhost`` is whatever ``/etc/hosts`` or a resolver says it is).

A locked-down OPA (``--authentication=token --authorization=basic`` with the
``system.authz`` policy of the deployment bundle, see ``docs/deployment.md``) answers
only a client that presents the gateway's bearer token; :func:`check_token` says
what can be sent as one. Both checks run before a request is sent, and neither
message quotes a token.

An :class:`OPAAddress` is an address with where it came from (``--opa``,
``$CAPGATE_OPA_URL``, a caller's argument, or the embedded OPA capgate started), so
that an OPA that cannot be reached is reported with where to look: the address most
often wrong is one left set in the environment.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final
from urllib.parse import urlsplit

__all__ = [
    "MAX_TOKEN_CHARS",
    "OPA_URL_ENV",
    "AddressOrigin",
    "Endpoint",
    "OPAAddress",
    "check_token",
    "parse_address",
]

#: Environment variable naming an external OPA, e.g. ``http://127.0.0.1:8181``.
OPA_URL_ENV: Final = "CAPGATE_OPA_URL"

# Base URL used for unix sockets: the host is never resolved, only sent as Host header.
_UDS_BASE_URL: Final = "http://opa"

#: The longest bearer token accepted; capgate's own are 43 characters.
MAX_TOKEN_CHARS: Final = 4096
# RFC 6750's b64token, which is what can travel in a header unquoted and unaltered.
_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


@dataclass(frozen=True)
class Endpoint:
    """Where to send requests: a base URL and, for a unix socket, its path."""

    base_url: str
    uds: str | None


class AddressOrigin(StrEnum):
    """Where an OPA address came from."""

    #: ``--opa`` on capgate's command line.
    OPTION = "option"
    #: ``$CAPGATE_OPA_URL``.
    ENVIRONMENT = "environment"
    #: An argument of the library (``PolicySidecar(opa_url=...)``, ``PolicyClient``).
    ARGUMENT = "argument"
    #: The embedded OPA capgate started, on its private unix socket.
    EMBEDDED = "embedded"


@dataclass(frozen=True, slots=True)
class OPAAddress:
    """An OPA address and where it came from, for messages that say where to look."""

    url: str
    origin: AddressOrigin = AddressOrigin.ARGUMENT

    def describe(self) -> str:
        """``OPA at http://127.0.0.1:8181 (from $CAPGATE_OPA_URL)``, or the embedded OPA."""
        if self.origin is AddressOrigin.EMBEDDED:
            return f"the embedded OPA capgate started ({self.url})"
        said = {
            AddressOrigin.OPTION: "given with --opa",
            AddressOrigin.ENVIRONMENT: f"from ${OPA_URL_ENV}",
            AddressOrigin.ARGUMENT: "given by the caller",
        }[self.origin]
        return f"OPA at {self.url} ({said})"

    def advice(self) -> str:
        """What to do when OPA cannot be reached there."""
        if self.origin is AddressOrigin.EMBEDDED:
            return (
                "it may have exited (see capgate's log); `capgate doctor` starts one "
                "and says what fails"
            )
        if self.origin is AddressOrigin.ENVIRONMENT:
            return (
                f"${OPA_URL_ENV} is set in this environment: start OPA there, or unset "
                "it to let capgate start its own; `capgate doctor` checks the address"
            )
        return f"is OPA running there? `capgate doctor --opa {self.url}` checks the address"


def parse_address(address: str) -> Endpoint:
    """Accept ``http://<loopback IP>[:port]`` or ``unix:///abs/path``; refuse the rest."""
    parts = urlsplit(address)
    if parts.query or parts.fragment:
        raise ValueError(f"OPA address {address!r} must not carry a query or fragment")
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(
                f"OPA address {address!r}: a unix socket address is unix:///absolute/path"
            )
        return Endpoint(base_url=_UDS_BASE_URL, uds=parts.path)
    if parts.scheme != "http":
        raise ValueError(
            f"OPA address {address!r}: scheme must be 'http' (loopback) or 'unix'; "
            "policy traffic never leaves this machine, so TLS is not offered"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"OPA address {address!r} must not carry credentials")
    if parts.path not in ("", "/"):
        raise ValueError(f"OPA address {address!r} must not carry a path")
    host = parts.hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"OPA address {address!r}: host must be a loopback IP literal such as "
            "127.0.0.1 or [::1], not a name that a resolver could point elsewhere"
        ) from None
    if not ip.is_loopback:
        raise ValueError(
            f"OPA address {address!r}: host {host} is not a loopback address; "
            "policy traffic must not leave this machine"
        )
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(f"OPA address {address!r} has a malformed port") from None
    return Endpoint(base_url=f"http://{parts.netloc}", uds=None)


def check_token(token: str) -> str:
    """``token`` if it can be sent as a bearer token, else ValueError.

    RFC 6750's token characters only (letters, digits, ``-._~+/``, then ``=``
    padding), at most :data:`MAX_TOKEN_CHARS`: anything else (a space, a line break
    that would start another header, a non-ASCII letter) is refused before it is
    sent. The message never quotes the token.
    """
    if not isinstance(token, str) or not token:
        raise ValueError("the OPA token is empty")
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"the OPA token is longer than {MAX_TOKEN_CHARS} characters")
    if not _TOKEN_RE.fullmatch(token):
        raise ValueError(
            "the OPA token holds a character a bearer token may not (allowed: letters, "
            "digits, - . _ ~ + / and trailing =)"
        )
    return token
