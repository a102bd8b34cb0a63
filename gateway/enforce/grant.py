"""What the dispatcher hands forward: a call prepared, then a call authorised.

:class:`Prepared` is a call's parameters checked and frozen before anything is
asked; :class:`Authorised` is the frozen grant of exactly what OPA decided, ready to
run now or later (a reviewed proposal waits). Handing these typed objects on, rather
than the pieces, is what keeps a call's data flowing forward: whoever runs a grant
runs exactly what was decided.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from capgate.gateway.enforce.verify import Grant
from capgate.gateway.model.contracts import ToolContract
from capgate.gateway.model.facts import ExecuteInput
from capgate.gateway.tools.contract import Adapter

__all__ = ["Authorised", "Prepared"]


@dataclass(frozen=True, slots=True)
class Prepared:
    """A call's parameters, checked and frozen before anything is asked.

    ``canonical`` is the one private copy of the parameters as canonical JSON:
    what is validated, hashed into ``digest`` and, later, run. ``contract`` is None
    for a tool the catalogue lacks (OPA then denies it as ``unknown_tool``).
    """

    tool: str
    contract: ToolContract | None
    canonical: bytes
    digest: str
    subject: dict[str, str] | None
    #: The values the contract declares, as the policies read them (``call.values``).
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def cost(self) -> int:
        """Budget units this call reserves when it runs (0 for an unknown tool)."""
        return self.contract.cost_of(self.values) if self.contract is not None else 0

    @property
    def params(self) -> dict[str, Any]:
        """A fresh copy of the parameters (the frozen bytes never change)."""
        copied: dict[str, Any] = json.loads(self.canonical)
        return copied


@dataclass(frozen=True, slots=True)
class Authorised:
    """A frozen grant of exactly what OPA decided, ready to run now or later.

    ``action`` is what runs: the tool itself, or for a dispatched proposal the
    contract's execution action. The adapter was found when the grant was made, so
    running touches no registry and cannot fail to find it.
    """

    grant: Grant
    request: ExecuteInput
    prepared: Prepared
    action: str
    adapter: Adapter | None  # None only for a proposal: nothing runs at that stage
    revision: str | None

    @property
    def contract(self) -> ToolContract:
        return self.grant.contract

    @property
    def operation_id(self) -> str:
        return self.grant.operation_id

    @property
    def decision_id(self) -> str | None:
        return self.grant.decision_id
