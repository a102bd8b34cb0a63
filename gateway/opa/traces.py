"""OPA's own distributed tracing: its spans joined to the gateway's trace, and the
trace in its decision log.

Every request capgate sends OPA carries the current span's W3C ``traceparent``
(:func:`capgate.gateway.tracing.trace_context`). OPA reads it only when its
``distributed_tracing`` is configured; then OPA's server span is a child of the
gateway's, is exported over OTLP to the collector named here, and each decision log
entry carries ``trace_id`` and ``span_id`` (OPA v1 ``server.go``: the decision's
span context, when valid). Off unless an :class:`OPATracing` is given: to
:class:`~capgate.gateway.opa.process.EmbeddedOPA` (``--set`` flags), to
:class:`~capgate.gateway.opa.sidecar.PolicySidecar` (``opa_tracing=``, from
``capgate serve``'s ``opa_tracing:``), or to
:func:`~capgate.gateway.opa.deploy.opa_config` for a deployment's sidecars.

One block of OPA configuration, in both forms, from here::

    distributed_tracing:
      type: http                 # OTLP over HTTP (POST /v1/traces)
      address: 127.0.0.1:4318    # the collector, host:port, named by the operator
      encryption: "off"          # or tls
      service_name: opa
      sample_percentage: 0       # see below

**Sampling follows the gateway.** OPA samples parent-based: a request whose
``traceparent`` says sampled is exported, one that says not sampled is not, whatever
the percentage; ``sample_percentage`` decides only for requests that carry no trace
(health probes, other clients). capgate's default is 0, so OPA exports exactly the
spans of the traces the gateway's own sampler kept; OPA's default would be 100.
Decision log entries carry the trace id either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["OPATracing"]

#: ``host:port``, as OPA's OTLP exporter takes it: a name or IPv4 address, or an IPv6
#: address in brackets. No scheme, path or comma (``--set`` splits values on commas).
_ADDRESS: Final = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):\d{1,5}"
)
_SERVICE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True, slots=True)
class OPATracing:
    """OPA's ``distributed_tracing``: export its spans over OTLP/HTTP to ``address``
    (``host:port`` of a collector; ``encryption="tls"`` for HTTPS), as
    ``service_name``, sampling ``sample_percentage`` of the requests that carry no
    trace (see the module docstring). ValueError for a value OPA would misread."""

    address: str
    service_name: str = "opa"
    sample_percentage: int = 0
    encryption: Literal["off", "tls"] = "off"

    def __post_init__(self) -> None:
        port = self.address.rpartition(":")[2]
        if not _ADDRESS.fullmatch(self.address) or not 0 < int(port or 0) < 65536:
            raise ValueError(
                f"OTLP address {self.address!r}: give host:port of the collector "
                "(e.g. 127.0.0.1:4318), without a scheme or path"
            )
        if not _SERVICE_NAME.fullmatch(self.service_name):
            raise ValueError(
                f"service name {self.service_name!r}: letters, digits, '.', '_' and '-'"
            )
        percentage = self.sample_percentage
        # Whole numbers: ``--set`` reads "12.5" as a string, which OPA then refuses.
        if type(percentage) is not int or not 0 <= percentage <= 100:
            raise ValueError(f"sample_percentage {percentage!r}: a whole number from 0 to 100")
        if self.encryption not in ("off", "tls"):
            raise ValueError(f"encryption {self.encryption!r}: 'off' or 'tls'")

    def config(self) -> dict[str, Any]:
        """The ``distributed_tracing`` block of OPA's configuration."""
        return {
            "type": "http",
            "address": self.address,
            "encryption": self.encryption,
            "service_name": self.service_name,
            "sample_percentage": self.sample_percentage,
        }

    def set_flags(self) -> list[str]:
        """The same block as ``opa run`` flags (``--set distributed_tracing.x=y``)."""
        flags: list[str] = []
        for key, value in self.config().items():
            flags += ["--set", f"distributed_tracing.{key}={value}"]
        return flags
