"""``capgate ledger``: show the hash-chained ledger, and verify it.

``show`` prints rows in sequence order, all of them or those of one operation (the
whole chain of a call: decision, proposal, review, dispatch, intent, outcome), one
proposal or one tenant. ``verify`` recomputes the chain and exits 1 naming the
first row that does not fit (:meth:`capgate.gateway.state.Store.verify_ledger`); keep the
last hash it prints somewhere the store's writers cannot reach, since no chain can
show by itself that rows were cut off its end.
"""

from __future__ import annotations

import argparse
from typing import Final

from capgate.cli.commands.common import (
    EXIT_BROKEN,
    EXIT_ERROR,
    EXIT_OK,
    STORE_EXITS,
    Actions,
    add_action,
    add_group,
    add_json,
    amount,
    identifier,
    opened_store,
    print_json,
    require_tenant,
    safe,
    shown,
    when,
)
from capgate.gateway.errors import OperationNotInLedger, UnknownProposal, quote
from capgate.gateway.state.records import LedgerRow

__all__ = ["register"]

_VERIFY_EXITS: Final = (
    (EXIT_OK, "the hash chain is whole"),
    (EXIT_BROKEN, "the chain is broken: the first row that does not fit is named"),
    (EXIT_ERROR, "error: the store cannot be opened or read"),
)


def _line(row: LedgerRow) -> str:
    parts = [
        f"#{row.seq}",
        when(row.at),
        safe(row.kind),
        safe(row.outcome or "-"),
        f"tenant={safe(row.tenant or '-')}",
        f"by={safe(row.principal or '-')}",
    ]
    if row.tool is not None:
        version = f" v{row.contract_version}" if row.contract_version is not None else ""
        parts.append(f"tool={safe(row.tool)}{version}")
    for name, value in (
        ("op", row.operation_id),
        ("proposal", row.proposal_id),
        ("decision", row.decision_id),
    ):
        if value is not None:
            parts.append(f"{name}={safe(value)}")
    if row.reason_codes:
        parts.append("reasons=" + safe(",".join(row.reason_codes)))
    if row.detail:
        parts.append(shown(row.detail))
    return "  ".join(parts)


def _show(args: argparse.Namespace) -> int:
    operation = None if args.operation is None else identifier(args.operation, "--operation")
    proposal = None if args.proposal is None else identifier(args.proposal, "--proposal")
    tenant = None if args.tenant is None else identifier(args.tenant, "--tenant")
    after = 0 if args.after is None else amount(args.after, "--after")
    limit = None if args.limit is None else amount(args.limit, "--limit")
    with opened_store(args) as store:
        if proposal is not None or tenant is not None:
            with store.transaction(read_only=True) as tx:
                if proposal is not None and tx.get_proposal(proposal) is None:
                    raise UnknownProposal(proposal)
                if tenant is not None:
                    require_tenant(tx, tenant)
        rows = store.ledger(
            tenant=tenant,
            operation_id=operation,
            proposal_id=proposal,
            after_seq=after,
            limit=limit,
        )
        if operation is not None and not rows and after == 0:
            raise OperationNotInLedger(f"the ledger has no row for operation {quote(operation)}")
    if args.json:
        print_json([row.model_dump(mode="json") for row in rows])
        return EXIT_OK
    if not rows:
        print("(no ledger rows)")
    for row in rows:
        print(_line(row))
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    with opened_store(args) as store:
        report = store.verify_ledger()
        location = store.location
    if args.json:
        print_json({"store": location, **report.model_dump(mode="json")})
    elif report.ok:
        print(f"ledger of {location}: ok, {report.rows} row(s), the hash chain is whole")
        if report.last_hash is not None:
            print(f"  last hash: {report.last_hash}")
            print("  keep it where the store's writers cannot reach it: a chain cannot show")
            print("  by itself that rows were cut off its end or all rewritten from some row on")
    else:
        print(f"ledger of {location}: BROKEN at row {report.first_bad_seq}")
        print(f"  {safe(report.problem or 'the row does not fit the chain')}")
        if report.first_bad_seq is not None and report.first_bad_seq > 1:
            print(f"  rows before {report.first_bad_seq} fit the chain")
    return EXIT_OK if report.ok else EXIT_BROKEN


def register(sub: Actions) -> None:
    """Add ``ledger`` to the ``capgate`` parser."""
    ledger = add_group(
        sub,
        "ledger",
        "show and verify the hash-chained ledger",
        "One append-only row per compose, decision, proposal, review, dispatch, intent and "
        "outcome (and per change made here), each holding the hash of the one before.",
        [*STORE_EXITS, (EXIT_BROKEN, "verify: the hash chain is broken")],
    )
    show = add_action(ledger, "show", "show ledger rows in order, all or filtered", _show)
    which = show.add_mutually_exclusive_group()
    which.add_argument(
        "--operation", metavar="OP", help="the rows of one operation: the whole chain of a call"
    )
    which.add_argument("--proposal", metavar="ID", help="the rows naming one proposal")
    which.add_argument("--tenant", metavar="TENANT", help="one tenant's rows")
    show.add_argument("--after", metavar="SEQ", help="only rows after this sequence number")
    show.add_argument("--limit", metavar="N", help="at most N rows")
    add_json(show, "the rows")

    verify = add_action(
        ledger,
        "verify",
        "recompute the hash chain; exit 1 naming the first row that does not fit",
        _verify,
        exits=_VERIFY_EXITS,
    )
    add_json(verify, "the report")
