"""An agent's proposals as MCP resources, so that it hears when one changes.

Each proposal a caller made is the resource ``capgate://proposals/<id>``: ``resources/list``
lists the caller's own (newest first), ``resources/read`` gives one as JSON (status,
reason codes, reviews, and once dispatched the outcome with the provider's receipt:
the facts of ``capgate.proposals.status``). Another caller's proposal, or another
tenant's, is a resource that does not exist.

**Hearing of a change.** A client subscribes to a proposal's resource
(``resources/subscribe`` on a handshake-era connection, or ``resourceSubscriptions``
of a 2026-07-28 ``subscriptions/listen`` stream) and is sent
``notifications/resources/updated`` whenever what the resource says changes: a
review, the dispatch, the outcome, a block. Nothing tells this process of a change
made by another (a reviewer's CLI, another server's worker), so the watch reads the
subscribed proposals from the store every ``poll_seconds``, as the tool-list watch
composes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

import mcp_types as types
from mcp.shared.exceptions import MCPError

from capgate.adapters.fronts.answers import proposal_view_answer
from capgate.adapters.fronts.desk import ReviewDesk
from capgate.gateway.errors import CapgateError
from capgate.gateway.model.facts import Principal

__all__ = [
    "RESOURCE_NOT_FOUND",
    "URI_PREFIX",
    "fingerprints",
    "list_result",
    "proposal_of",
    "read_result",
    "uri_of",
]

URI_PREFIX: Final = "capgate://proposals/"
#: The JSON-RPC error the MCP specification gives a resource that does not exist.
RESOURCE_NOT_FOUND: Final = -32002
_MIME: Final = "application/json"


def uri_of(proposal_id: str) -> str:
    return URI_PREFIX + proposal_id


def proposal_of(uri: str) -> str | None:
    """The proposal id of a resource URI of ours, else None."""
    text = str(uri)
    return text.removeprefix(URI_PREFIX) if text.startswith(URI_PREFIX) else None


def list_result(desk: ReviewDesk, principal: Principal) -> types.ListResourcesResult:
    resources = [
        types.Resource(
            uri=uri_of(p.id),
            name=p.id,
            title=f"{p.tool} proposal",
            description=f"Your proposal {p.id} of {p.tool}: its status and outcome.",
            mime_type=_MIME,
        )
        for p in desk.own(principal)
    ]
    return types.ListResourcesResult(resources=resources)


def read_result(desk: ReviewDesk, principal: Principal, uri: str) -> types.ReadResourceResult:
    """The resource's JSON; MCPError ``RESOURCE_NOT_FOUND`` for one not the caller's."""
    proposal_id = proposal_of(uri)
    try:
        if proposal_id is None:
            raise LookupError
        answer = proposal_view_answer(desk.own_one(principal, proposal_id))
    except (LookupError, CapgateError):
        # The same answer for another's proposal, another tenant's, and none at all.
        raise MCPError(RESOURCE_NOT_FOUND, "resource not found", data={"uri": str(uri)}) from None
    text = json.dumps(answer.facts, ensure_ascii=True, sort_keys=True)
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=str(uri), mime_type=_MIME, text=text)]
    )


def fingerprints(desk: ReviewDesk, principal: Principal, uris: Iterable[str]) -> dict[str, Any]:
    """What each subscribed resource says now (None for one that is not the caller's),
    to compare with the last poll's."""
    seen: dict[str, Any] = {}
    for uri in uris:
        proposal_id = proposal_of(uri)
        try:
            view = desk.own_one(principal, proposal_id) if proposal_id is not None else None
        except CapgateError:
            view = None
        seen[uri] = None if view is None else proposal_view_answer(view).facts
    return seen
