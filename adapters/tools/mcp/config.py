"""Which MCP servers capgate runs upstream tools on: the ``MCP_SERVERS`` gate.

The gate of the tool-contract seed, for the gateway:

- ``MCP_SERVERS``: ``::``-separated entries, each a stdio command line (run without a
  shell, split like a POSIX shell would) or an ``http://`` / ``https://`` URL of a
  streamable-HTTP server on this machine (``127.0.0.1`` or ``[::1]``, nothing else:
  no host name a resolver could point elsewhere). An entry may start with
  ``ID=`` to name the server; otherwise its id is derived (below). The id is what
  a catalogue contract's ``upstream.server`` and the pins name.
- ``MCP_ORACLE=1``: shorthand for the built-in oracle server (the application
  passes its spec as ``oracle``); ignored when ``MCP_SERVERS`` is set.

With neither set there are no servers: every tool stays in-process, the offline
default. Nothing here imports the ``mcp`` package.

Derived ids: for a URL, ``<host>-<port>`` (``127.0.0.1-8931``); for a command line,
the module of ``-m MODULE`` (its last dotted part) or else the program's file name
without its extension (``mcp-server-time``).
"""

from __future__ import annotations

import os
import re
import shlex
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Final

from capgate.gateway.errors import UpstreamConfigError, quote

__all__ = [
    "MCP_ORACLE_ENV",
    "MCP_SERVERS_ENV",
    "ServerSpec",
    "parse_servers",
    "servers_from_env",
]

MCP_SERVERS_ENV: Final = "MCP_SERVERS"
MCP_ORACLE_ENV: Final = "MCP_ORACLE"

#: Hosts a streamable-HTTP upstream may be at: loopback IP literals only.
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "::1"})
_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
_NAMED: Final = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.:/-]{0,127})=(.*)$", re.S)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One upstream MCP server: a stdio command line or a loopback URL, and its id."""

    id: str
    command: tuple[str, ...] = ()
    url: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.fullmatch(self.id):
            raise UpstreamConfigError(
                f"server id {quote(self.id)} is not a name (1 to 128 letters, digits and "
                "_ . : / -, starting with a letter or digit)"
            )
        if (self.url is None) == (not self.command):
            raise UpstreamConfigError(
                f"server {quote(self.id)}: give a command line or a URL, exactly one"
            )
        if self.url is not None:
            check_url(self.url)
        elif not all(isinstance(word, str) and word and "\0" not in word for word in self.command):
            raise UpstreamConfigError(f"server {quote(self.id)}: empty or malformed command line")

    @property
    def transport(self) -> str:
        return "streamable-http" if self.url is not None else "stdio"

    def describe(self) -> str:
        """For people and logs: the URL, or the command line as a shell would read it."""
        return self.url if self.url is not None else shlex.join(self.command)


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL to a loopback IP literal, else UpstreamConfigError."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise UpstreamConfigError(f"{quote(url)} is not a URL") from None
    if parts.scheme not in ("http", "https"):
        raise UpstreamConfigError(f"{quote(url)}: only http:// and https:// URLs are served")
    if parts.username is not None or parts.password is not None:
        raise UpstreamConfigError(f"{quote(url)}: no credentials in the address")
    if parts.hostname not in LOOPBACK_HOSTS:
        raise UpstreamConfigError(
            f"{quote(url)}: an upstream server must be on this machine, at 127.0.0.1 or "
            "[::1] (a host name or another address is refused)"
        )
    del port
    return url


def _derived_id(command: Sequence[str], url: str | None) -> str:
    if url is not None:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        return f"{host.replace(':', '.').strip('.') or 'loopback'}-{port}"
    words = list(command)
    if "-m" in words[:-1]:
        module = words[words.index("-m") + 1]
        name = module.rsplit(".", 1)[-1]
    else:
        name = PurePath(words[0]).stem
    name = re.sub(r"[^A-Za-z0-9_.:/-]", "-", name).lstrip("_.:/-")
    return name[:128] or "server"


_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def _entry(text: str) -> ServerSpec:
    named = None if _URL.match(text) else _NAMED.match(text)
    server_id = None
    if named:  # "ID=command line" or "ID=URL"
        server_id, text = named.group(1), named.group(2).strip()
    if not text:
        raise UpstreamConfigError(f"{MCP_SERVERS_ENV}: an entry names no server")
    if _URL.match(text):
        url = check_url(text)
        return ServerSpec(server_id or _derived_id((), url), url=url)
    try:
        command = tuple(shlex.split(text))
    except ValueError as exc:
        raise UpstreamConfigError(f"{MCP_SERVERS_ENV}: {quote(text)}: {exc}") from None
    if not command:
        raise UpstreamConfigError(f"{MCP_SERVERS_ENV}: an entry names no server")
    return ServerSpec(server_id or _derived_id(command, None), command=command)


def parse_servers(text: str) -> list[ServerSpec]:
    """The servers of an ``MCP_SERVERS`` value, in order; ids must be unique."""
    # "::" separates entries, except inside the brackets of an IPv6 address ([::1]).
    parts = re.split(r"::(?![^\[]*\])", text)
    servers = [_entry(part.strip()) for part in parts if part.strip()]
    seen: set[str] = set()
    for server in servers:
        if server.id in seen:
            raise UpstreamConfigError(
                f"{MCP_SERVERS_ENV}: two servers have the id {quote(server.id)}; name them "
                "with ID=... in front of each entry"
            )
        seen.add(server.id)
    return servers


def servers_from_env(
    environ: Mapping[str, str] | None = None, *, oracle: ServerSpec | None = None
) -> list[ServerSpec]:
    """The gate: ``MCP_SERVERS``, else ``MCP_ORACLE=1`` (the ``oracle`` spec), else none.

    An empty list means everything stays in-process.
    """
    env = os.environ if environ is None else environ
    listed = env.get(MCP_SERVERS_ENV, "")
    if listed.strip():
        return parse_servers(listed)
    flag = env.get(MCP_ORACLE_ENV, "").strip()
    if flag in ("", "0"):
        return []
    if flag != "1":
        raise UpstreamConfigError(f"{MCP_ORACLE_ENV} is 1 (the built-in oracle server) or unset")
    if oracle is None:
        raise UpstreamConfigError(
            f"{MCP_ORACLE_ENV}=1 names the application's built-in oracle server, and none "
            "was given here"
        )
    return [oracle]
