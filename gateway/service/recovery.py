"""Recovery in the background: the gateway's reconcile pass, run every so often.

Crashes leave operations ``running`` past their lease, and lost answers leave them
``unknown``. :meth:`Gateway.reconcile <gateway.service.gateway.Gateway.reconcile>`
settles both without sending anything: it marks the first unknown and looks the
unknown ones up. A service that runs the gateway for a long time (``capgate serve``)
runs it here, on a timer, so an uncertain payment is settled by its lookup even when
no agent ever calls again, and whatever was revoked or expired meanwhile.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Final

from capgate.gateway.errors import CapgateError

if TYPE_CHECKING:
    from capgate.gateway.service.gateway import Gateway

__all__ = ["DEFAULT_RECONCILE_SECONDS", "Reconciler"]

log = logging.getLogger("capgate.service")

#: How often a long-running service reconciles, by default.
DEFAULT_RECONCILE_SECONDS: Final = 30.0


class Reconciler:
    """Calls ``gateway.reconcile()`` every ``interval`` seconds in one daemon thread.

    A pass that fails (the store unreachable, say) is logged and the next one tries
    again; the thread never dies of it. Use it as a context manager: the thread
    starts on entry and is stopped (waiting for a pass under way) on exit.
    """

    def __init__(self, gateway: Gateway, interval: float = DEFAULT_RECONCILE_SECONDS) -> None:
        if (
            not isinstance(interval, int | float)
            or isinstance(interval, bool)
            or not math.isfinite(interval)
            or interval <= 0
        ):
            raise ValueError("the reconcile interval is a positive number of seconds")
        self.gateway = gateway
        self.interval = float(interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capgate-reconcile", daemon=True)

    def __enter__(self) -> Reconciler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                changed = self.gateway.reconcile()
            except CapgateError as exc:
                log.warning("reconcile failed (%s); trying again later", exc.code)
            except Exception as exc:  # never let the thread die
                log.warning("reconcile failed (%s); trying again later", type(exc).__name__)
            else:
                if changed:
                    log.info("reconcile settled or marked %d operation(s)", len(changed))
