"""Liveness and readiness on the serve HTTP port: ``/healthz`` and ``/readyz``.

``GET /healthz`` answers 200 ``{"status": "ok"}`` whenever the process answers; it
asks nothing of OPA or the store, so a supervisor that restarts on it restarts a
process that hangs, never one whose OPA is down (restarting would not help that).

``GET /readyz`` answers 200 when every check of
:class:`~capgate.gateway.service.health.Readiness` passes, 503 otherwise, with each
check by name: ``{"status": "ready", "checks": {"opa": {"ok": true, "detail": ...,
"bundle_revision": ...}, "store": {..., "schema_version": 7}, "worker": {...}}}``.
It answers within the readiness timeout whatever hangs behind it.

Neither needs a token, and neither says anything secret (see
:mod:`capgate.gateway.service.health`); both answer ``GET`` and ``HEAD`` only (405
to the rest) and are never cached. They skip ``/mcp``'s ``Host`` check: they change
nothing and reveal nothing a page could use.
"""

from __future__ import annotations

from typing import Final

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from capgate.gateway.service.health import Readiness

__all__ = ["HEALTHZ_PATH", "READYZ_PATH", "probe_routes"]

HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
#: Probes at once; more wait their turn (each is bounded by the readiness timeout).
_PROBES_AT_ONCE: Final = 4
_NOT_CACHED: Final = {"Cache-Control": "no-store"}


def probe_routes(readiness: Readiness) -> list[BaseRoute]:
    """The two routes, answering from ``readiness``."""
    limiters: list[anyio.CapacityLimiter] = []  # made in the server's event loop

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers=_NOT_CACHED)

    async def readyz(request: Request) -> Response:
        if not limiters:
            limiters.append(anyio.CapacityLimiter(_PROBES_AT_ONCE))
        report = await anyio.to_thread.run_sync(readiness.check, limiter=limiters[0])
        return JSONResponse(
            report.to_json(), status_code=200 if report.ready else 503, headers=_NOT_CACHED
        )

    # Starlette answers HEAD wherever GET is allowed, and 405 to every other method.
    return [
        Route(HEALTHZ_PATH, endpoint=healthz, methods=["GET"]),
        Route(READYZ_PATH, endpoint=readyz, methods=["GET"]),
    ]
