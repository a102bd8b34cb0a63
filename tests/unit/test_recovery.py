"""The Reconciler: the reconcile pass on a timer, surviving its own failures.

A fake gateway stands in (only ``reconcile`` is called): this is the timer's logic,
not the pass itself, which tests/integration/test_lifecycle_unknown.py runs for real.
No assertion here depends on how fast the machine is: waits are bounds on a hang.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from capgate.gateway.errors import StoreError
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.recovery import Reconciler

#: How long a test waits for the thread before calling it hung.
HANG: float = 60.0


class CountingGateway:
    """Counts passes; the first ``failures`` of them raise."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = list(failures)
        self.passes = 0
        self.third = threading.Event()

    def reconcile(self) -> list[Any]:
        self.passes += 1
        if self.passes >= 3:
            self.third.set()
        if self.failures:
            raise self.failures.pop(0)
        return []


def test_it_keeps_reconciling_after_a_pass_fails() -> None:
    gateway = CountingGateway([StoreError("the store is down"), RuntimeError("a bug")])
    with Reconciler(cast(Gateway, gateway), interval=0.01):
        assert gateway.third.wait(HANG), "the reconciler stopped after a failing pass"
    stopped_at = gateway.passes
    assert not gateway.failures  # both failures were met, and passes went on
    assert gateway.passes == stopped_at  # closed: no pass after the block


@pytest.mark.parametrize("interval", [0, -1, float("nan"), True, "30"])
def test_the_interval_is_a_positive_number(interval: Any) -> None:
    with pytest.raises(ValueError, match="positive"):
        Reconciler(cast(Gateway, CountingGateway([])), interval=interval)
