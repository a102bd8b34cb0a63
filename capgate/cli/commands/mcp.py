"""``capgate mcp``: review the tool definitions of upstream MCP servers.

A tool an MCP server offers runs behind capgate only under a definition a person
accepted (:mod:`capgate.adapters.tools.mcp.pins`):

- ``discover`` connects to the servers of the ``MCP_SERVERS`` gate (or ``--servers``,
  same syntax; ``MCP_ORACLE=1`` for the built-in oracle server), lists their tools and
  records each definition: a new tool is ``pending``, an accepted one whose
  definition changed (or that is no longer listed) becomes ``changed``, which
  quarantines its catalogue tool;
- ``pending`` shows what waits for review, each with a diff of the accepted and the
  shown definition, the server's annotation hints (hints only: the catalogue contract
  decides) and the digest to accept;
- ``accept SERVER TOOL --as CATALOGUE_TOOL`` accepts the shown definition as the
  catalogue tool whose ``upstream`` names that server and tool; ``--digest`` makes it
  accept only the definition that was reviewed (exit status 3 if the server shows
  another by now);
- ``reject SERVER TOOL`` rejects it: the tool stays quarantined while it is shown.

Accepting and rejecting are ledger rows, with who did it (``--by``, default the login
name; the command does not authenticate, as ``proposals approve`` does not). Server
text (descriptions, titles, schemas) is printed with control and format characters
escaped (:func:`capgate.cli.commands.common.safe`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

from capgate.adapters.tools.mcp.config import ServerSpec, parse_servers, servers_from_env
from capgate.adapters.tools.mcp.definitions import annotation_hints, definition_diff
from capgate.adapters.tools.mcp.pins import accept_definition, reject_definition
from capgate.cli.commands.common import (
    EXIT_DENIED,
    EXIT_ERROR,
    EXIT_OK,
    STORE_EXITS,
    Actions,
    add_action,
    add_by,
    add_group,
    add_json,
    identifier,
    opened_store,
    operator,
    print_json,
    safe,
    when,
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import InvalidInput, PinStale, UpstreamConfigError
from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.state.records import PinRecord, PinStatus

__all__ = ["configured_servers", "register"]

_DISCOVER_EXITS: Final = (
    (EXIT_OK, "every server was listed and its definitions recorded"),
    (EXIT_ERROR, "error: no server configured, a server unreachable, bad input or store"),
)
_REVIEW_EXITS: Final = (
    (EXIT_OK, "recorded"),
    (EXIT_ERROR, "error: no such definition, a catalogue tool that does not run it, store"),
    (EXIT_DENIED, "the server shows another definition than the --digest reviewed: nothing "
                  "recorded"),
)  # fmt: skip
_DIGEST_HELP: Final = (
    "the digest of the definition you reviewed (as `capgate mcp pending` shows it): "
    "nothing is recorded if the server shows another one by now (default: the one shown)"
)


def configured_servers(text: str | None = None) -> list[ServerSpec]:
    """``text`` (MCP_SERVERS syntax), else the gate's servers, with the oracle shorthand."""
    from capgate.demo.oracle_server import oracle_server_spec

    if text is not None and text.strip():
        return parse_servers(text)
    return servers_from_env(oracle=oracle_server_spec())


def _mapped(catalogue: Catalogue | None, pin: PinRecord) -> ToolContract | None:
    if catalogue is None:
        return None
    for contract in catalogue.upstream_tools().values():
        upstream = contract.upstream
        if upstream is not None and (upstream.server, upstream.tool) == (pin.server, pin.tool):
            return contract
    # An unplaced catalogue tool of the same name runs there once accepted as it.
    namesake = catalogue.tools.get(pin.tool)
    return namesake if namesake is not None and namesake.upstream is None else None


def _contract_line(contract: ToolContract) -> str:
    return (
        f"{contract.name} v{contract.version}: mode {contract.mode.value}, roles "
        f"{', '.join(contract.roles)}, connection {contract.connection_alias or '-'}, cost "
        f"{contract.cost_class.value}, approval {contract.approval.value}"
    )


# -- discover --------------------------------------------------------------------------------


