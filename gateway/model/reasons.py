"""Messages for compose's reason codes, rendered from the policies' own templates.

An agent's compose answer is the visible set and nothing more; why each other tool
is hidden is for people and audits, and costs a reason object per hidden tool, so
the policy gives it on request only, as codes with the facts each check read
(``capgate/explain/compose``). This module turns those into the
``{"code", "message"}`` reasons people read:

- The templates come with the explanation (``ComposeExplanation.templates``): each
  compose check declares its codes' templates once, in the policies
  (``capgate.visibility.declared``), and explain answers with them. So the gateway
  keeps no copy that could drift, and the messages are those of the policies that
  made the decision, wherever OPA loaded them from. Execute renders its reasons in
  Rego from the same templates, and ``docs/reason-codes.md`` is written from them.
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

__all__ = ["compose_reasons", "render", "with_reasons"]

_FIELD: Final = re.compile(r"\{([a-z_]+)\}")


def _json(value: Any) -> str:
    # Compact, like Rego's json.marshal, so both renderings read the same.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def render(templates: Mapping[str, str], code: str, tool: str, facts: Mapping[str, Any]) -> str:
    """The message for ``code`` hiding ``tool``: its template in ``templates`` filled
    with the check's facts.

    A code the templates lack (a policy that declares none for it) renders as a plain
    sentence naming the code, never as an error: reasons are for people, and the
    verdict does not depend on them.
    """
    template = templates.get(code)
    if template is None:
        return f"tool {_json(tool)} is hidden: {code}"
    values = {"tool": tool, **facts}
    return _FIELD.sub(lambda match: _json(values.get(match.group(1))), template)


def compose_reasons(explanation: ComposeExplanation) -> dict[str, list[Reason]]:
    """``{name: reasons}`` for every tool the explanation hides, one per failing check."""
    return {
        name: [
            Reason(
                code=check.code,
                message=render(explanation.templates, check.code, name, check.facts),
            )
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
