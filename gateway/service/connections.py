"""Connections changed by operators: a revocation reaches queued work at once.

A connection revoked after an agent saw its tools must be unusable for new
dispatches, and a queued proposal can outlive the permission that allowed it: so the
change blocks every pending or approved proposal that acts through the connection in
the same transaction, and every later decision reads the new status anyway.
"""

from __future__ import annotations

import logging

from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus
from capgate.gateway.state.records import ConnectionRecord, LedgerEntry, ProposalStatus
from capgate.gateway.state.store import Store

__all__ = ["set_connection"]

log = logging.getLogger("capgate.service")


def set_connection(
    store: Store,
    catalogue: Catalogue,
    tenant: str,
    alias: str,
    status: ConnectionStatus,
    *,
    by: str,
) -> ConnectionRecord:
    """Set a connection's status; a revoked or disabled one blocks, in the same
    transaction, every queued proposal (pending or approved) that acts through it,
    each with a ledger row under the proposal saying why."""
    with store.transaction() as tx:
        record = tx.set_connection_status(tenant, alias, status)
        blocked: list[str] = []
        if status is not ConnectionStatus.ACTIVE:
            for queued in [
                *tx.list_proposals(tenant=tenant, status=ProposalStatus.PENDING),
                *tx.list_proposals(tenant=tenant, status=ProposalStatus.APPROVED),
            ]:
                contract = catalogue.contract_at(queued.tool, queued.contract_version)
                if contract is not None and contract.connection_alias == alias:
                    code = (
                        "connection_revoked"
                        if status is ConnectionStatus.REVOKED
                        else "tool_not_enabled_for_tenant"
                    )
                    tx.update_proposal(
                        queued.id, status=ProposalStatus.BLOCKED, reason_codes=[code]
                    )
                    blocked.append(queued.id)
                    # Under the proposal too, so its own ledger says why it stopped.
                    tx.append(
                        LedgerEntry(
                            kind="dispatch",
                            tenant=tenant,
                            principal=by,
                            tool=queued.tool,
                            contract_version=queued.contract_version,
                            operation_id=queued.operation_id,
                            proposal_id=queued.id,
                            outcome=ProposalStatus.BLOCKED.value,
                            reason_codes=[code],
                            detail={"alias": alias},
                        )
                    )
        tx.append(
            LedgerEntry(
                kind="connection",
                tenant=tenant,
                principal=by,
                outcome=status.value,
                detail={"alias": alias, "account": record.account, "blocked": blocked},
            )
        )
    log.info("connection tenant=%s alias=%s status=%s by=%s", tenant, alias, status.value, by)
    return record