def _discover(args: argparse.Namespace) -> int:
    servers = configured_servers(args.servers)
    if args.server:
        wanted = {identifier(name, "--server") for name in args.server}
        unknown = wanted - {s.id for s in servers}
        if unknown:
            raise UpstreamConfigError(f"--server: no configured server is {', '.join(unknown)}")
        servers = [s for s in servers if s.id in wanted]
    if not servers:
        raise UpstreamConfigError(
            "no MCP server is configured: set MCP_SERVERS (or MCP_ORACLE=1), or pass --servers"
        )
    try:
        from capgate.adapters.tools.mcp.client import McpTools
    except ImportError as exc:
        raise InvalidInput(
            f"discover needs the mcp extra: pip install 'capgate[mcp]' ({exc})"
        ) from None
    with opened_store(args) as store:
        with store.transaction(read_only=True) as tx:
            before = {(p.server, p.tool): p.status for p in tx.pins()}
        tools = McpTools(None, servers, store, connect_timeout=args.timeout,
                         call_timeout=args.timeout)  # fmt: skip
        try:
            listings = tools.discover()
        finally:
            tools.close()
        with store.transaction(read_only=True) as tx:
            pins = {s.id: tx.pins(server=s.id) for s in servers}
    report: list[dict[str, Any]] = []
    for server in servers:
        listed = {tool.get("name") for tool in listings.get(server.id, [])}
        for pin in pins[server.id]:
            if pin.tool in listed or before.get((pin.server, pin.tool)) != pin.status:
                was = before.get((pin.server, pin.tool))
                report.append(
                    {
                        "server": pin.server,
                        "tool": pin.tool,
                        "status": pin.status.value,
                        "was": was.value if was else None,
                        "digest": pin.observed_digest,
                        "catalogue_tool": pin.catalogue_tool,
                    }
                )
    if args.json:
        print_json({"servers": [s.id for s in servers], "tools": report})
        return EXIT_OK
    for server in servers:
        rows = [r for r in report if r["server"] == server.id]
        print(f"server {server.id} ({server.transport}: {safe(server.describe())}): "
              f"{len(listings.get(server.id, []))} tool(s)")  # fmt: skip
        for row in rows:
            change = "new" if row["was"] is None else (
                row["was"] if row["was"] == row["status"] else f"{row['was']} -> {row['status']}"
            )  # fmt: skip
            print(
                f"  {row['status']:<9} {safe(row['tool'])}  ({change}; {row['digest'] or 'gone'})"
            )
    waiting = sum(1 for r in report if r["status"] != PinStatus.ACCEPTED.value)
    if waiting:
        print(f"{waiting} definition(s) wait for review: capgate mcp pending")
    return EXIT_OK


# -- pending ---------------------------------------------------------------------------------

_STATUS_TEXT: Final = {
    PinStatus.PENDING: "pending: never accepted",
    PinStatus.CHANGED: "changed upstream since it was accepted: its catalogue tool is quarantined",
    PinStatus.REJECTED: "rejected: its catalogue tool is quarantined while the server shows it",
    PinStatus.ACCEPTED: "accepted",
}


def _pending(args: argparse.Namespace) -> int:
    server = None if args.server is None else identifier(args.server, "--server")
    catalogue = None if args.catalogue is None else load_catalogue(args.catalogue)
    with opened_store(args) as store, store.transaction(read_only=True) as tx:
        pins = tx.pins(server=server)
    if not args.all:
        pins = [pin for pin in pins if pin.status is not PinStatus.ACCEPTED]
    if args.json:
        print_json(
            [
                {
                    **pin.model_dump(mode="json"),
                    "diff": definition_diff(pin.accepted_definition, pin.observed_definition),
                    "runs": (m.name if (m := _mapped(catalogue, pin)) is not None else None),
                }
                for pin in pins
            ]
        )
        return EXIT_OK
    if not pins:
        print("(nothing to review)" if not args.all else "(no definitions recorded)")
        return EXIT_OK
    for pin in pins:
        print(f"server {pin.server}, tool {safe(pin.tool)}: {_STATUS_TEXT[pin.status]}")
        shown_digest = pin.observed_digest or "(no longer listed)"
        print(f"  shown:     {shown_digest} (listed {when(pin.observed_at, seconds=True)})")
        if pin.accepted_digest is not None:
            assert pin.accepted_at is not None
            at = when(pin.accepted_at, seconds=True)
            print(f"  accepted:  {pin.accepted_digest} as {pin.catalogue_tool} by "
                  f"{safe(pin.accepted_by or '-')} at {at}")  # fmt: skip
        if pin.rejected_digest is not None:
            print(f"  rejected:  {pin.rejected_digest} by {safe(pin.rejected_by or '-')}")
        print(f"  hints:     {safe(annotation_hints(pin.observed_definition))} (the server's; "
              "what the tool may do is its catalogue contract's)")  # fmt: skip
        contract = _mapped(catalogue, pin)
        if contract is not None:
            print(f"  contract:  {_contract_line(contract)}")
        if pin.status is not PinStatus.ACCEPTED and pin.observed_digest is not None:
            as_tool = contract.name if contract is not None else "CATALOGUE_TOOL"
            print(f"  accept:    capgate mcp accept {pin.server} {pin.tool} --as {as_tool} "
                  f"--digest {pin.observed_digest} --catalogue DIR")  # fmt: skip
        for line in definition_diff(pin.accepted_definition, pin.observed_definition):
            print(f"    {safe(line)}")
    return EXIT_OK


# -- accept, reject --------------------------------------------------------------------------


