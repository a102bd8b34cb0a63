"""Contract pins: the content each tool's contract version was first served with.

A pin is written once per tool and version and never changed: pinning again keeps
the first, and the service compares digests (a changed contract under an old
version number is the catalogue's error, never the store's to resolve).
"""

# S608: every SQL text here is put together from this package's constants (column
# lists); values always travel as bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import StoreError
from capgate.gateway.state.records import ContractPin
from capgate.gateway.state.sql.core import TxCore, _stored, _time, _validated

__all__ = ["VersionsTx"]

_PIN_COLUMNS: Final = "tool, version, digest, pinned_at"


def _pin(row: Mapping[str, Any]) -> ContractPin:
    return _stored(
        ContractPin,
        {
            "tool": row["tool"],
            "version": row["version"],
            "digest": row["digest"],
            "pinned_at": _time(row["pinned_at"]),
        },
        "contract pin",
    )


class VersionsTx(TxCore):
    """Contract pins: which content each tool's version number stands for."""

    def pin_contract(self, tool: str, version: int, digest: str) -> tuple[ContractPin, bool]:
        record = _validated(
            ContractPin,
            {"tool": tool, "version": version, "digest": digest, "pinned_at": self.now},
            "contract pin",
        )
        key = {"tool": record.tool, "version": record.version}
        inserted = self._run(
            "INSERT INTO contract_pins (tool, version, digest, pinned_at) VALUES "
            "(:tool, :version, :digest, :now) ON CONFLICT (tool, version) DO NOTHING",
            {**key, "digest": record.digest, "now": self._at},
        )
        row = self._row(
            f"SELECT {_PIN_COLUMNS} FROM contract_pins WHERE tool = :tool AND version = :version",
            key,
        )
        if row is None:  # pragma: no cover - inserted or present in this transaction
            raise StoreError("a contract pin vanished while it was written")
        return _pin(row), inserted == 1

    def contract_pins(self) -> list[ContractPin]:
        rows = self._rows(f"SELECT {_PIN_COLUMNS} FROM contract_pins")
        # Ordered here, not by the backends' collations: the same answer on both.
        return [_pin(row) for row in sorted(rows, key=lambda r: (r["tool"], r["version"]))]
