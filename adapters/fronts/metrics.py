"""Prometheus metrics of one gateway, served at ``/metrics`` of ``capgate serve --http``.

What an operator watches from outside (``docs/operations.md`` has example alerts):

=====================================  ==========  ==========================================
metric                                 type        labels
=====================================  ==========  ==========================================
``capgate_decisions_total``            counter     ``question`` (compose, execute), ``allow``
                                                   (true, false), ``reason`` (a reason code;
                                                   ``none`` on an allow without one)
``capgate_tool_outcomes_total``        counter     ``tool``, ``status`` (success, refused,
                                                   retryable, unknown)
``capgate_proposals``                  gauge       ``state`` (pending, approved, dispatched,
                                                   rejected, blocked, expired), read from the
                                                   store at each scrape
``capgate_proposal_oldest_pending_``   gauge       none: how long the oldest pending proposal
``seconds``                                        has waited (0 when none waits)
=====================================  ==========  ==========================================

**Label values are bounded**: a tool is a name of the catalogue (any other, such as an
unknown tool an agent asked for, is counted as ``other``), a reason a code the
policies declare (``other`` for any else); parameters, ids, agents and tenants are
never labels. Each gateway has a registry of its own (not the process-wide default),
so two gateways in one process, or a test, count apart.

The endpoint may be behind a bearer token (``metrics.token_sha256`` of the
configuration): without it, or with another, the answer is ``401`` and nothing else.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from capgate.adapters.fronts.mcp.config import token_digest
from capgate.gateway.enforce.dispatcher import DecisionEvent
from capgate.gateway.state.records import ProposalStatus

if TYPE_CHECKING:
    from capgate.gateway.model.contracts import Catalogue
    from capgate.gateway.state.store import Store

__all__ = ["CONTENT_TYPE", "GatewayMetrics"]

#: The exposition format served (Prometheus' text format 0.0.4).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
OTHER: Final = "other"


class GatewayMetrics:
    """The counters of one gateway, fed by its decisions, and the store's gauges."""

    def __init__(self, catalogue: Catalogue, store: Store, *, reason_codes: Iterable[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._tools = frozenset(catalogue.tools)
        self._codes = frozenset(reason_codes)
        self._decisions = Counter(
            "capgate_decisions",
            "Decisions of the gateway, by question, answer and reason code.",
            ["question", "allow", "reason"],
            registry=self.registry,
        )
        self._outcomes = Counter(
            "capgate_tool_outcomes",
            "Outcomes of the calls the gateway ran, by tool and status.",
            ["tool", "status"],
            registry=self.registry,
        )
        self.registry.register(_ProposalGauges(store))

    def observe(self, event: DecisionEvent) -> None:
        """The gateway's observer: count one decision (and its outcome, if it ran)."""
        question = event.kind if event.kind in ("compose", "execute") else OTHER
        allow = "true" if event.allow else "false"
        reasons = [code if code in self._codes else OTHER for code in event.reason_codes]
        for reason in reasons or ["none"]:
            self._decisions.labels(question, allow, reason).inc()
        if event.status is not None and event.tool is not None:
            tool = event.tool if event.tool in self._tools else OTHER
            status = event.status if event.status in _STATUSES else OTHER
            self._outcomes.labels(tool, status).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    @staticmethod
    def token_matches(authorization: str | None, token_sha256: str) -> bool:
        """``Authorization: Bearer <token>`` whose SHA-256 is ``token_sha256``."""
        if not authorization or not authorization.startswith("Bearer "):
            return False
        digest = token_digest(authorization.removeprefix("Bearer "))
        return hmac.compare_digest(digest.encode(), token_sha256.encode())


_STATUSES: Final = frozenset({"success", "refused", "retryable", "unknown"})


class _ProposalGauges(Collector):
    """Proposals by state, and the oldest pending one's wait, read at each scrape."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("capgate_proposals", "Proposals by state.", labels=["state"])
        yield GaugeMetricFamily(
            "capgate_proposal_oldest_pending_seconds",
            "How long the oldest pending proposal has waited for review.",
        )

    def collect(self) -> Iterator[Metric]:
        with self._store.transaction(read_only=True) as tx:
            proposals = tx.list_proposals()
        counts = {state.value: 0 for state in ProposalStatus}
        oldest: datetime | None = None
        for proposal in proposals:
            counts[proposal.status.value] = counts.get(proposal.status.value, 0) + 1
            if proposal.status is ProposalStatus.PENDING and (
                oldest is None or proposal.created_at < oldest
            ):
                oldest = proposal.created_at
        states = GaugeMetricFamily("capgate_proposals", "Proposals by state.", labels=["state"])
        for state, count in sorted(counts.items()):
            states.add_metric([state], count)
        yield states
        waited = (datetime.now(UTC) - oldest).total_seconds() if oldest is not None else 0.0
        yield GaugeMetricFamily(
            "capgate_proposal_oldest_pending_seconds",
            "How long the oldest pending proposal has waited for review.",
            value=max(0.0, waited),
        )
