"""An upstream tool's definition: what a person reviews, pins and compares.

A definition is the part of an MCP ``Tool`` that can change what a model is told or
what a call means: its ``name``, ``title``, ``description``, ``inputSchema``,
``outputSchema`` and ``annotations`` (wire names; a missing one is ``null``). The
pin's digest is SHA-256 of its canonical JSON
(:func:`capgate.gateway.state.records.definition_digest`), so a change to any of them, a
word of the description or a hint, is a new definition that quarantines the tool
until a person accepts it.

The annotations (``readOnlyHint``, ``destructiveHint``...) are the server's hints,
kept and shown, never obeyed: what a tool may do is its catalogue contract's mode,
roles, connection and approval. Nothing here imports the ``mcp`` package.
"""

from __future__ import annotations

import difflib
import json
import textwrap
from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.digest import plain_json
from capgate.gateway.errors import InvalidInput, quote
from capgate.gateway.state.records import definition_digest

__all__ = [
    "DEFINITION_FIELDS",
    "annotation_hints",
    "definition_diff",
    "definition_digest",
    "render_definition",
    "tool_definition",
]

#: The fields of a tool definition that are pinned, in the order they are shown.
DEFINITION_FIELDS: Final = (
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
)
#: Largest definition read from a server, as JSON (the store keeps up to 256 KiB).
MAX_DEFINITION_BYTES: Final = 256 * 1024


def tool_definition(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The pinned fields of a tool as a server lists it (its JSON, wire names).

    Raises InvalidInput for a tool that is not plain JSON, too big or too deep, or
    whose name is not a string.
    """
    if not isinstance(tool, Mapping):
        raise InvalidInput("a tool definition is a JSON object")
    picked = {field: tool.get(field) for field in DEFINITION_FIELDS}
    if not isinstance(picked["name"], str) or not picked["name"]:
        raise InvalidInput("a tool definition has no name")
    plain: dict[str, Any] = plain_json(
        picked, what=f"tool {quote(picked['name'])}", max_bytes=MAX_DEFINITION_BYTES
    )
    return plain


def render_definition(definition: Mapping[str, Any] | None) -> list[str]:
    """A definition as lines for people: one field after another, the description
    wrapped, the schemas and annotations as indented JSON (ASCII, so escapes show)."""
    if definition is None:
        return ["(the server no longer lists this tool)"]
    lines: list[str] = []
    for field in DEFINITION_FIELDS:
        value = definition.get(field)
        if field == "description" and isinstance(value, str):
            lines.append("description:")
            for paragraph in value.splitlines() or [""]:
                wrapped = textwrap.wrap(json.dumps(paragraph, ensure_ascii=True)[1:-1], 76)
                lines.extend(f"  {line}" for line in wrapped or [""])
        elif isinstance(value, dict | list):
            lines.append(f"{field}:")
            text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True)
            lines.extend(f"  {line}" for line in text.splitlines())
        else:
            lines.append(f"{field}: {json.dumps(value, ensure_ascii=True)}")
    return lines


def definition_diff(
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    *,
    old_name: str = "accepted",
    new_name: str = "shown now",
) -> list[str]:
    """A unified diff of two definitions as :func:`render_definition` shows them;
    with no ``old`` (never accepted), the whole new definition, every line added."""
    before = render_definition(old) if old is not None else []
    return list(
        difflib.unified_diff(before, render_definition(new), old_name, new_name, lineterm="", n=2)
    )


def annotation_hints(definition: Mapping[str, Any] | None) -> str:
    """The server's annotations in one line, for a reviewer: hints, not authority."""
    annotations = (definition or {}).get("annotations")
    if not isinstance(annotations, dict) or not annotations:
        return "(none)"
    return ", ".join(
        f"{key}={json.dumps(value, ensure_ascii=True)}"
        for key, value in sorted(annotations.items())
    )
