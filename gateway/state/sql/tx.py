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

from capgate.gateway.errors import (
    DuplicateOperation,
    DuplicateRecord,
    InvalidInput,
    PinStale,
    StoreError,
    UnknownPin,
    UnknownProposal,
    UnknownReview,
    quote,
)
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
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
    VerifyReport,
    definition_digest,
)
from capgate.gateway.state.sql.connections import ConnectionsTx
from capgate.gateway.state.sql.core import (
    _LEDGER_COLUMNS,
    _PIN_COLUMNS,
    _PROPOSAL_COLUMNS,
    _REVIEW_COLUMNS,
    MAX_DEFINITION_BYTES,
    VERIFY_PAGE,
    _dump,
    _identifier,
    _pin,
    _pin_status,
    _proposal,
    _proposal_params,
    _review,
    _reviewer,
    _validated,
)
from capgate.gateway.state.sql.evidence import EvidenceTx
from capgate.gateway.state.sql.operations import OperationsTx
from capgate.gateway.state.sql.tenants import TenantsTx
from capgate.gateway.state.times import from_text, to_text

__all__ = ["SqlTx"]


class SqlTx(TenantsTx, ConnectionsTx, EvidenceTx, OperationsTx):
    """One open transaction on one session (see :class:`~capgate.gateway.state.store.Tx`).

    Belongs to the thread that began it and ends with its ``with`` block; using it
    from another thread or afterwards is a StoreError, never a silent write outside
    the transaction.
    """

    # -- proposals and reviews --------------------------------------------------------

    def insert_proposal(self, proposal: ProposalRecord) -> ProposalRecord:
        """``DuplicateOperation`` if the tenant already has a proposal for that id,
        ``DuplicateRecord`` if a proposal has that id."""
        record = _validated(ProposalRecord, proposal.model_dump(), "proposal")
        self._tenant_row(record.tenant)
        inserted = self._run(
            f"INSERT INTO proposals ({_PROPOSAL_COLUMNS}) VALUES (:id, :tenant, :task_id, "
            ":proposer, :environment, :task, :tool, :contract_version, :execution_action, "
            ":params, :params_digest, :operation_id, :decision_id, :status, :reason_codes, "
            ":created_at, :updated_at, :unsettled_twins) ON CONFLICT DO NOTHING",
            _proposal_params(record),
        )
        if inserted == 1:
            return record
        if self._row("SELECT id FROM proposals WHERE id = :id", {"id": record.id}) is not None:
            raise DuplicateRecord("proposal", record.id)
        raise DuplicateOperation(record.tenant, record.operation_id)

    def get_proposal(self, proposal_id: str, *, for_update: bool = False) -> ProposalRecord | None:
        row = self._row(
            f"SELECT {_PROPOSAL_COLUMNS} FROM proposals WHERE id = :id{self._locked(for_update)}",
            {"id": proposal_id},
        )
        return None if row is None else _proposal(row)

    def proposal_for_operation(self, tenant: str, operation_id: str) -> ProposalRecord | None:
        row = self._row(
            f"SELECT {_PROPOSAL_COLUMNS} FROM proposals "
            "WHERE tenant = :tenant AND operation_id = :operation_id",
            {"tenant": tenant, "operation_id": operation_id},
        )
        return None if row is None else _proposal(row)

    def update_proposal(
        self, proposal_id: str, *, status: ProposalStatus, reason_codes: list[str]
    ) -> ProposalRecord:
        """Set status and reason codes (``updated_at`` becomes ``now``);
        ``UnknownProposal`` if there is none."""
        current = self.get_proposal(proposal_id, for_update=True)
        if current is None:
            raise UnknownProposal(proposal_id)
        record = _validated(
            ProposalRecord,
            {
                **current.model_dump(),
                "status": status,
                "reason_codes": reason_codes,
                "updated_at": self.now,
            },
            "proposal",
        )
        self._run(
            "UPDATE proposals SET status = :status, reason_codes = :reason_codes, "
            "updated_at = :now WHERE id = :id",
            {
                "id": proposal_id,
                "status": record.status.value,
                "reason_codes": _dump(record.reason_codes),
                "now": self._at,
            },
        )
        return record

    def list_proposals(
        self, *, tenant: str | None = None, status: ProposalStatus | None = None
    ) -> list[ProposalRecord]:
        """Proposals in the order they were inserted, filtered by tenant and status."""
        where: list[str] = []
        params: dict[str, Any] = {}
        if tenant is not None:
            where.append("tenant = :tenant")
            params["tenant"] = tenant
        if status is not None:
            where.append("status = :status")
            params["status"] = ProposalStatus(status).value
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._rows(f"SELECT {_PROPOSAL_COLUMNS} FROM proposals{clause} ORDER BY n", params)
        return [_proposal(row) for row in rows]

    def insert_review(self, review: ReviewRecord) -> ReviewRecord:
        """``UnknownProposal`` if the proposal does not exist, ``DuplicateRecord`` if a
        review has that id."""
        record = _validated(ReviewRecord, review.model_dump(), "review")
        if self._row("SELECT id FROM proposals WHERE id = :id", {"id": record.proposal_id}) is None:
            raise UnknownProposal(record.proposal_id)
        inserted = self._run(
            f"INSERT INTO reviews ({_REVIEW_COLUMNS}) VALUES (:id, :proposal_id, :reviewer, "
            ":verdict, :kind, :tenant, :tool, :operation_id, :digest, :expires_at, "
            ":consumed_at, :decision_id, :created_at) ON CONFLICT DO NOTHING",
            {
                "id": record.id,
                "proposal_id": record.proposal_id,
                "reviewer": _dump(record.reviewer.model_dump(mode="json")),
                "verdict": record.verdict.value,
                "kind": record.kind,
                "tenant": record.tenant,
                "tool": record.tool,
                "operation_id": record.operation_id,
                "digest": record.digest,
                "expires_at": to_text(record.expires_at),
                "consumed_at": None if record.consumed_at is None else to_text(record.consumed_at),
                "decision_id": record.decision_id,
                "created_at": to_text(record.created_at),
            },
        )
        if inserted != 1:
            raise DuplicateRecord("review", record.id)
        return record

    def reviews(self, proposal_id: str) -> list[ReviewRecord]:
        """Every review of the proposal, oldest (first inserted) first."""
        rows = self._rows(
            f"SELECT {_REVIEW_COLUMNS} FROM reviews WHERE proposal_id = :id ORDER BY n",
            {"id": proposal_id},
        )
        return [_review(row) for row in rows]

    def consume_review(self, review_id: str) -> bool:
        """Mark an approval used at ``now``; False if it was used already (or is a
        rejection, which grants nothing); ``UnknownReview`` if there is none.

        Expiry is not checked here: OPA's clock decides whether an approval is
        still valid, at the decision this consumption belongs to.
        """
        changed = self._run(
            "UPDATE reviews SET consumed_at = :now WHERE id = :id AND consumed_at IS NULL "
            "AND verdict = :approved",
            {"id": review_id, "now": self._at, "approved": ReviewVerdict.APPROVED.value},
        )
        if changed == 1:
            return True
        if self._row("SELECT id FROM reviews WHERE id = :id", {"id": review_id}) is None:
            raise UnknownReview(review_id)
        return False

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
