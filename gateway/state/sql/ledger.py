"""The ledger's rows in the database: appending to the hash chain, reading it back.

What a row holds and how the chain is hashed and checked is
:mod:`capgate.gateway.state.ledger`'s; this module keeps what the database must do
for it. An append takes the transaction-scoped ledger lock before it reads the last
row, so across processes sequence numbers have no gaps and each ``prev_hash`` is the
previous ``hash``; rows also commit in ``seq`` order, so the notifier can tail the
ledger by ``seq``, and a row naming a proposal notifies ``proposal_rows`` at commit.
Verification reads the chain a page at a time, in one snapshot, so a long ledger is
checked whole without being held in memory.
"""

# S608: every SQL text here is put together from this package's constants (column
# lists, the dialect's lock suffix, fixed filter clauses); values always travel as
# bound parameters, never in the text.
# ruff: noqa: S608

from __future__ import annotations

from typing import Any, Final

from capgate.gateway.errors import InvalidInput
from capgate.gateway.state.ledger import (
    ENTRY_FIELDS,
    GENESIS_HASH,
    MAX_DETAIL_BYTES,
    ChainChecker,
    row_from_stored,
    row_hash,
)
from capgate.gateway.state.records import LedgerEntry, LedgerRow, VerifyReport
from capgate.gateway.state.sql.core import TxCore, _dump, _validated
from capgate.gateway.state.times import from_text

__all__ = ["LedgerTx"]

#: Ledger rows read per query while verifying: the chain is checked a page at a time.
VERIFY_PAGE: Final = 1000

_LEDGER_COLUMNS: Final = ", ".join(("seq", "at", "prev_hash", "hash", *ENTRY_FIELDS))


class LedgerTx(TxCore):
    """Ledger: the append-only, hash-chained record of every step."""

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
        if record.proposal_id is not None:
            # A step of a proposal's life: the notifier turns such rows into webhook
            # notices once they commit (capgate.gateway.service.notices).
            self.notify("proposal_rows")
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
