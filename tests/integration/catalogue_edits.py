"""Catalogue folders changed the way a test needs: one tool's fields at a time.

The tests of contract versions, kept versions, fixtures, the docs and ``capgate
diff`` each start from a copy of the demo's sales catalogue and change a tool in
it; the change is written here once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["edit_tool", "payment_limit"]


def edit_tool(folder: Path, tool: str, **changes: Any) -> None:
    """Set ``changes`` on tool ``tool`` of ``folder``'s tools.yaml (one tool of that
    name must be there), the file written back in its order."""
    path = folder / "tools.yaml"
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    (entry,) = [t for t in document["tools"] if t["name"] == tool]
    entry.update(changes)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")


def payment_limit(max_cents: int) -> list[dict[str, Any]]:
    """``payment.execute``'s limits with the finance role's at ``max_cents`` euro cents
    (the demo's is 500,000; its fixtures pay 1,200.00 and 3,000.00 EUR)."""
    return [{"value": "amount_eur_cents", "max": max_cents, "roles": ["finance"]}]
