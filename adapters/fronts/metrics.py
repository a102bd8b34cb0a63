"""Prometheus metrics of one gateway, served at ``/metrics`` of ``capgate serve --http``.

What an operator watches from outside (``docs/operations.md`` has the table of every
metric, and example alerts). Counters and histograms are fed as things happen: each
decision (:class:`~capgate.gateway.enforce.dispatcher.DecisionEvent`), each round trip
to OPA (:class:`~capgate.gateway.policy.client.Exchange`) and each step of the life
cycle (:class:`~capgate.gateway.service.gateway.StepTiming`). Gauges are read when
scraped, from the store (proposals, the dispatch queue, budgets: every process of a
deployment then reports the same numbers) and from OPA itself (ready, and the
revision it serves).

**Label values are bounded**: a tool is a name of the catalogue (any other, such as an
unknown tool an agent asked for, is counted as ``other``), a reason a code the
policies declare (``other`` for any else), a question, step or state one of a fixed
few; parameters, ids and agents are never labels. Tenants are labels only when an
operator turns them on (``metrics.tenant_labels``: one series per tenant is the
operator's choice to make, knowing how many there are). Each gateway has a registry
of its own (not the process-wide default), so two gateways in one process, or a test,
count apart.

The endpoint may be behind a bearer token (``metrics.token_sha256`` of the
configuration): without it, or with another, the answer is ``401`` and nothing else.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from capgate.adapters.fronts.mcp.config import token_digest
from capgate.gateway.enforce.dispatcher import DecisionEvent
from capgate.gateway.state.records import DispatchStatus, ProposalStatus

if TYPE_CHECKING:
    from capgate.gateway.model.contracts import Catalogue
    from capgate.gateway.model.health import CheckResult
    from capgate.gateway.policy.client import Exchange
    from capgate.gateway.service.gateway import StepTiming
    from capgate.gateway.state.store import Store

__all__ = ["CONTENT_TYPE", "GatewayMetrics"]

#: The exposition format served (Prometheus' text format 0.0.4).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
OTHER: Final = "other"
#: Seconds: an OPA exchange on loopback takes about a millisecond, a whole call a few,
#: a tool over the network up to its timeout; the buckets span all three.
BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
#: The questions and steps that are labels (anything else is ``other``).
_QUESTIONS: Final = frozenset(
    {"compose", "execute", "review", "link", "explain", "catalogue", "query"}
)
_STEPS: Final = frozenset({"compose", "execute", "review", "dispatch"})
_RESULTS: Final = frozenset({"ok", "denied", "error"})
_STATUSES: Final = frozenset({"success", "refused", "retryable", "unknown"})
#: The longest bundle revision shown as a label (a revision is the bundle's to say).
_REVISION_CHARS: Final = 128


class GatewayMetrics:
    """The counters and histograms of one gateway, and the gauges read at scrape.

    ``tenant_labels`` adds a ``tenant`` label to the decisions, the outcomes and the
    budgets (off: they are summed over tenants). :meth:`watch_opa` gives the check
    that says whether OPA is ready (the sidecar's readiness, also behind
    ``/readyz``); until then no OPA gauge is reported.
    """

    def __init__(
        self,
        catalogue: Catalogue,
        store: Store,
        *,
        reason_codes: Iterable[str],
        tenant_labels: bool = False,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._tools = frozenset(catalogue.tools)
        self._codes = frozenset(reason_codes)
        self._tenant_labels = tenant_labels
        self._store = store
        self._tenants: frozenset[str] = frozenset()
        tenant = ["tenant"] if tenant_labels else []
        self._decisions = Counter(
            "capgate_decisions",
            "Decisions of the gateway, by question, answer and reason code.",
            ["question", "allow", "reason", *tenant],
            registry=self.registry,
        )
        self._outcomes = Counter(
            "capgate_tool_outcomes",
            "Outcomes of the calls the gateway ran, by tool and status.",
            ["tool", "status", *tenant],
            registry=self.registry,
        )
        self._exchanges = Histogram(
            "capgate_policy_exchange_seconds",
            "Round trips to OPA, by question and whether OPA answered.",
            ["question", "answered"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self._steps = Histogram(
            "capgate_step_seconds",
            "Whole steps of the life cycle (facts, OPA, tool, records), by step and result.",
            ["step", "result"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self._opa = _OpaGauges()
        self.registry.register(_StoreGauges(store, tenant_labels=tenant_labels))
        self.registry.register(self._opa)

    def observe(self, event: DecisionEvent) -> None:
        """The gateway's observer: count one decision (and its outcome, if it ran)."""
        question = event.kind if event.kind in ("compose", "execute") else OTHER
        allow = "true" if event.allow else "false"
        tenant = [self._tenant(event.tenant)] if self._tenant_labels else []
        reasons = [code if code in self._codes else OTHER for code in event.reason_codes]
        for reason in reasons or ["none"]:
            self._decisions.labels(question, allow, reason, *tenant).inc()
        if event.status is not None and event.tool is not None:
            tool = event.tool if event.tool in self._tools else OTHER
            status = event.status if event.status in _STATUSES else OTHER
            self._outcomes.labels(tool, status, *tenant).inc()

    def _tenant(self, tenant: str | None) -> str:
        """A tenant the store holds, else ``other``: a label value is never a name
        a caller made up. The store is read again only for a tenant not seen yet."""
        if tenant is None:
            return OTHER
        if tenant not in self._tenants:
            with self._store.transaction(read_only=True) as tx:
                self._tenants = frozenset(t.tenant for t in tx.tenants())
        return tenant if tenant in self._tenants else OTHER

    def exchange(self, exchange: Exchange) -> None:
        """The policy client's ``on_exchange``: one round trip to OPA, timed."""
        question = exchange.question if exchange.question in _QUESTIONS else OTHER
        answered = "true" if exchange.answered else "false"
        self._exchanges.labels(question, answered).observe(max(0.0, exchange.seconds))

    def step(self, timing: StepTiming) -> None:
        """The gateway's ``on_step``: one whole step of the life cycle, timed."""
        step = timing.step if timing.step in _STEPS else OTHER
        result = timing.result if timing.result in _RESULTS else OTHER
        self._steps.labels(step, result).observe(max(0.0, timing.seconds))

    def watch_opa(self, check: Callable[[], CheckResult]) -> None:
        """Report ``capgate_opa_ready`` and the bundle revision from ``check`` (asked at
        each scrape; the sidecar's readiness, which never raises)."""
        self._opa.check = check

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    @staticmethod
    def token_matches(authorization: str | None, token_sha256: str) -> bool:
        """``Authorization: Bearer <token>`` whose SHA-256 is ``token_sha256``."""
        if not authorization or not authorization.startswith("Bearer "):
            return False
        digest = token_digest(authorization.removeprefix("Bearer "))
        return hmac.compare_digest(digest.encode(), token_sha256.encode())


