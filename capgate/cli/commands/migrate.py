"""``capgate proposals migrate``: move proposals to their tool's version of today.

    capgate proposals migrate PROPOSAL... --catalogue DIR [--config FILE] [--opa URL]
    capgate proposals migrate --tool TOOL [--tenant TENANT] --catalogue DIR ...

A proposal waits, pending or approved, under the contract version it was proposed
under, and is dispatched under it while the catalogue keeps that version
(``retained.yaml``, docs/catalogue.md). Migrating is the explicit way on: each
proposal's parameters are checked against today's contract, its call is proposed
again as its proposer with the facts of now and asked of OPA, and on an allow the
old proposal is blocked (``proposal_migrated``, its approvals void with it) and the
new one waits for a review of its own (:meth:`gateway.Gateway.migrate`). A refusal
changes nothing but its ledger row, and is printed with its reasons.

Who migrates is never an argument: the operator the service's configuration binds
to the OS user running the command (as for ``approve``), recorded in the
``migration`` ledger row. An operator migrates their own tenant's proposals only
(another tenant's reads as unknown). ``--tool`` takes every pending or approved
proposal of that tool in that tenant made under another version than today's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from capgate.cli.commands.common import (
    EXIT_DENIED,
    EXIT_ERROR,
    EXIT_OK,
    Actions,
    add_action,
    add_json,
    identifier,
    opa_option,
    opened_store,
    print_json,
    safe,
)
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import (
    CapabilityViolation,
    InvalidInput,
    ProposalStale,
    UnknownProposal,
)
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import Reviewer
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state.records import ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["add_migrate"]

_EXITS: Final = (
    (EXIT_OK, "every proposal named was migrated (or, with --tool, none was left to)"),
    (EXIT_DENIED, "some were not: refused by today's policy or contract (reasons printed)"),
    (EXIT_ERROR, "error: bad input, no operator for your OS user, catalogue, store or OPA"),
)


def add_migrate(proposals: Actions, operator: Callable[[argparse.Namespace], Reviewer]) -> None:
    """Add ``migrate`` to the ``proposals`` group; ``operator(args)`` is the
    :class:`Reviewer` the command acts as (the configuration's, for the OS user)."""
    parser = add_action(
        proposals,
        "migrate",
        "move pending or approved proposals to their tool's version of today, proposing "
        "each again for a new review",
        lambda args: _migrate(args, operator(args)),
        exits=_EXITS,
        description="Each proposal's parameters are checked against today's contract, its "
        "call is proposed again as its proposer with the facts of now and asked of OPA; on an "
        "allow the old proposal is blocked (proposal_migrated: its approvals go with it) and "
        "the new one waits for a review of its own. A refusal changes nothing but its ledger "
        "row.\n\nYou migrate as the operator the configuration binds to your OS user (its "
        "`operators:`), never as a name you give, and your own tenant's proposals only. "
        "--tool takes every pending or approved proposal of that tool made under another "
        "version than the catalogue's.",
    )
    parser.add_argument("proposal", nargs="*", metavar="PROPOSAL", help="the proposal ids")
    parser.add_argument(
        "--tool", metavar="TOOL", help="every proposal of this tool under an earlier version"
    )
    parser.add_argument(
        "--tenant", metavar="TENANT", help="with --tool: your tenant, said explicitly"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the service's configuration, whose `operators:` say who you migrate as "
        "(default: $CAPGATE_CONFIG)",
    )
    parser.add_argument(
        "--catalogue", type=Path, required=True, metavar="DIR", help="the service's catalogue"
    )
    parser.add_argument(
        "--opa", help="external OPA address (default: $CAPGATE_OPA_URL or embedded)"
    )
    add_json(parser, "one result per proposal")


def _targets(
    args: argparse.Namespace, catalogue: Catalogue, store: Store, operator: Reviewer
) -> list[str]:
    """The proposal ids to migrate, checked before OPA is started: with ``--tool``,
    the operator's tenant's (another tenant's proposals are not theirs to move)."""
    if bool(args.proposal) == bool(args.tool):
        raise InvalidInput("name the proposals to migrate, or --tool TOOL (one of the two)")
    if args.tenant is not None and not args.tool:
        raise InvalidInput("--tenant: only with --tool")
    if args.proposal:
        return [identifier(p, "PROPOSAL") for p in args.proposal]
    tool = identifier(args.tool, "--tool")
    contract = catalogue.tools.get(tool)
    if contract is None:
        raise InvalidInput(f"--tool: the catalogue has no tool {safe(tool)}")
    tenant = operator.tenant if args.tenant is None else identifier(args.tenant, "--tenant")
    if tenant != operator.tenant:
        raise InvalidInput(f"--tenant: you operate tenant {safe(operator.tenant)}, not this one")
    with store.transaction(read_only=True) as tx:
        waiting = [
            *tx.list_proposals(tenant=tenant, status=ProposalStatus.PENDING),
            *tx.list_proposals(tenant=tenant, status=ProposalStatus.APPROVED),
        ]
    return sorted(
        p.id for p in waiting if p.tool == tool and p.contract_version != contract.version
    )


def _migrate(args: argparse.Namespace, operator: Reviewer) -> int:
    catalogue = load_catalogue(args.catalogue)
    results: list[dict[str, Any]] = []
    with opened_store(args) as store:
        targets = _targets(args, catalogue, store, operator)
        if targets:
            with PolicySidecar(catalogue, opa_url=opa_option(args)) as sidecar:
                gateway = Gateway(catalogue, sidecar.client, ToolRegistry(), store)
                results = [_one(gateway, proposal_id, operator) for proposal_id in targets]
    if args.json:
        print_json({"by": operator.id, "results": results})
    elif not results:
        print(f"nothing to migrate: no pending or approved proposal of {safe(args.tool)} is "
              "under another version than the catalogue's")  # fmt: skip
    else:
        for result in results:
            print(_line(result))
    return EXIT_OK if all(r["migrated"] for r in results) else EXIT_DENIED


def _one(gateway: Gateway, proposal_id: str, operator: Reviewer) -> dict[str, Any]:
    """Migrate one proposal; what came of it, as the JSON output says it."""
    try:
        new: ProposalRecord = gateway.migrate(proposal_id, by=operator)
    except CapabilityViolation as refusal:
        return {
            "proposal": proposal_id,
            "migrated": False,
            "decision_id": refusal.decision_id,
            "reasons": [r.model_dump(mode="json") for r in refusal.reasons],
        }
    except (InvalidInput, ProposalStale, UnknownProposal) as problem:
        return {"proposal": proposal_id, "migrated": False, "error": problem.code,
                "message": str(problem)}  # fmt: skip
    return {
        "proposal": proposal_id,
        "migrated": True,
        "to": new.id,
        "version": new.contract_version,
        "operation_id": new.operation_id,
        "decision_id": new.decision_id,
    }


def _line(result: dict[str, Any]) -> str:
    old = safe(result["proposal"])
    if result["migrated"]:
        return (
            f"migrated {old} -> {result['to']} (version {result['version']}, operation "
            f"{result['operation_id']}): pending a new review"
        )
    if "reasons" in result:
        codes = ", ".join(safe(r["code"]) for r in result["reasons"])
        return f"refused {old}: today's policy refuses the call ({codes}); nothing changed"
    return f"not migrated {old}: {safe(result['message'])} [{result['error']}]"
