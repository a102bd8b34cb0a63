"""The docker-compose demo: an MCP client of the gateway's HTTP endpoint.

    .venv/bin/python docker/mcp_demo.py http://127.0.0.1:8765/mcp build/deploy/gateway/mcp-token

Connects with the official ``mcp`` client and the deployment's MCP client token, waits
(up to ``--wait`` seconds) for the gateway to answer, prints the tools OPA composed for
the token's binding, then calls ``contact.read`` for contact c-42 and prints the result.
Exit status 0 when both worked, 1 otherwise. It never prints the token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client


async def _demo(url: str, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        listed = sorted(tool.name for tool in (await client.list_tools()).tools)
        # The server's own tools (capgate.proposals.status, ...) beside the catalogue's.
        tools = [name for name in listed if not name.startswith("capgate.")]
        print(f"tools/list: {len(tools)} tools composed for this client")
        for name in tools:
            print(f"  {name}")
        own = [name for name in listed if name.startswith("capgate.")]
        print(f"  and the server's own: {', '.join(own) or 'none'}")
        result = await client.call_tool("contact.read", {"contact_id": "c-42"})
        print("tools/call contact.read {'contact_id': 'c-42'}:")
        print(json.dumps(result.structured_content, indent=2, sort_keys=True))
        return 1 if result.is_error else 0


def _answers(url: str) -> bool:
    """The server answers HTTP at all (401 without a token is an answer)."""
    try:
        httpx2.get(url, timeout=2)
    except httpx2.HTTPError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the gateway's MCP endpoint, http://127.0.0.1:PORT/mcp")
    parser.add_argument("token_file", type=Path, help="the MCP client's token file")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for it")
    args = parser.parse_args(argv)
    token = args.token_file.read_text(encoding="utf-8").strip()
    deadline = time.monotonic() + args.wait
    while not _answers(args.url):
        if time.monotonic() > deadline:
            print(f"mcp_demo: {args.url} did not answer within {args.wait:g} s", file=sys.stderr)
            return 1
        time.sleep(0.5)
    return anyio.run(_demo, args.url, token)


if __name__ == "__main__":
    sys.exit(main())
