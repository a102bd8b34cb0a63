"""SqlTx: the store's transaction, put together from one base class per aggregate.

Each aggregate's statements live in their own module over
:class:`~capgate.gateway.state.sql.core.TxCore`; this class only composes them, so it
offers exactly the :class:`~capgate.gateway.state.store.Tx` protocol (mypy holds it
to the protocol wherever a SqlStore is used as a Store). Each base knows only the
core, never another aggregate (mypy would refuse the call), so their order here
changes nothing.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from typing import Any

from capgate.gateway.errors import InvalidInput, PinStale, StoreError, UnknownPin, quote
from capgate.gateway.state.ledger import (
    ENTRY_FIELDS,
    GENESIS_HASH,
    MAX_DETAIL_BYTES,
    ChainChecker,
    row_from_stored,
    row_hash,
)
from capgate.gateway.state.records import (
    LedgerEntry,
    LedgerRow,
    PinRecord,
    PinStatus,
    VerifyReport,
    definition_digest,
)
from capgate.gateway.state.sql.connections import ConnectionsTx
from capgate.gateway.state.sql.core import (
    _LEDGER_COLUMNS,
    _PIN_COLUMNS,
    MAX_DEFINITION_BYTES,
    VERIFY_PAGE,
    _dump,
    _identifier,
    _pin,
    _pin_status,
    _reviewer,
    _validated,
)
from capgate.gateway.state.sql.evidence import EvidenceTx
from capgate.gateway.state.sql.operations import OperationsTx
from capgate.gateway.state.sql.proposals import ProposalsTx
from capgate.gateway.state.sql.tenants import TenantsTx
from capgate.gateway.state.times import from_text

__all__ = ["SqlTx"]


class SqlTx(TenantsTx, ConnectionsTx, EvidenceTx, OperationsTx, ProposalsTx):
    """One open transaction on one session (see :class:`~capgate.gateway.state.store.Tx`).

    Belongs to the thread that began it and ends with its ``with`` block; using it
    from another thread or afterwards is a StoreError, never a silent write outside
    the transaction.
    """

    # -- pins of upstream MCP tool definitions ------------------------------------------

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

    # -- ledger -----------------------------------------------------------------------

    def append(self, entry: LedgerEntry) -> LedgerRow:
        """Append one row to the hash chain (serialised across processes).

        The ledger lock is held until the transaction ends, so append last in a
        step: every other appender waits for this transaction.
        """
        record = _validated(
            LedgerEntry, entry.model_dump(include=set(ENTRY_FIELDS)), "ledger entry"
        )
        # Python values, not mode="json": that would turn NaN into null silently;
        # canonical JSON refuses whatever is not plain JSON instead.
        fields = record.model_dump()
        detail = _dump(fields["detail"])
        if len(detail.encode("utf-8")) > MAX_DETAIL_BYTES:
            raise InvalidInput(
                f"ledger entry: detail is larger than {MAX_DETAIL_BYTES} bytes of JSON; "
                "the ledger keeps small facts (ids, codes, counts), not documents"
            )
        self._lock("ledger")
        last = self._row("SELECT seq, hash FROM ledger ORDER BY seq DESC LIMIT 1")
        seq = 1 if last is None else int(last["seq"]) + 1
        prev_hash = GENESIS_HASH if last is None else str(last["hash"])
        hashed = {**fields, "seq": seq, "at": self._at, "prev_hash": prev_hash}
        digest = row_hash(hashed)
        self._run(
            f"INSERT INTO ledger ({_LEDGER_COLUMNS}) VALUES (:seq, :at, :prev_hash, :hash, "
            + ", ".join(f":{name}" for name in ENTRY_FIELDS)
            + ")",
            {
                **hashed,
                "hash": digest,
                "reason_codes": _dump(fields["reason_codes"]),
                "detail": detail,
            },
        )
        return LedgerRow.model_validate(
            {
                **fields,
                "seq": seq,
                "at": from_text(self._at),
                "prev_hash": prev_hash,
                "hash": digest,
            }
        )

    # -- reads for the store (not part of the Tx protocol) ------------------------------

    def _ledger(
        self,
        *,
        tenant: str | None,
        operation_id: str | None,
        proposal_id: str | None,
        after_seq: int,
        limit: int | None,
    ) -> list[LedgerRow]:
        where = ["seq > :after"]
        params: dict[str, Any] = {"after": after_seq}
        for column, value in (
            ("tenant", tenant),
            ("operation_id", operation_id),
            ("proposal_id", proposal_id),
        ):
            if value is not None:
                where.append(f"{column} = :{column}")
                params[column] = value
        sql = f"SELECT {_LEDGER_COLUMNS} FROM ledger WHERE {' AND '.join(where)} ORDER BY seq"
        if limit is not None:
            sql += " LIMIT :limit"
            params["limit"] = limit
        return [row_from_stored(row)[1] for row in self._rows(sql, params)]

    def _verify(self) -> VerifyReport:
        checker = ChainChecker()
        after: int | None = None
        while True:
            # The first page starts at the lowest seq, whatever it is, so a row with a
            # seq below 1 (inserted by hand) is read and reported, not skipped.
            condition = "" if after is None else "WHERE seq > :after "
            page = self._rows(
                f"SELECT {_LEDGER_COLUMNS} FROM ledger {condition}ORDER BY seq LIMIT :n",
                {"after": after, "n": VERIFY_PAGE} if after is not None else {"n": VERIFY_PAGE},
            )
            for stored in page:
                bad = checker.check(stored)
                if bad is not None:
                    return checker.report(bad)
            if len(page) < VERIFY_PAGE:
                return checker.report()
            after = int(page[-1]["seq"])
