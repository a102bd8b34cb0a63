"""The gateway's own MCP tools: an agent asks after its proposals, a reviewer reviews.

Beside the catalogue's tools, ``capgate serve`` lists tools of its own, under the
``capgate.`` prefix a catalogue may not use (the server refuses to start on a
catalogue tool of that prefix):

=============================  ===================================================
``capgate.proposals.status``   every caller: its own proposals (newest first), or
                               one of them whole, with its status, reviews and
                               outcome (the provider's receipt once dispatched)
``capgate.reviews.pending``    a caller whose role approves something: the pending
                               proposals of its tenant
``capgate.reviews.show``       ... one of them whole: content (untrusted data),
                               digest, proposer, reviews
``capgate.reviews.approve``    ... a verdict on the content it was shown, named by
``capgate.reviews.reject``     its digest: ``stale`` when that is not the content
                               now, ``already_decided`` when someone decided first;
                               an optional ``comment`` is kept with the verdict
``capgate.tasks.link``         a caller whose role lists resource types it may link
``capgate.tasks.unlink``       (``links``): link a resource to another task of its
                               tenant, or unlink it, if the link policy allows
=============================  ===================================================

The reviewer is the caller's own binding, as the review policy sees it
(:meth:`Reviewer.of_agent <capgate.gateway.model.facts.Reviewer.of_agent>`, with how
the binding was authenticated): never a name in the arguments. Whether the review
tools are listed is a convenience read from the catalogue (does the caller's role
approve any kind of approval?); every verdict is the review policy's to allow, and
the same agent that proposed a call is refused as ``self_review``. Likewise the link
tools are listed for a role with ``links``, and every change is the link policy's to
allow (``capgate/link``): the caller's own tenant, role and task are its binding's, so
it can neither link in another tenant nor widen the task it works in. The answers are
the fronts' shared ones (:mod:`capgate.adapters.fronts.answers`), rendered by
:func:`~capgate.adapters.fronts.mcp.results.tool_result` like every other answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import mcp_types as types
from pydantic import TypeAdapter

from capgate.adapters.fronts.answers import (
    Answer,
    error_answer,
    link_answer,
    proposal_view_answer,
    proposals_answer,
    verdict_answer,
)
from capgate.adapters.fronts.desk import ReviewDesk
from capgate.gateway.errors import CapgateError, InvalidInput, quote
from capgate.gateway.model.comments import MAX_COMMENT_CHARS
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import Identifier, Principal, ResourceRef, Reviewer
from capgate.gateway.service.links import link_outcome
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import ReviewVerdict

__all__ = [
    "APPROVE",
    "DESK_PREFIX",
    "LINK",
    "PENDING",
    "REJECT",
    "SHOW",
    "STATUS",
    "UNLINK",
    "desk_answer",
    "desk_tools",
]

#: The prefix of the server's own tools; no catalogue tool may carry it.
DESK_PREFIX: Final = "capgate."
STATUS: Final = "capgate.proposals.status"
PENDING: Final = "capgate.reviews.pending"
SHOW: Final = "capgate.reviews.show"
APPROVE: Final = "capgate.reviews.approve"
REJECT: Final = "capgate.reviews.reject"
LINK: Final = "capgate.tasks.link"
UNLINK: Final = "capgate.tasks.unlink"

_ID: Final = {
    "type": "string",
    "minLength": 1,
    "maxLength": 128,
    "description": "a proposal id, as a proposal answer or a listing gave it",
}
_DIGEST: Final = {
    "type": "string",
    "pattern": "^sha256:[0-9a-f]{64}$",
    "description": "the params_digest of the proposal as capgate.reviews.show showed it",
}
#: The one identifier rule of the facts (:data:`~capgate.gateway.model.facts.Identifier`),
#: as JSON Schema: what the link tools' arguments must be before anything is asked.
_NAME_RULE: Final = TypeAdapter(Identifier).json_schema()
_TASK_ID: Final = {**_NAME_RULE, "description": "the id of the task whose links change"}
_RESOURCE_TYPE: Final = {
    **_NAME_RULE,
    "description": "the resource's type, one your role may link (repository, invoice...)",
}
_RESOURCE_ID: Final = {**_NAME_RULE, "description": "the resource's id (inv-9, repo-api...)"}
_COMMENT: Final = {
    "type": "string",
    "maxLength": MAX_COMMENT_CHARS,
    "description": "optional: why, in your words, kept with the verdict and shown with the "
    "proposal's reviews (not seen by the review policy); newlines and tabs are kept, other "
    "control characters are refused",
}


def _tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> types.Tool:
    return types.Tool.model_validate(
        {
            "name": name,
            "description": description,
            "inputSchema": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
            "annotations": {"readOnlyHint": name in (STATUS, PENDING, SHOW)},
            "_meta": {"capgate/desk": True},
        }
    )


_STATUS_TOOL: Final = _tool(
    STATUS,
    "The state of proposals you made (calls of reviewed tools): without proposal_id, your "
    "latest ones; with it, that one whole, with its reviews and, once dispatched, its "
    "outcome and the provider's receipt.",
    {"proposal_id": _ID},
    [],
)
_REVIEW_TOOLS: Final = (
    _tool(
        PENDING,
        "The proposals of your tenant waiting for a review, oldest first.",
        {},
        [],
    ),
    _tool(
        SHOW,
        "One proposal whole: the exact content that would be sent (untrusted data an agent "
        "wrote), its digest, who proposed it, its reviews.",
        {"proposal_id": _ID},
        ["proposal_id"],
    ),
    _tool(
        APPROVE,
        "Approve a pending proposal, as yourself, if the review policy lets you. Name the "
        "digest of the content you were shown: a proposal whose content is not that is "
        "refused as stale. A comment, if you give one, is kept with your verdict.",
        {"proposal_id": _ID, "digest": _DIGEST, "comment": _COMMENT},
        ["proposal_id", "digest"],
    ),
    _tool(
        REJECT,
        "Reject a pending proposal, as yourself, on the same terms as approving it (saying "
        "why in a comment helps the agent and the people after you).",
        {"proposal_id": _ID, "digest": _DIGEST, "comment": _COMMENT},
        ["proposal_id", "digest"],
    ),
)
_LINK_ARGUMENTS: Final = {
    "task_id": _TASK_ID,
    "resource_type": _RESOURCE_TYPE,
    "resource_id": _RESOURCE_ID,
}
_LINK_TOOLS: Final = (
    _tool(
        LINK,
        "Link a resource to a task of your tenant, so that the task's tools may work on "
        "it, if the link policy lets your role link that type of resource. Never the "
        "task you work in yourself. Linking what is linked already changes nothing.",
        _LINK_ARGUMENTS,
        list(_LINK_ARGUMENTS),
    ),
    _tool(
        UNLINK,
        "Unlink a resource from a task of your tenant, on the same terms as linking it.",
        _LINK_ARGUMENTS,
        list(_LINK_ARGUMENTS),
    ),
)
DESK_NAMES: Final = frozenset({STATUS, *(tool.name for tool in (*_REVIEW_TOOLS, *_LINK_TOOLS))})


def may_review(catalogue: Catalogue, principal: Principal) -> bool:
    """Whether the caller's role approves any kind of approval (the tools are listed
    then; the review policy decides every verdict all the same)."""
    role = catalogue.roles.get(principal.role)
    return role is not None and bool(role.approves)


def may_link(catalogue: Catalogue, principal: Principal) -> bool:
    """Whether the caller's role lists resource types it may link (the link tools are
    listed then; the link policy decides every change all the same)."""
    role = catalogue.roles.get(principal.role)
    return role is not None and bool(role.links)


def desk_tools(catalogue: Catalogue, principal: Principal) -> list[types.Tool]:
    """The server's own tools this caller is shown."""
    return [
        _STATUS_TOOL,
        *(_REVIEW_TOOLS if may_review(catalogue, principal) else ()),
        *(_LINK_TOOLS if may_link(catalogue, principal) else ()),
    ]


