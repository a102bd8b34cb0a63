"""Compile a loaded catalogue into the data document OPA reads.

:func:`compile_catalogue` turns a :class:`~gateway.model.contracts.Catalogue` into
``data.capgate.catalogue`` as ``docs/policy-interface.md`` specifies: keyed by name
so that every policy lookup is one index, without the descriptions and schemas the
policy never reads, and stamped with a digest that identifies exactly this data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.digest import canonical_json, digest_of
from gateway.model.contracts import Catalogue, ToolContract

__all__ = ["catalogue_digest", "compile_catalogue"]


def catalogue_digest(document: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a compiled catalogue document, ignoring its ``meta`` key.

    The same function serves to stamp a document and to check one read back from
    OPA: equal policy data gives an equal digest, whatever the key order.
    """
    body = {key: value for key, value in document.items() if key != "meta"}
    return digest_of(canonical_json(body))


def _compile_tool(tool: ToolContract) -> dict[str, Any]:
    return {
        "name": tool.name,
        "version": tool.version,
        "mode": tool.mode.value,
        "roles": dict.fromkeys(tool.roles, True),
        "connection_alias": tool.connection_alias,
        "subject_type": tool.subject_type,
        "requires": list(tool.requires),
        "approval": tool.approval.value,
        "execution_action": tool.execution_action,
        "recovery": tool.recovery,
        "idempotency": tool.idempotency.value,
        "cost_class": tool.cost_class.value,
        "cost": tool.cost_units,
        "environments": dict.fromkeys(tool.environments, True),
        "produces": list(tool.produces),
        "reviewers": dict.fromkeys(tool.reviewers, True),
    }


def compile_catalogue(catalogue: Catalogue) -> dict[str, Any]:
    """The ``data.capgate.catalogue`` document for OPA (``docs/policy-interface.md``).

    Sets become ``{name: true}`` objects so the policy tests membership with one
    lookup. Descriptions and schemas stay out: the policy does not read them, and
    leaving them out keeps the digest about authority, not wording.
    """
    document: dict[str, Any] = {
        "tools": {name: _compile_tool(tool) for name, tool in sorted(catalogue.tools.items())},
        "task_types": {
            name: {"tools": dict.fromkeys(spec.tools, True)}
            for name, spec in sorted(catalogue.task_types.items())
        },
        "budget_classes": {
            name: {"admits": {cost.value: True for cost in spec.admitted}}
            for name, spec in sorted(catalogue.budget_classes.items())
        },
        "roles": {
            name: {"approves": {kind.value: True for kind in spec.approves}}
            for name, spec in sorted(catalogue.roles.items())
        },
    }
    document["meta"] = {
        "digest": catalogue_digest(document),
        "tool_count": len(catalogue.tools),
    }
    return document
