"""Messages for compose's reason codes, rendered here from documented templates.

An agent's compose answer is the visible set and nothing more; why each other tool
is hidden is for people and audits, and costs a reason object per hidden tool, so
the policy gives it on request only, as codes with the facts each check read
(``capgate/explain/compose``). This module turns those into the
``{"code", "message"}`` reasons people read:

- :data:`TEMPLATES` holds one message template per compose reason code.
  ``docs/reason-codes.md`` lists the same templates, and a test holds the two
  to each other in both directions. Execute's messages use the same wording, in
  Rego (``capgate.visibility``), and a test holds the two renderings equal.
- :func:`render` fills a template: ``{tool}`` and every fact name are replaced by
  the value as compact JSON, so a string shows quoted and a missing fact as null.
- :func:`with_reasons` attaches the reasons of an explanation to the compose
  decision it explains, refusing (PolicyUnavailable) an explanation that does not
  agree with the decision: one answer about another catalogue, or another verdict,
  is no answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.decisions import ComposeDecision, ComposeExplanation, Reason

__all__ = ["TEMPLATES", "compose_reasons", "render", "with_reasons"]

#: The message template of every compose reason code. ``{tool}`` is the tool's name;
#: every other ``{name}`` is the fact of that name the failing check read.
TEMPLATES: Final[Mapping[str, str]] = {
    "role_not_granted": "tool {tool} is not granted to role {role}",
    "not_needed_by_task": (
        "tool {tool} is not offered by task type {task_type} with task.needs {needs}"
    ),
    "connection_missing": "tool {tool} needs connection {alias}, which the tenant does not have",
    "tool_not_enabled_for_tenant": (
        "tool {tool} needs connection {alias}, which the tenant has disabled"
    ),
    "connection_revoked": (
        "tool {tool} needs connection {alias}, whose status is {status}, not active"
    ),
    "environment_restricted": "tool {tool} is not available in environment {environment}",
    "budget_class_exceeded": (
        "tool {tool} has cost class {cost_class}, which budget class {budget_class} does not admit"
    ),
    "tool_quarantined": (
        "tool {tool} is quarantined: its MCP server's current definition of it is not one "
        "a person accepted"
    ),
}

_FIELD: Final = re.compile(r"\{([a-z_]+)\}")


def _json(value: Any) -> str:
    # Compact, like Rego's json.marshal, so both renderings read the same.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def render(code: str, tool: str, facts: Mapping[str, Any]) -> str:
    """The message for ``code`` hiding ``tool``, from its template and the check's facts.

    A code without a template (a policy newer than this gateway) renders as a plain
    sentence naming the code, never as an error: reasons are for people, and the
    verdict does not depend on them.
    """
    template = TEMPLATES.get(code)
    if template is None:
        return f"tool {_json(tool)} is hidden: {code}"
    values = {"tool": tool, **facts}
    return _FIELD.sub(lambda match: _json(values.get(match.group(1))), template)


def compose_reasons(explanation: ComposeExplanation) -> dict[str, list[Reason]]:
    """``{name: reasons}`` for every tool the explanation hides, one per failing check."""
    return {
        name: [
            Reason(code=check.code, message=render(check.code, name, check.facts))
            for check in tool.checks
            if check.code is not None
        ]
        for name, tool in sorted(explanation.tools.items())
        if not tool.visible
    }


def with_reasons(decision: ComposeDecision, explanation: ComposeExplanation) -> ComposeDecision:
    """``decision`` with ``excluded`` filled from ``explanation``; PolicyUnavailable if
    the two were made under different catalogues or disagree about any tool."""
    if explanation.catalogue_digest != decision.catalogue_digest:
        raise PolicyUnavailable(
            "compose and its explanation were made under different catalogues "
            f"({decision.catalogue_digest} and {explanation.catalogue_digest}); refusing both"
        )
    if sorted(decision.visible) != explanation.visible:
        raise PolicyUnavailable(
            "compose and its explanation disagree about which tools are visible; refusing both"
        )
    return decision.model_copy(update={"excluded": compose_reasons(explanation)})