def _gauge(name: str, documentation: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=list(labels))


class _StoreGauges(Collector):
    """What the store says at each scrape: proposals by state and the oldest pending
    one's wait; the dispatch queue and how late it runs; budgets reserved and spent.

    One read-only transaction per scrape. Every proposal and job is read (a count in
    SQL is the store's to offer): on a store with very many, scrape it less often.
    """

    def __init__(self, store: Store, *, tenant_labels: bool) -> None:
        self._store = store
        self._tenant_labels = tenant_labels

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        tenant = ["tenant"] if self._tenant_labels else []
        return (
            _gauge("capgate_proposals", "Proposals by state.", ["state"]),
            _gauge(
                "capgate_proposal_oldest_pending_seconds",
                "How long the oldest pending proposal has waited for review.",
            ),
            _gauge("capgate_dispatch_jobs", "Jobs of the dispatch queue, by status.", ["status"]),
            _gauge(
                "capgate_dispatch_lag_seconds",
                "How long the longest-due queued dispatch has waited for a worker.",
            ),
            _gauge(
                "capgate_budget_reserved_units",
                "Budget units held by calls that have not settled.",
                tenant,
            ),
            _gauge("capgate_budget_spent_units", "Budget units settled as spent.", tenant),
        )

    def collect(self) -> Iterator[Metric]:
        with self._store.transaction(read_only=True) as tx:
            now = tx.now  # the store's clock, which every time in it was written by
            proposals = tx.list_proposals()
            jobs = tx.dispatches()
            budgets = [tx.budget(t.tenant) for t in tx.tenants()]
        states, oldest, queue, lag, reserved, spent = self._families()
        counts = {state.value: 0 for state in ProposalStatus}
        waiting: datetime | None = None
        for proposal in proposals:
            counts[proposal.status.value] = counts.get(proposal.status.value, 0) + 1
            if proposal.status is ProposalStatus.PENDING and (
                waiting is None or proposal.created_at < waiting
            ):
                waiting = proposal.created_at
        for state, count in sorted(counts.items()):
            states.add_metric([state], count)
        oldest.add_metric([], _since(waiting, now))
        statuses = {status.value: 0 for status in DispatchStatus}
        due: datetime | None = None
        for job in jobs:
            statuses[job.status.value] = statuses.get(job.status.value, 0) + 1
            # A job held by a live worker is being worked on, not waiting; one whose
            # claim ran out (its worker died) waits again from the claim's end.
            claimed = job.claim_until is not None and job.claim_until > now
            if job.status is DispatchStatus.QUEUED and not claimed:
                since = max(job.not_before, job.claim_until or job.not_before)
                if since <= now and (due is None or since < due):
                    due = since
        for status, count in sorted(statuses.items()):
            queue.add_metric([status], count)
        lag.add_metric([], _since(due, now))
        if self._tenant_labels:
            for budget in sorted(budgets, key=lambda b: b.tenant):
                reserved.add_metric([budget.tenant], budget.reserved)
                spent.add_metric([budget.tenant], budget.spent)
        else:
            reserved.add_metric([], sum(b.reserved for b in budgets))
            spent.add_metric([], sum(b.spent for b in budgets))
        yield from (states, oldest, queue, lag, reserved, spent)


def _since(moment: datetime | None, now: datetime) -> float:
    return max(0.0, (now - moment).total_seconds()) if moment is not None else 0.0


class _OpaGauges(Collector):
    """``capgate_opa_ready`` (1 or 0) and ``capgate_policy_bundle_info`` (1, labelled
    with the revision OPA answered under), from the check asked at each scrape."""

    def __init__(self) -> None:
        self.check: Callable[[], CheckResult] | None = None

    def describe(self) -> Iterator[Metric]:
        yield _gauge("capgate_opa_ready", "1 when OPA is ready and serves this catalogue.")
        yield _gauge(
            "capgate_policy_bundle_info", "The bundle revision OPA serves (value 1).", ["revision"]
        )

    def collect(self) -> Iterator[Metric]:
        if self.check is None:
            return
        result = self.check()
        ready = _gauge("capgate_opa_ready", "1 when OPA is ready and serves this catalogue.")
        ready.add_metric([], 1 if result.ok else 0)
        yield ready
        revision = result.facts.get("bundle_revision") if result.ok else None
        if isinstance(revision, str) and revision:
            info = _gauge(
                "capgate_policy_bundle_info",
                "The bundle revision OPA serves (value 1).",
                ["revision"],
            )
            info.add_metric([revision[:_REVISION_CHARS]], 1)
            yield info
