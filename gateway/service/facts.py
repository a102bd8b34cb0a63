"""The facts that grant, read from the store: the one place a decision's input begins.

A caller says who is asking, the task and the environment; everything else OPA
decides with (connection status, budget, evidence, the operation's history, which
upstream tools are quarantined) is the gateway's own, read here in one transaction
and handed forward as one typed :class:`CallFacts`. :func:`execute_input` is the
one place those facts become OPA's execute input, whichever step asks (a call, a
proposal, a dispatch).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.enforce.grant import Prepared
from capgate.gateway.errors import UnknownTenant
from capgate.gateway.model.contracts import Catalogue, TaskLinks
from capgate.gateway.model.facts import (
    Approval,
    Budget,
    ComposeInput,
    EvidencePiece,
    ExecuteInput,
    OperationState,
    Principal,
    ProposalRef,
    ResourceRef,
    Stage,
    Task,
)
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.state.records import (
    BudgetState,
    ConnectionRecord,
    OperationRecord,
    OperationStatus,
    PinRecord,
    PinStatus,
)
from capgate.gateway.state.store import Store, Tx
from capgate.gateway.tools.definitions import SupportsDefinitions
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["CallFacts", "FactReader", "execute_input", "recorded_links"]

log = logging.getLogger("capgate.service")


@dataclass(frozen=True)
class CallFacts:
    """Every fact deciding and running one call read from the store, in one snapshot."""

    compose: ComposeInput
    #: Every piece of evidence the task has, expired or not (OPA's clock judges).
    evidence: tuple[EvidencePiece, ...]
    budget: BudgetState
    operation: OperationState
    #: The account of each of the tenant's connections, by alias: the tool's
    #: connection names the one its call runs as.
    accounts: Mapping[str, str]


class FactReader:
    """Reads the facts of compose and of a call for one catalogue and registry.

    It knows which catalogue tools run under pinned upstream definitions (named by an
    ``upstream``, or held by an adapter that pins definitions), so that their
    quarantine is read with every decision's facts; adapters are attached to the
    registry before the gateway is built.
    """

    def __init__(self, catalogue: Catalogue, registry: ToolRegistry, store: Store) -> None:
        self.store = store
        #: Catalogue tools that run on an MCP server: name -> (server, upstream tool).
        self._upstream = {
            name: (contract.upstream.server, contract.upstream.tool)
            for name, contract in sorted(catalogue.tools.items())
            if contract.upstream is not None
        }
        #: The adapters that run tools only under accepted definitions, with the
        #: catalogue tools each runs (an MCP adapter may also run the tools the
        #: catalogue leaves unplaced).
        pinned: dict[int, tuple[SupportsDefinitions, list[str]]] = {}
        for name in sorted(catalogue.tools):
            holder = registry.adapter_for(name)
            if isinstance(holder, SupportsDefinitions):
                pinned.setdefault(id(holder), (holder, []))[1].append(name)
        self._pinned_adapters = list(pinned.values())
        #: The task types whose links are the store's (``links: recorded``).
        self._recorded_links = frozenset(
            name for name, spec in catalogue.task_types.items() if spec.links is TaskLinks.RECORDED
        )

    def compose(
        self,
        tx: Tx,
        principal: Principal,
        task: Task,
        environment: str,
        connections: Mapping[str, ConnectionRecord] | None = None,
    ) -> ComposeInput:
        """The compose input: the caller's facts plus the tenant's, read in ``tx``."""
        tenant = tx.get_tenant(principal.tenant)
        if tenant is None:
            raise UnknownTenant(principal.tenant)
        if connections is None:
            connections = tx.connections(principal.tenant)
        if task.type in self._recorded_links:
            task = task.model_copy(
                update={"linked_resources": recorded_links(tx, principal.tenant, task)}
            )
        return ComposeInput(
            principal=principal,
            task=task,
            connections={alias: c.status for alias, c in connections.items()},
            environment=environment,
            budget_class=tenant.budget_class,
            quarantined=self.quarantined(tx),
        )

    def compose_now(self, principal: Principal, task: Task, environment: str) -> ComposeInput:
        """:meth:`compose` in a transaction of its own."""
        with self.store.transaction(read_only=True) as tx:
            return self.compose(tx, principal, task, environment)

    def call(
        self,
        principal: Principal,
        task: Task,
        environment: str,
        task_id: str,
        operation_id: str,
    ) -> CallFacts:
        """Every fact a call's decision and run need, read in one transaction."""
        tenant = principal.tenant
        with self.store.transaction(read_only=True) as tx:
            connections = tx.connections(tenant)
            return CallFacts(
                compose=self.compose(tx, principal, task, environment, connections),
                evidence=tuple(r.piece() for r in tx.evidence_records(tenant, task_id)),
                budget=tx.budget(tenant, task_id),
                operation=operation_state(tx.get_operation(tenant, operation_id)),
                accounts={alias: c.account for alias, c in connections.items()},
            )

    def quarantined(self, tx: Tx) -> list[str]:
        """The catalogue tools an MCP server runs whose definition, as the server shows
        it now, a person has not accepted as that tool (never discovered, pending,
        changed upstream, no longer listed, or rejected): OPA hides and denies them
        (``tool_quarantined``). Read from the store's pins, never from the caller."""
        if not self._upstream and not self._pinned_adapters:
            return []
        listed = tx.pins()
        pins = {(pin.server, pin.tool): pin for pin in listed}
        quarantined = set()
        for name, (server, tool) in self._upstream.items():
            pin = pins.get((server, tool))
            if pin is None or pin.status is not PinStatus.ACCEPTED or pin.catalogue_tool != name:
                quarantined.add(name)
        for adapter, names in self._pinned_adapters:
            quarantined |= _adapter_quarantine(adapter, names, listed)
        return sorted(quarantined)


