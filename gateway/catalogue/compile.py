"""Compile a loaded catalogue into the data document OPA reads.

:func:`compile_catalogue` turns a :class:`~capgate.gateway.model.contracts.Catalogue` into
``data.capgate.catalogue`` as ``docs/policy-interface.md`` specifies: keyed by name
so that every policy lookup is one index, without the descriptions and schemas the
policy never reads, and stamped with a digest that identifies exactly this data.

Beside the contracts it writes ``index``: for each fact a compose check reads (role,
task type, connection alias, environment, cost class), the set of tools that pass
for each value, as ``{value: {name: true}}``. The compose checks read only the
index, per tool (execute: ``index.by_role[role][name]``) and as whole sets (compose:
the intersection of the sets the facts select), so both questions read one source
and a 10,000-tool compose is a handful of set operations, not a rule per tool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from capgate.gateway.digest import canonical_json, digest_of
from capgate.gateway.model.contracts import (
    Catalogue,
    RoleSpec,
    TaskLinks,
    TaskTypeSpec,
    ToolContract,
)

__all__ = ["catalogue_digest", "compile_catalogue", "compile_index", "contract_digest"]


def catalogue_digest(document: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a compiled catalogue document, ignoring its ``meta`` key.

    The same function serves to stamp a document and to check one read back from
    OPA: equal policy data gives an equal digest, whatever the key order.
    """
    body = {key: value for key, value in document.items() if key != "meta"}
    try:
        # canonical_json's bytes, without its Python-level copy and check of every value
        # first: a compiled document (or one read back from OPA) is plain JSON, and the
        # copy costs most of a second for 10,000 tools. Anything else still goes there.
        text = json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError):
        return digest_of(canonical_json(body))
    return digest_of(text.encode("utf-8"))


def contract_digest(tool: ToolContract) -> str:
    """``sha256:<hex>`` of what one contract version stands for: its compiled form
    (what the policies read) and its input and output schemas (what passes before
    OPA is asked, and what a result must be). The description stays out, so
    rewording a contract needs no new version."""
    return digest_of(
        canonical_json(
            {
                "compiled": _compile_tool(tool),
                "input_schema": tool.input_schema,
                "output_schema": tool.output_schema,
            }
        )
    )


def _compile_tool(tool: ToolContract) -> dict[str, Any]:
    return {
        "name": tool.name,
        "version": tool.version,
        "mode": tool.mode.value,
        "roles": dict.fromkeys(tool.roles, True),
        "connection_alias": tool.connection_alias,
        "subject_type": tool.subject_type,
        "requires": tool.required_names,
        # What each required piece of evidence must be about, by name: the call's
        # subject, or a value with the type its evidence has (email_digest, ...);
        # a name absent here is evidence about anything.
        "requires_about": {
            required.name: {"about": required.about, "type": tool.evidence_kind(required.about)}
            for required in tool.requires
            if required.about is not None
        },
        "approval": tool.approval.value,
        "execution_action": tool.execution_action,
        "recovery": tool.recovery,
        "idempotency": tool.idempotency.value,
        "cost_class": tool.cost_class.value,
        "cost": tool.cost_units,
        "environments": dict.fromkeys(tool.environments, True),
        "produces": tool.produced_names,
        "reviewers": dict.fromkeys(tool.reviewers, True),
        # What the policies may read of a call (input.call.values) and the limits on
        # it; roles absent from a limit: every role the tool grants.
        "values": {name: {"type": spec.type.value} for name, spec in sorted(tool.values.items())},
        "limits": [
            {
                "value": limit.value,
                "max": limit.max,
                "roles": dict.fromkeys(limit.roles or tool.roles, True),
            }
            for limit in tool.limits
        ],
        "cost_value": tool.cost_value,
        "quorum": [
            {"approvals": rule.approvals, "value": rule.value, "above": rule.above}
            for rule in tool.quorum
        ],
    }


def _add(index: dict[str, dict[str, bool]], key: str, name: str) -> None:
    index.setdefault(key, {})[name] = True


def compile_index(catalogue: Catalogue) -> dict[str, Any]:
    """The ``index`` section: which tools pass each compose check, by the fact's value.

    ``by_role`` holds only the roles the catalogue declares and ``by_task_type`` only
    the catalogue's own tools, so a lookup in the index is the whole check.
    ``no_connection`` holds the tools that need no tenant connection, which the
    connection check passes whatever the tenant's connections.
    """
    by_role: dict[str, dict[str, bool]] = {}
    by_connection: dict[str, dict[str, bool]] = {}
    no_connection: dict[str, bool] = {}
    by_environment: dict[str, dict[str, bool]] = {}
    by_cost_class: dict[str, dict[str, bool]] = {}
    for name, tool in sorted(catalogue.tools.items()):
        for role in tool.roles:
            if role in catalogue.roles:
                _add(by_role, role, name)
        if tool.connection_alias is None:
            no_connection[name] = True
        else:
            _add(by_connection, tool.connection_alias, name)
        for environment in tool.environments:
            _add(by_environment, environment, name)
        _add(by_cost_class, tool.cost_class.value, name)
    by_task_type = {
        task: {name: True for name in sorted(spec.tools) if name in catalogue.tools}
        for task, spec in sorted(catalogue.task_types.items())
    }
    return {
        "by_role": by_role,
        "by_task_type": by_task_type,
        "by_connection": by_connection,
        "no_connection": no_connection,
        "by_environment": by_environment,
        "by_cost_class": by_cost_class,
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
            name: _compile_task_type(spec) for name, spec in sorted(catalogue.task_types.items())
        },
        "budget_classes": {
            name: {"admits": {cost.value: True for cost in spec.admitted}}
            for name, spec in sorted(catalogue.budget_classes.items())
        },
        "roles": {name: _compile_role(spec) for name, spec in sorted(catalogue.roles.items())},
        "index": compile_index(catalogue),
    }
    if catalogue.retained:
        # Only when some version is kept: a catalogue that keeps none compiles (and
        # digests) as before. Keys are strings, as JSON's are: the policy looks a
        # call's version up with format_int.
        document["retained"] = {
            name: {str(version): _compile_tool(kept) for version, kept in sorted(versions.items())}
            for name, versions in sorted(catalogue.retained.items())
        }
    if catalogue.currencies is not None:
        # The policies never read the rates (they read the converted values), but a
        # decision depends on them: in the document, a change of rate is a change of
        # digest, and every decision names the table it was converted by.
        document["currencies"] = catalogue.currencies.model_dump(mode="json")
    document["meta"] = {
        "digest": catalogue_digest(document),
        "tool_count": len(catalogue.tools),
    }
    return document


def _compile_role(spec: RoleSpec) -> dict[str, Any]:
    """A role as the review and link policies read it. ``links`` only when the role
    links something: a catalogue that links nothing compiles (and digests) as it did
    before roles could link."""
    compiled: dict[str, Any] = {"approves": {kind.value: True for kind in spec.approves}}
    if spec.links:
        compiled["links"] = dict.fromkeys(spec.links, True)
    return compiled


def _compile_task_type(spec: TaskTypeSpec) -> dict[str, Any]:
    """A task type's tools; and where its links come from when that is the store, so
    a switch to recorded links changes the digest (the request's, the default,
    leaves documents compiled before it unchanged)."""
    compiled: dict[str, Any] = {"tools": dict.fromkeys(spec.tools, True)}
    if spec.links is not TaskLinks.REQUEST:
        compiled["links"] = spec.links.value
    return compiled
