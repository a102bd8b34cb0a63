"""The ledger's hash chain: how a row's hash is made, and how a chain is checked.

Each row's ``hash`` is ``"sha256:"`` + the SHA-256 of the canonical JSON
(:func:`capgate.gateway.digest.canonical_json`) of every other field of the row: ``seq``,
``at`` (in the store's text form, exactly as stored), ``prev_hash`` and every
:class:`~capgate.gateway.state.records.LedgerEntry` field. The first row's ``prev_hash`` is
:data:`GENESIS_HASH`; every later row's is the previous row's ``hash``.

So changing any field of a row, or its hash, breaks that row; deleting, inserting
or reordering rows breaks the first row after the change (its ``seq`` or its
``prev_hash`` no longer fits). What a chain cannot show by itself is a consistent
rewrite of every row from some point on, or rows cut off the end: for that, keep
:attr:`VerifyReport.last_hash` somewhere the store's writers cannot reach.

These functions are pure: the stores call them, and anyone holding the rows (an
export, a backup) can check a chain with them without a database.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pydantic import ValidationError

from capgate.gateway.digest import canonical_json, digest_of
from capgate.gateway.errors import InvalidInput, StoreError
from capgate.gateway.state.records import LedgerEntry, LedgerRow, VerifyReport
from capgate.gateway.state.times import from_text, to_text

__all__ = [
    "ENTRY_FIELDS",
    "GENESIS_HASH",
    "HASHED_FIELDS",
    "MAX_DETAIL_BYTES",
    "ChainChecker",
    "hash_of",
    "row_from_stored",
    "row_hash",
    "verify_rows",
]

#: ``prev_hash`` of the first row.
GENESIS_HASH: Final = "sha256:" + "0" * 64
#: The fields a caller supplies, in the model's order.
ENTRY_FIELDS: Final = tuple(LedgerEntry.model_fields)
#: Every field the hash covers: all of a row but ``hash`` itself.
HASHED_FIELDS: Final = ("seq", "at", "prev_hash", *ENTRY_FIELDS)
#: Largest canonical JSON of one entry's ``detail``: the ledger holds small facts
#: (ids, codes, counts), never documents or tool output.
MAX_DETAIL_BYTES: Final = 64 * 1024
#: Columns holding JSON text in a stored row.
_JSON_COLUMNS: Final = ("reason_codes", "detail")


def row_hash(fields: Mapping[str, Any]) -> str:
    """The hash of a row given as plain values, ``at`` in the store's text form.

    ``fields`` must hold every name of :data:`HASHED_FIELDS` (others are ignored).
    """
    missing = [name for name in HASHED_FIELDS if name not in fields]
    if missing:
        raise InvalidInput(f"ledger row: missing field(s) {', '.join(missing)}")
    return digest_of(canonical_json({name: fields[name] for name in HASHED_FIELDS}))


def hash_of(row: LedgerRow) -> str:
    """The hash ``row`` should carry, recomputed from its other fields."""
    fields = row.model_dump(mode="json", exclude={"hash"})
    fields["at"] = to_text(row.at)
    return row_hash(fields)


def row_from_stored(stored: Mapping[str, Any]) -> tuple[dict[str, Any], LedgerRow]:
    """A stored row (columns as the database returns them) as plain hashed values and
    as a validated :class:`LedgerRow`; a row that cannot be read is a StoreError."""
    plain = dict(stored)
    seq = plain.get("seq")
    for column in _JSON_COLUMNS:
        try:
            plain[column] = json.loads(plain[column])
        except (TypeError, ValueError):
            raise StoreError(f"ledger row {seq}: {column} is not JSON") from None
    try:
        row = LedgerRow.model_validate({**plain, "at": from_text(plain["at"])})
    except ValidationError as exc:
        fields = ", ".join(str(e["loc"][0]) for e in exc.errors() if e["loc"])
        raise StoreError(f"ledger row {seq}: field(s) {fields or '?'} do not validate") from None
    return plain, row


class ChainChecker:
    """Checks stored rows one at a time, in ``seq`` order, against the chain.

    Fed in pages by the stores (a ledger may not fit in memory); :meth:`check`
    returns the problem of the first bad row, and the caller stops there.
    """

    def __init__(self) -> None:
        self.rows = 0
        self.expected_seq = 1
        self.last_hash: str | None = None

    def check(self, stored: Mapping[str, Any]) -> tuple[int, str] | None:
        """``(seq, problem)`` when this row breaks the chain, else None."""
        self.rows += 1
        seq = stored.get("seq")
        try:
            plain, row = row_from_stored(stored)
        except StoreError as exc:
            return (seq if isinstance(seq, int) else self.expected_seq), str(exc)
        if row.seq != self.expected_seq:
            if row.seq < self.expected_seq:  # only a seq below 1 can come first
                missing = "sequence numbers start at 1"
            elif row.seq == self.expected_seq + 1:
                missing = f"row {self.expected_seq} is missing"
            else:
                missing = f"rows {self.expected_seq} to {row.seq - 1} are missing"
            return row.seq, f"row {row.seq} found where row {self.expected_seq} belongs: {missing}"
        previous = self.last_hash or GENESIS_HASH
        if row.prev_hash != previous:
            what = "the genesis hash" if self.last_hash is None else f"row {row.seq - 1}'s hash"
            return row.seq, (
                f"row {row.seq}: prev_hash is not {what} "
                "(a row before it was changed, removed, added or moved)"
            )
        if row_hash(plain) != row.hash:
            return row.seq, f"row {row.seq}: hash does not match the row's fields (row changed)"
        self.expected_seq += 1
        self.last_hash = row.hash
        return None

    def report(self, bad: tuple[int, str] | None = None) -> VerifyReport:
        if bad is not None:
            return VerifyReport(ok=False, rows=self.rows, first_bad_seq=bad[0], problem=bad[1])
        return VerifyReport(ok=True, rows=self.rows, last_hash=self.last_hash)


def verify_rows(stored_rows: Iterable[Mapping[str, Any]]) -> VerifyReport:
    """Check a whole chain of stored rows, given in ``seq`` order."""
    checker = ChainChecker()
    for stored in stored_rows:
        bad = checker.check(stored)
        if bad is not None:
            return checker.report(bad)
    return checker.report()
