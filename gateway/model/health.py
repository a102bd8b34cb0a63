"""What one readiness check found: the contract between the parts that are checked
(the OPA sidecar, the store, the worker) and whoever asks (a probe endpoint).

Each part answers for itself, in the room that knows it
(:meth:`capgate.gateway.opa.sidecar.PolicySidecar.readiness`,
:mod:`capgate.gateway.service.health`); the answer is the same small shape
everywhere, so a front can render every check alike without knowing what was checked.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["CheckResult"]


class CheckResult(BaseModel):
    """One check: whether the part is ready, what was found (for people), and a few
    facts worth showing (a bundle revision, a schema version).

    ``detail`` and ``facts`` may be shown to anyone who can reach a probe: they never
    hold tenant names, tokens or secrets; a front that serves them to unauthenticated
    callers also takes addresses and file paths out (:mod:`capgate.gateway.service.health`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    detail: str
    facts: dict[str, str | int | None] = {}
