"""A global propagator of another format than W3C's, for the tests that show capgate
sends the W3C trace context whatever the application installed globally."""

from __future__ import annotations

import pytest
from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)

#: The one key the stand-in writes, and its value.
FOREIGN_KEY = "x-b3-sampled"
FOREIGN_VALUE = "1"


class B3Like(TextMapPropagator):
    """A stand-in for an application's own global propagator (B3, say)."""

    def extract(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        getter: Getter[CarrierT] = default_getter,
    ) -> Context:
        return context if context is not None else Context()

    def inject(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        setter: Setter[CarrierT] = default_setter,
    ) -> None:
        setter.set(carrier, FOREIGN_KEY, FOREIGN_VALUE)

    @property
    def fields(self) -> set[str]:
        return {FOREIGN_KEY}


def install_b3_like(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make :class:`B3Like` the global propagator for the test."""
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", B3Like())