def execute_input(
    dispatcher: Dispatcher,
    facts: CallFacts,
    prepared: Prepared,
    *,
    stage: Stage,
    operation_id: str,
    approval: Approval | None = None,
    proposal: ProposalRef | None = None,
    version: int | None = None,
) -> ExecuteInput:
    """The execute input of ``prepared`` under ``facts``: the one place the gateway's
    facts become OPA's input. The budget (the remaining units and what this call
    costs) and the operation's history go when something runs; proposing runs
    nothing, so it is sent neither. Evidence goes twice: the names of the pieces that
    never expire (what a requirement about anything reads, as before subjects), and
    every piece with its subject and expiry."""
    runs = stage is not Stage.PROPOSE
    cost = prepared.cost
    return dispatcher.execute_input(
        facts.compose,
        prepared,
        operation_id=operation_id,
        stage=stage,
        approval=approval,
        evidence={piece.name for piece in facts.evidence if piece.expires_at is None},
        evidence_about=facts.evidence,
        budget=Budget(remaining=facts.budget.remaining, cost=cost) if runs else None,
        operation=facts.operation if runs else None,
        proposal=proposal,
        version=version,
    )


def recorded_links(tx: Tx, tenant: str, task: Task) -> list[ResourceRef]:
    """The resources the gateway has linked to the task, in ``tx``: all of them when
    the request names none, else those the request names too. A request narrows
    what it works on; a resource it names that is not linked is simply not there.
    A task without an id has nothing linked."""
    if task.id is None:
        return []
    linked = [link.resource for link in tx.task_links(tenant, task.id)]
    if not task.linked_resources:
        return linked
    asked = {(r.type, r.id) for r in task.linked_resources}
    return [r for r in linked if (r.type, r.id) in asked]


def operation_state(record: OperationRecord | None) -> OperationState:
    """The store's state of an operation id, as the execute policy reads it."""
    if record is None:
        return OperationState(status="none")
    if record.status is OperationStatus.RUNNING or record.outcome is None:
        return OperationState(status="running")
    status = Outcome.model_validate(record.outcome).status
    return OperationState(status=status.value)


def _adapter_quarantine(
    adapter: SupportsDefinitions, names: list[str], pins: list[PinRecord]
) -> set[str]:
    """The tools an adapter says its pins do not let run; all of them if it cannot say
    (a fact that grants is never assumed)."""
    try:
        found = adapter.quarantined(names, pins)
    except Exception as exc:
        log.warning("an adapter could not say which tools are quarantined (%s)", type(exc).__name__)
        return set(names)
    return {name for name in found if name in names} if isinstance(found, set) else set(names)