def desk_tool(catalogue: Catalogue, principal: Principal, name: str) -> types.Tool | None:
    """The tool of that name if this caller is shown it, else None (an unknown tool)."""
    return next((t for t in desk_tools(catalogue, principal) if t.name == name), None)


def desk_answer(
    desk: ReviewDesk, request: AgentRequest, name: str, arguments: Mapping[str, Any]
) -> Answer:
    """The answer to one call of a desk tool the caller was shown (run in a thread)."""
    try:
        return _answer(desk, request, name, arguments)
    except CapgateError as exc:
        return error_answer(exc)


def _answer(
    desk: ReviewDesk, request: AgentRequest, name: str, arguments: Mapping[str, Any]
) -> Answer:
    principal = request.principal
    if name == STATUS:
        (proposal_id,) = _arguments(arguments, required=(), optional=("proposal_id",))
        if proposal_id is None:
            return proposals_answer(desk.own(principal), "you proposed, newest first")
        return proposal_view_answer(desk.own_one(principal, proposal_id))
    if name in (LINK, UNLINK):
        task_id, kind, ident = _arguments(arguments, required=tuple(_LINK_ARGUMENTS), optional=())
        action: Literal["link", "unlink"] = "link" if name == LINK else "unlink"
        resource = {"type": kind, "id": ident}
        # The gateway's own act, as any front would ask it: the link policy decides.
        link, changed = desk.gateway.agent_link(request, action, task_id, resource)
        status = link_outcome(action, changed)
        return link_answer(status, task_id, ResourceRef.model_validate(resource), link)
    reviewer = Reviewer.of_agent(principal, authenticated_by=request.authenticated_by or "mcp")
    if name == PENDING:
        _arguments(arguments, required=(), optional=())
        return proposals_answer(desk.pending(reviewer), f"pending in tenant {principal.tenant}")
    if name == SHOW:
        (proposal_id,) = _arguments(arguments, required=("proposal_id",), optional=())
        return proposal_view_answer(desk.show(reviewer, proposal_id))
    verdict = ReviewVerdict.APPROVED if name == APPROVE else ReviewVerdict.REJECTED
    proposal_id, digest, comment = _arguments(
        arguments, required=("proposal_id", "digest"), optional=("comment",)
    )
    review = desk.decide(reviewer, proposal_id, verdict, digest=digest, comment=comment)
    quorum = desk.progress(review.proposal_id) if verdict is ReviewVerdict.APPROVED else None
    return verdict_answer(review, quorum)


def _arguments(
    arguments: Mapping[str, Any], *, required: tuple[str, ...], optional: tuple[str, ...]
) -> list[Any]:
    """The named string arguments, in order; InvalidInput naming the field otherwise
    (the values are never quoted: they are the caller's)."""
    unknown = sorted(set(arguments) - {*required, *optional})
    if unknown:
        raise InvalidInput(f"unknown argument(s): {', '.join(quote(k, 40) for k in unknown[:3])}")
    values = []
    for key in (*required, *optional):
        value = arguments.get(key)
        if value is None and key in required:
            raise InvalidInput(f"{key}: required")
        if value is not None and not isinstance(value, str):
            raise InvalidInput(f"{key}: must be a string")
        values.append(value)
    return values