def _digest(args: argparse.Namespace) -> str | None:
    digest: str | None = args.digest
    if digest is not None and not (digest.startswith("sha256:") and len(digest) == 71):
        raise InvalidInput("--digest: a digest is sha256: and 64 hexadecimal digits")
    return digest


def _accept(args: argparse.Namespace) -> int:
    server = identifier(args.server, "SERVER")
    tool = args.tool
    as_tool = identifier(args.as_tool, "--as")
    digest = _digest(args)
    catalogue = load_catalogue(args.catalogue)
    by = operator(args.by)
    with opened_store(args) as store:
        try:
            pin = accept_definition(
                store, catalogue, server, tool, as_tool=as_tool, digest=digest, by=by
            )
        except PinStale as stale:
            return _stale(args, stale)
    contract = catalogue.tools[as_tool]
    if args.json:
        print_json({"accepted": True, "pin": pin.model_dump(mode="json")})
        return EXIT_OK
    print(f"accepted {pin.server} {safe(pin.tool)} as {as_tool}: {pin.accepted_digest}")
    print(f"  contract:  {_contract_line(contract)}")
    print(f"  by:        {safe(by)}")
    return EXIT_OK


def _reject(args: argparse.Namespace) -> int:
    server = identifier(args.server, "SERVER")
    digest = _digest(args)
    by = operator(args.by)
    with opened_store(args) as store:
        try:
            pin = reject_definition(store, server, args.tool, digest=digest, by=by)
        except PinStale as stale:
            return _stale(args, stale)
    if args.json:
        print_json({"rejected": True, "pin": pin.model_dump(mode="json")})
        return EXIT_OK
    print(f"rejected {pin.server} {safe(pin.tool)}: {pin.rejected_digest}")
    print(f"  status:    {_STATUS_TEXT[pin.status]}")
    return EXIT_OK


def _stale(args: argparse.Namespace, stale: PinStale) -> int:
    if args.json:
        print_json({"recorded": False, "code": stale.code, "shown": stale.shown})
    else:
        print(f"not recorded: {safe(str(stale))}")
    return EXIT_DENIED


# -- the parsers -----------------------------------------------------------------------------


def register(sub: Actions) -> None:
    """Add ``mcp`` to the ``capgate`` parser."""
    group = add_group(
        sub,
        "mcp",
        "discover and review the tool definitions of upstream MCP servers",
        "A tool of an upstream MCP server runs behind capgate only under a definition a "
        "person accepted, as a catalogue tool whose upstream names it. A definition that "
        "changes upstream quarantines that tool (tool_quarantined) until accepted again.\n\n"
        "Servers come from MCP_SERVERS ('::'-separated stdio command lines or loopback "
        "URLs, each optionally ID=...) or MCP_ORACLE=1 (the built-in oracle server).",
        [
            *STORE_EXITS,
            (EXIT_DENIED, "accept, reject: the server shows another definition than the "
                          "reviewed one"),
        ],
    )  # fmt: skip
    discover = add_action(
        group,
        "discover",
        "connect to the configured servers and record their tool definitions",
        _discover,
        exits=_DISCOVER_EXITS,
    )
    discover.add_argument(
        "--servers", metavar="SPEC", help="servers in MCP_SERVERS syntax (default: the gate's)"
    )
    discover.add_argument(
        "--server", action="append", metavar="ID", help="only this server (repeatable)"
    )
    discover.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="to start and list each server (default: 30)",
    )
    add_json(discover, "what was recorded")

    pending = add_action(
        group,
        "pending",
        "list definitions waiting for review, each with a diff against the accepted one",
        _pending,
        exits=STORE_EXITS,
    )
    pending.add_argument("--server", metavar="ID", help="only this server's")
    pending.add_argument("--all", action="store_true", help="every definition, accepted too")
    pending.add_argument(
        "--catalogue", type=Path, metavar="DIR", help="show the catalogue contract each one runs"
    )
    add_json(pending, "the definitions")

    for name, run, what in (
        ("accept", _accept, "accept the definition a server shows of a tool, as a catalogue tool"),
        (
            "reject",
            _reject,
            "reject the definition a server shows of a tool (it stays quarantined)",
        ),
    ):
        action = add_action(group, name, what, run, exits=_REVIEW_EXITS)
        action.add_argument("server", metavar="SERVER", help="the server's id")
        action.add_argument("tool", metavar="TOOL", help="the tool's name on that server")
        if name == "accept":
            action.add_argument(
                "--as",
                dest="as_tool",
                required=True,
                metavar="CATALOGUE_TOOL",
                help="the catalogue tool whose upstream is this server and tool",
            )
            action.add_argument(
                "--catalogue", type=Path, required=True, metavar="DIR", help="the catalogue folder"
            )
        action.add_argument("--digest", metavar="SHA256", help=_DIGEST_HELP)
        add_by(action)
        add_json(action, "the result")
