"""Contract versions pinned to their content: a version number means one contract.

A tool's contract carries a version, and proposals, approvals and the ledger name
it. If the content behind a number could change, a proposal approved under
version 1 would be dispatched under something else that is also called version 1.
So the first time a gateway serves a contract version, its content digest
(:func:`~capgate.gateway.catalogue.compile.contract_digest`) is pinned in the
store; a later start with other content under a pinned number is refused, naming
the version to give it instead, and nothing is pinned by that start. New versions
are pinned beside the old ones, each with a ledger row. A version the catalogue
keeps for proposals in flight (``retained.yaml``) is held to its pin the same way:
the kept copy must be the contract that was served under that number.
"""

from __future__ import annotations

import logging

from capgate.gateway.catalogue.compile import contract_digest
from capgate.gateway.errors import CatalogueError
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.state.records import ContractPin, LedgerEntry
from capgate.gateway.state.store import Store
from capgate.gateway.state.times import to_text

__all__ = ["pin_contracts"]

log = logging.getLogger("capgate.service")


def pin_contracts(
    store: Store, catalogue: Catalogue, *, check_only: bool = False
) -> list[ContractPin]:
    """Pin every contract version of ``catalogue`` not pinned yet, in one transaction;
    the pins it made. CatalogueError, with one problem per tool, when a pinned
    version's content changed: then nothing is pinned. ``check_only``: the same
    check, reading only (a start checks before OPA is started, and pins once the
    catalogue's fixtures hold, so that a start that fails pins nothing)."""
    problems: list[str] = []
    made: list[ContractPin] = []
    with store.transaction(read_only=check_only) as tx:
        newest: dict[str, int] = {}
        pinned: dict[tuple[str, int], ContractPin] = {}
        for pin in tx.contract_pins():
            newest[pin.tool] = max(newest.get(pin.tool, 0), pin.version)
            pinned[(pin.tool, pin.version)] = pin
        contracts = [("tools.yaml", c) for _, c in sorted(catalogue.tools.items())]
        contracts += [
            ("retained.yaml", kept)
            for _, versions in sorted(catalogue.retained.items())
            for _, kept in sorted(versions.items())
        ]
        for file, contract in contracts:
            name, digest = contract.name, contract_digest(contract)
            found = pinned.get((name, contract.version))
            if found is None and check_only:
                continue  # to be pinned by the start that serves it
            if found is None:
                found, new = tx.pin_contract(name, contract.version, digest)
                if new:
                    made.append(found)
                    continue
            pin = found
            if pin.digest == digest:
                continue
            if file == "retained.yaml":
                problems.append(
                    f"retained.yaml: tool {name!r} version {contract.version}: this is not "
                    f"the contract first served as version {contract.version} (on "
                    f"{to_text(pin.pinned_at)}): keep that one exactly, or none"
                )
            else:
                bump = max(newest.get(name, 0), contract.version) + 1
                problems.append(
                    f"tools.yaml: tool {name!r}: field 'version': version {contract.version} "
                    f"was first served on {to_text(pin.pinned_at)} with other content; a "
                    f"changed contract needs a new version: give it version {bump} (and, "
                    f"to let proposals made under version {contract.version} dispatch under "
                    "it, keep its former definition in retained.yaml)"
                )
        if problems:
            raise CatalogueError(problems)  # the transaction is rolled back: no pin made
        for pin in made:
            tx.append(
                LedgerEntry(
                    kind="contract_pin",
                    tool=pin.tool,
                    contract_version=pin.version,
                    outcome="pinned",
                    detail={"digest": pin.digest},
                )
            )
    for pin in made:
        log.info("contract pinned tool=%s version=%d digest=%s", pin.tool, pin.version, pin.digest)
    return made
