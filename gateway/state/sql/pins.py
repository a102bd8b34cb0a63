"""Pins: the upstream MCP tool definitions people accepted, and what servers show now.

A pin decides whether an upstream tool may run under the definition it shows, so
the store computes each digest itself, from the definition's canonical JSON, and a
pin's digest and definition always belong together. Accepting or rejecting names
the digest the person reviewed and fails (``PinStale``) if the server has shown
another since. A definition too large to keep is refused, never cut.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from capgate.gateway.errors import InvalidInput, PinStale, StoreError, UnknownPin, quote
from capgate.gateway.state.records import PinRecord, PinStatus, definition_digest
from capgate.gateway.state.sql.core import (
    TxCore,
    _dump,
    _identifier,
    _load,
    _stored,
    _time,
    _validated,
)

__all__ = ["MAX_DEFINITION_BYTES", "PinsTx"]

_PIN_COLUMNS: Final = (
    "server, tool, status, observed_digest, observed_definition, observed_at, catalogue_tool, "
    "accepted_digest, accepted_definition, accepted_by, accepted_at, rejected_digest, "
    "rejected_by, rejected_at, updated_at"
)
#: The largest upstream tool definition a pin keeps, as canonical JSON (256 KiB):
#: a description and two schemas; anything larger is refused, not truncated.
MAX_DEFINITION_BYTES: Final = 256 * 1024


def _reviewer(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 128:
        raise InvalidInput(f"reviewer: {quote(value)} is not a name of 1 to 128 characters")
    return value


def _pin(row: Mapping[str, Any]) -> PinRecord:
    def document(column: str) -> Any:
        text = row[column]
        return None if text is None else _load(text, f"pin {column}")

    return _stored(
        PinRecord,
        {
            **row,
            "observed_definition": document("observed_definition"),
            "accepted_definition": document("accepted_definition"),
            "observed_at": _time(row["observed_at"]),
            "accepted_at": _time(row["accepted_at"]),
            "rejected_at": _time(row["rejected_at"]),
            "updated_at": _time(row["updated_at"]),
        },
        "upstream pin",
    )


def _pin_status(observed: str | None, accepted: str | None, rejected: str | None) -> PinStatus:
    """The status a pin has while the server shows ``observed`` (None: nothing)."""
    if observed is not None and observed == accepted:
        return PinStatus.ACCEPTED
    if observed is not None and observed == rejected:
        return PinStatus.REJECTED
    return PinStatus.CHANGED if accepted is not None else PinStatus.PENDING


class PinsTx(TxCore):
    """Pins: reviewed upstream tool definitions and what their servers show."""

    def _pin_key(self, server: str, tool: str) -> dict[str, str]:
        record = _validated(
            PinRecord,
            {
                "server": server,
                "tool": tool,
                "status": PinStatus.PENDING,
                "observed_digest": None,
                "observed_definition": None,
                "observed_at": self.now,
                "updated_at": self.now,
            },
            "upstream pin",
        )
        return {"server": record.server, "tool": record.tool}

    def observe_pin(self, server: str, tool: str, definition: dict[str, Any] | None) -> PinRecord:
        """Record what the server shows of the tool now (None: it no longer lists it);
        the pin's status follows from it (see :class:`~capgate.gateway.state.store.Tx`).

        The digest is computed here, from the definition's canonical JSON, so a pin's
        digest and definition always belong together.
        """
        key = self._pin_key(server, tool)
        text = digest = None
        if definition is not None:
            if not isinstance(definition, dict):
                raise InvalidInput("upstream pin: a definition is a JSON object")
            text = _dump(definition)
            if len(text.encode("utf-8")) > MAX_DEFINITION_BYTES:
                raise InvalidInput(
                    f"upstream pin: the definition of tool {quote(tool)} is larger than "
                    f"{MAX_DEFINITION_BYTES} bytes of JSON"
                )
            digest = definition_digest(definition)
        current = self.get_pin(key["server"], key["tool"], for_update=True)
        if current is None:
            status = _pin_status(digest, None, None)
            self._run(
                f"INSERT INTO upstream_pins ({_PIN_COLUMNS}) VALUES (:server, :tool, :status, "
                ":digest, :definition, :now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                ":now)",
                {**key, "status": status.value, "digest": digest, "definition": text,
                 "now": self._at},
            )  # fmt: skip
        else:
            status = _pin_status(digest, current.accepted_digest, current.rejected_digest)
            self._run(
                "UPDATE upstream_pins SET status = :status, observed_digest = :digest, "
                "observed_definition = :definition, observed_at = :now, updated_at = :now "
                "WHERE server = :server AND tool = :tool",
                {**key, "status": status.value, "digest": digest, "definition": text,
                 "now": self._at},
            )  # fmt: skip
        found = self.get_pin(key["server"], key["tool"])
        if found is None:  # pragma: no cover - written in this transaction
            raise StoreError("an upstream pin vanished while it was recorded")
        return found

    def get_pin(self, server: str, tool: str, *, for_update: bool = False) -> PinRecord | None:
        row = self._row(
            f"SELECT {_PIN_COLUMNS} FROM upstream_pins WHERE server = :server AND "
            f"tool = :tool{self._locked(for_update)}",
            {"server": server, "tool": tool},
        )
        return None if row is None else _pin(row)

    def pins(self, *, server: str | None = None) -> list[PinRecord]:
        """Every pin (of one server when given), by server and tool."""
        clause = "" if server is None else " WHERE server = :server"
        rows = self._rows(
            f"SELECT {_PIN_COLUMNS} FROM upstream_pins{clause} ORDER BY server, tool",
            {} if server is None else {"server": server},
        )
        return [_pin(row) for row in rows]

    def _reviewed_pin(self, server: str, tool: str, digest: str) -> PinRecord:
        current = self.get_pin(server, tool, for_update=True)
        if current is None:
            raise UnknownPin(server, tool)
        if current.observed_digest is None or current.observed_digest != digest:
            raise PinStale(server, tool, digest, current.observed_digest)
        return current

    def accept_pin(
        self, server: str, tool: str, *, digest: str, catalogue_tool: str, by: str
    ) -> PinRecord:
        """Accept the definition the server shows, as ``catalogue_tool``, if it is the
        one reviewed (``digest``); ``UnknownPin`` or ``PinStale`` otherwise."""
        as_tool = _identifier(catalogue_tool, "catalogue tool")
        who = _reviewer(by)
        current = self._reviewed_pin(server, tool, digest)
        self._run(
            "UPDATE upstream_pins SET status = :status, catalogue_tool = :as_tool, "
            "accepted_digest = observed_digest, accepted_definition = observed_definition, "
            "accepted_by = :by, accepted_at = :now, updated_at = :now "
            "WHERE server = :server AND tool = :tool",
            {"server": current.server, "tool": current.tool, "as_tool": as_tool, "by": who,
             "status": PinStatus.ACCEPTED.value, "now": self._at},
        )  # fmt: skip
        found = self.get_pin(current.server, current.tool)
        assert found is not None
        return found

    def reject_pin(self, server: str, tool: str, *, digest: str, by: str) -> PinRecord:
        """Reject the definition the server shows, if it is the one reviewed."""
        who = _reviewer(by)
        current = self._reviewed_pin(server, tool, digest)
        status = _pin_status(current.observed_digest, current.accepted_digest, digest)
        self._run(
            "UPDATE upstream_pins SET status = :status, rejected_digest = observed_digest, "
            "rejected_by = :by, rejected_at = :now, updated_at = :now "
            "WHERE server = :server AND tool = :tool",
            {"server": current.server, "tool": current.tool, "by": who,
             "status": status.value, "now": self._at},
        )  # fmt: skip
        found = self.get_pin(current.server, current.tool)
        assert found is not None
        return found
