"""Open a store from one address string, as configuration gives it.

Accepted forms (anything else is a :class:`~capgate.gateway.errors.StoreURLError`,
which is also a ``ValueError``, naming these):

- ``sqlite:///absolute/path/state.db`` (``sqlite:////absolute/...`` too): SQLite;
- a bare filesystem path, absolute or relative to the working folder (``~``
  expanded): SQLite;
- ``postgresql://user@host:5432/dbname`` (or ``postgres://``): PostgreSQL over TCP;
- ``postgresql:///dbname?host=/path/to/socket/folder&user=name``: PostgreSQL over a
  unix socket. Any libpq URL parameter may follow; prefer a password file
  (``~/.pgpass`` or ``passfile=``) to a password in the URL.

An in-memory SQLite database (``sqlite:///:memory:``, ``:memory:``) is refused:
every connection, and so every thread, would see its own empty database, and no
other process could see it at all; the store's guarantees would silently not hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from capgate.gateway.errors import StoreURLError, quote
from capgate.gateway.state.backend import Backend
from capgate.gateway.state.postgres import PostgresBackend
from capgate.gateway.state.sql import SqlStore
from capgate.gateway.state.sqlite import SqliteBackend
from capgate.gateway.state.store import Store
from capgate.gateway.state.times import Clock

__all__ = ["ACCEPTED_FORMS", "StoreAddress", "backend_for", "open_store", "parse_store_url"]

ACCEPTED_FORMS: Final = (
    "sqlite:///absolute/path.db, a filesystem path (SQLite), "
    "postgresql://user@host:port/dbname, or postgresql:///dbname?host=/socket/folder&user=name"
)
_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_LIBPQ_KEYWORDS: Final = re.compile(r"^\s*[A-Za-z_]+\s*=")
#: URL parameters never shown in a location.
_SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})


@dataclass(frozen=True)
class StoreAddress:
    """What an address names: a SQLite file or a PostgreSQL connection string."""

    kind: Literal["sqlite", "postgresql"]
    #: The absolute file path (SQLite) or the URL as given (PostgreSQL, for libpq;
    #: it may hold a password, so it is kept out of the repr).
    target: str = field(repr=False)
    #: For logs and messages: the path, or the URL without any password.
    location: str


def _refuse(url: str, why: str) -> StoreURLError:
    return StoreURLError(
        f"store address {quote(_without_secrets(url))}: {why}; accepted: {ACCEPTED_FORMS}"
    )


def _without_secrets(url: str) -> str:
    """The address with anything that may be a password cut out: the part before
    an ``@`` after the scheme, and ``password=`` parameters. A refused address is
    quoted in messages and logs, and it may be a mistyped one that still holds one."""
    shown = re.sub(r"(?i)(password=)[^&;\s]*", r"\1***", url)
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*:/*)[^/@?#]*@", r"\1***@", shown)


def _in_memory(url: str) -> StoreURLError:
    return _refuse(
        url,
        "an in-memory SQLite database is not allowed (each connection would get its own "
        "empty database, and other processes none); give a file path",
    )


def postgres_location(url: str) -> str:
    """``url`` without its password (in the user part or as a parameter)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://(unparsable address)"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hostinfo = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{hostinfo}" if user else hostinfo
    query = [
        (key, value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
        if key.lower() not in _SECRET_PARAMETERS
    ]
    # Built by hand: urlunsplit drops the empty host of a socket URL's "///".
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    return f"{shown}?{urlencode(query, safe='/')}" if query else shown


def parse_store_url(url: str) -> StoreAddress:
    """Which backend ``url`` names and where, without connecting to anything."""
    if not isinstance(url, str) or not url.strip():
        raise _refuse(str(url), "empty")
    if "\x00" in url:
        raise _refuse(url, "contains a NUL character")
    scheme_match = _SCHEME.match(url)
    scheme = scheme_match.group(1).lower() if scheme_match else None
    if scheme == "sqlite":
        if not url.lower().startswith("sqlite://"):
            raise _refuse(url, "a SQLite URL starts with sqlite:/// and an absolute path")
        rest = url[len("sqlite://") :]
        if not rest.startswith("/"):
            raise _refuse(url, "a SQLite URL has no host: write sqlite:///absolute/path.db")
        if "?" in rest or "#" in rest:
            raise _refuse(url, "a SQLite URL takes no options")
        path = "/" + unquote(rest).lstrip("/")
        if Path(path).name == ":memory:":
            raise _in_memory(url)
        if path == "/":
            raise _refuse(url, "no file path")
        return StoreAddress("sqlite", path, path)
    if scheme in ("postgresql", "postgres"):
        if not url[len(scheme) + 1 :].startswith("//"):
            raise _refuse(url, "a PostgreSQL URL starts with postgresql://")
        return StoreAddress("postgresql", url, postgres_location(url))
    if scheme is not None:
        raise _refuse(
            url, f"unknown scheme {quote(scheme, 20)} (a file name with a colon: write ./name)"
        )
    if url.strip() == ":memory:":
        raise _in_memory(url)
    if _LIBPQ_KEYWORDS.match(url):
        raise _refuse(url, "looks like a libpq key=value string; give a postgresql:// URL")
    resolved = str(Path(url).expanduser().absolute())
    return StoreAddress("sqlite", resolved, resolved)


def backend_for(url: str) -> Backend:
    """The backend for ``url``, its database not yet opened or migrated."""
    address = parse_store_url(url)
    if address.kind == "sqlite":
        return SqliteBackend(address.target)
    return PostgresBackend(address.target, location=address.location)


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """Open (creating or migrating it as needed) the store at ``url``.

    ``clock`` returns the current time as a timezone-aware datetime (default: the
    system clock in UTC); each transaction reads it once, as ``Tx.now``.
    Raises StoreURLError (a ValueError) for an address of no accepted form,
    StoreVersionError for a store written by a newer capgate, and StoreError when
    the database cannot be opened.
    """
    return SqlStore(backend_for(url), clock=clock)
