"""The notifier: each tenant's proposal steps, sent to its webhook, signed, at least once.

The ledger is the outbox. Every step of a proposal's life is a ledger row written in
the step's own transaction (:mod:`capgate.gateway.service.notices.events` says which
rows are which events), so the notifier only has to read each tenant's rows after
its cursor, in order, and send what they say::

    step commits ──▶ ledger row (+ NOTIFY proposal_rows) ──▶ Notifier wakes
    Notifier ──hold the tenant's cursor (a claim)──▶ rows after it, in seq order
      an event ──▶ signed POST ──▶ 2xx ──▶ delivered + cursor moved (one transaction)
                       │          3xx, 4xx but 408/429 ──▶ failed + cursor moved
                       └─ 5xx, 408, 429, timeout, network ──▶ attempt recorded,
                          backoff, again (max_attempts, then failed + cursor moved)

**Nothing is lost.** The cursor moves past a notice only in the transaction that
records it delivered or failed. A process that dies after the receiver answered and
before that commit leaves the cursor where it was: the next holder of the cursor
sends the notice again, with the same event id and the same body (at least once; the
receiver de-duplicates on the id). A process that dies holding a cursor leaves its
claim to lapse (``claim_seconds``), and another notifier takes the tenant over.

**In order, one process at a time.** One notifier holds a tenant's cursor at a time
(a claim in the store, renewed while it works), so any number of ``capgate serve``
and ``capgate worker`` processes may run notifiers on one store. A tenant's notices
go in ledger order; a receiver that is down holds its own tenant's notices back for
at most the retries of one notice, never another tenant's (each tenant has its own
thread and HTTP client).

**Nothing secret leaves.** The body carries ids, the tool, the parameters' digest,
statuses and reason codes and a link to the inbox, never content. The secret is read
from the environment at start and used only to sign. Logs and the store record the
event id, type, proposal, the attempt and ``http_<status>`` or an error's class,
never the body, the secret, or the URL beyond its host (webhook URLs often carry a
token in their path).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, Literal
from urllib.parse import urlsplit

import httpx

from capgate.gateway.errors import CapgateError
from capgate.gateway.service.notices.events import event_id, event_type, notice_body
from capgate.gateway.service.notices.settings import EventType, NoticeSettings, TenantWebhook
from capgate.gateway.service.notices.signing import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    SIGNATURE_HEADER,
    signature_header,
)
from capgate.gateway.service.worker import LISTEN_POLL_SECONDS, backoff
from capgate.gateway.state.records import (
    LedgerEntry,
    LedgerRow,
    NoticeDelivery,
    NoticeStatus,
    ProposalRecord,
)
from capgate.gateway.state.store import Listener, Store
from capgate.gateway.version import __version__

__all__ = ["BATCH", "Notifier"]

log = logging.getLogger("capgate.service.notices")

#: Ledger rows read per look.
BATCH: Final = 100
#: Statuses a receiver may answer to be asked again: a timeout, too many requests.
_RETRY_STATUSES: Final = frozenset({408, 429})
#: The longest a notifier waits on a stopping receiver before giving up its threads.
_STOP_GRACE: Final = 5.0

Verdict = Literal["delivered", "retry", "failed"]


@dataclass(frozen=True)
class _Sent:
    """What one attempt came to: secret-free, for the store and the logs."""

    verdict: Verdict
    result: str
    status_code: int | None = None
    retry_after: float | None = None


class _Stopped(Exception):
    """The notifier is stopping, or lost its hold on the tenant: leave the rest."""


def _notifier_name() -> str:
    return f"notifier-{socket.gethostname()[:64]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _retry_after(value: str | None, longest: float) -> float | None:
    """A Retry-After in seconds (an HTTP date is ignored), at most ``longest``: a
    receiver may slow its notices down, not hold them for a day."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(value.strip()), longest)


class Notifier:
    """Sends each configured tenant's proposal steps to its webhook (see the module).

    Use it as a context manager (or :meth:`start` and :meth:`stop`). The secrets are
    read from the environment here, so a missing one fails at start-up
    (``ConfigError`` naming the variable). ``transport`` replaces httpx's network
    transport (tests); ``clock`` gives the unix time a notice is signed at.
    """

    def __init__(
        self,
        store: Store,
        settings: NoticeSettings,
        *,
        name: str | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        #: This notifier's name in claims, logs and the ledger.
        self.name = name or _notifier_name()
        self._clock = clock
        self._secrets = {tenant: hook.secret(tenant) for tenant, hook in settings.tenants.items()}
        self._clients = {
            tenant: httpx.Client(
                timeout=hook.timeout_seconds,
                follow_redirects=False,  # a redirect could send a notice elsewhere
                trust_env=False,  # no proxy or .netrc from the environment
                transport=transport,
            )
            for tenant, hook in settings.tenants.items()
        }
        self._stopping = threading.Event()
        self._wakes = {tenant: threading.Event() for tenant in settings.tenants}
        self._threads: list[threading.Thread] = []
        self._listener: Listener | None = None

    # -- life ------------------------------------------------------------------------------

    def __enter__(self) -> Notifier:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the loops, once each tenant's cursor exists: a tenant's first cursor
        starts at the ledger's end (notices are not sent for what happened before),
        so it is taken here, in the caller's thread, and every row written after
        ``start`` returns is one the notices go on from, however late the loops
        run on a busy machine."""
        if self._threads:
            raise RuntimeError("this notifier was started already")
        for tenant in self.settings.tenants:
            try:
                self._hold(tenant)
            except _Stopped:
                pass  # another notifier holds it: its cursor exists
            except CapgateError as exc:  # the loop tries again
                log.warning("notifier %s: %s: could not take its cursor (%s)", self.name,
                            tenant, exc.code)  # fmt: skip
        self._listener = self.store.listen("proposal_rows")
        threads = [threading.Thread(target=self._watch, name="capgate-notices", daemon=True)]
        for tenant in self.settings.tenants:
            threads.append(
                threading.Thread(
                    target=self._loop, args=(tenant,), name="capgate-notices", daemon=True
                )
            )
        self._threads = threads
        for thread in threads:
            thread.start()
        log.info("notifier %s started: %s", self.name, self.settings.describe())

    def stop(self) -> None:
        """Stop sending; wait for the attempts under way (each bounded by its timeout),
        then give up the holds, so another notifier may take over at once."""
        self._stopping.set()
        for wake in self._wakes.values():
            wake.set()
        if self._listener is not None:
            self._listener.wake()
        longest = max(hook.timeout_seconds for hook in self.settings.tenants.values())
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(3 * longest + _STOP_GRACE)
        for tenant in self.settings.tenants:
            try:
                with self.store.transaction() as tx:
                    tx.release_notices(tenant, self.name)
            except Exception as exc:  # the claim lapses by itself
                log.warning("notifier %s: could not give %s back (%s)", self.name, tenant,
                            getattr(exc, "code", type(exc).__name__))  # fmt: skip
        if self._listener is not None:
            self._listener.close()
        for client in self._clients.values():
            client.close()
        log.info("notifier %s stopped", self.name)

    def run_once(self) -> int:
        """One look at every tenant, in this thread: the notices settled (delivered or
        failed), retries included."""
        return sum(self._round(tenant)[0] for tenant in self.settings.tenants)

    # -- the loops -------------------------------------------------------------------------

    def _watch(self) -> None:
        """Pass each commit's notice on to every tenant's loop."""
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            if listener.wait(1.0):
                for wake in self._wakes.values():
                    wake.set()

    def _poll_seconds(self) -> float:
        listener = self._listener
        listening = listener is not None and listener.listening
        return LISTEN_POLL_SECONDS if listening else self.settings.poll_seconds

    def _loop(self, tenant: str) -> None:
        wake = self._wakes[tenant]
        while not self._stopping.is_set():
            more = False
            try:
                more = self._round(tenant)[1]
            except _Stopped:
                pass
            except CapgateError as exc:
                log.warning("notifier %s: %s: looking for notices failed (%s)", self.name,
                            tenant, exc.code)  # fmt: skip
            except Exception as exc:  # never let the loop die
                log.warning("notifier %s: %s: looking for notices failed (%s)", self.name,
                            tenant, type(exc).__name__)  # fmt: skip
            if not more:
                wake.wait(self._poll_seconds())
                wake.clear()

    def _hold(self, tenant: str) -> int:
        """Take (or renew) the tenant's cursor: how far its notices have gone. _Stopped
        when stopping, or while another notifier holds it."""
        if self._stopping.is_set():
            raise _Stopped
        with self.store.transaction() as tx:
            cursor = tx.claim_notices(
                tenant, self.name, claim=timedelta(seconds=self.settings.claim_seconds)
            )
        if cursor is None:
            raise _Stopped
        return cursor.after_seq

    def _round(self, tenant: str) -> tuple[int, bool]:
        """Send the notices of one batch of the tenant's rows after its cursor: how
        many were settled, and whether there may be more rows at once. _Stopped
        mid-way leaves the rest."""
        after = self._hold(tenant)
        rows = self.store.ledger(tenant=tenant, after_seq=after, limit=BATCH)
        hook = self.settings.tenants[tenant]
        settled = 0
        last = after
        try:
            for row in rows:
                kind = event_type(row)
                if kind is not None and kind in hook.events:
                    self._deliver(tenant, hook, row, kind)
                    settled += 1
                last = row.seq
        finally:
            if last > after:  # past the rows that were no notices, too
                with self.store.transaction() as tx:
                    tx.advance_notices(tenant, self.name, last)
        return settled, len(rows) == BATCH

    # -- one notice ----------------------------------------------------------------------

    def _deliver(self, tenant: str, hook: TenantWebhook, row: LedgerRow, kind: EventType) -> None:
        """Send one notice until it is delivered or failed for good, and record it."""
        with self.store.transaction(read_only=True) as tx:
            assert row.proposal_id is not None  # event_type says so
            proposal = tx.get_proposal(row.proposal_id)
            known = tx.get_notice(event_id(row))
        if proposal is None:  # pragma: no cover - a row names a stored proposal
            log.warning("notifier %s: no proposal for ledger row %d", self.name, row.seq)
            return
        if known is not None and known.status is not NoticeStatus.SENDING:
            return  # settled by a notifier that stalled past its claim
        body = notice_body(row, kind, proposal, self.settings)
        attempts = 0 if known is None else known.attempts
        while True:
            self._hold(tenant)
            attempts += 1
            sent = self._send(tenant, hook, event_id(row), kind, body)
            final = sent.verdict != "retry" or attempts >= hook.max_attempts
            if final:
                self._settle(tenant, row, kind, proposal, sent, attempts)
                return
            self._record(tenant, row, kind, proposal, sent, NoticeStatus.SENDING)
            wait = backoff(hook, attempts, sent.retry_after)
            log.info(
                "notifier %s: %s %s of proposal=%s: attempt %d: %s; again in %.1f s",
                self.name, tenant, event_id(row), proposal.id, attempts, sent.result, wait,
            )  # fmt: skip
            self._pause(tenant, wait)

    def _pause(self, tenant: str, seconds: float) -> None:
        """Wait ``seconds`` before the next attempt, renewing the hold meanwhile."""
        end = time.monotonic() + seconds
        step = self.settings.claim_seconds / 3
        while (left := end - time.monotonic()) > 0:
            if self._stopping.wait(min(left, step)):
                raise _Stopped
            self._hold(tenant)

    def _send(
        self, tenant: str, hook: TenantWebhook, eid: str, kind: EventType, body: bytes
    ) -> _Sent:
        """One signed POST; what it came to, never raising."""
        timestamp = int(self._clock())
        headers = {
            "content-type": "application/json",
            "user-agent": f"capgate/{__version__}",
            SIGNATURE_HEADER: signature_header(self._secrets[tenant], timestamp, body),
            EVENT_ID_HEADER: eid,
            EVENT_TYPE_HEADER: kind,
        }
        try:
            with self._clients[tenant].stream(
                "POST", hook.url, content=body, headers=headers
            ) as response:
                status = response.status_code
                retry_after = _retry_after(
                    response.headers.get("retry-after"), hook.longest_backoff_seconds
                )
        except httpx.TransportError as exc:  # connecting, timeouts, the network
            return _Sent("retry", type(exc).__name__)
        except Exception as exc:  # anything else about this request: try again later
            return _Sent("retry", type(exc).__name__)
        result = f"http_{status}"
        if 200 <= status < 300:
            return _Sent("delivered", result, status)
        if status >= 500 or status in _RETRY_STATUSES:
            return _Sent("retry", result, status, retry_after)
        # 1xx, 3xx (never followed) and 4xx: the receiver will not take this notice.
        return _Sent("failed", result, status)

    def _delivery(
        self,
        tenant: str,
        row: LedgerRow,
        kind: EventType,
        proposal: ProposalRecord,
        status: NoticeStatus,
        sent: _Sent,
        at: object,
    ) -> NoticeDelivery:
        return NoticeDelivery.model_validate(
            {
                "event_id": event_id(row),
                "tenant": tenant,
                "seq": row.seq,
                "event": kind,
                "proposal_id": proposal.id,
                "status": status,
                "attempts": 0,
                "last_result": sent.result,
                "created_at": at,
                "updated_at": at,
            }
        )

    def _record(
        self,
        tenant: str,
        row: LedgerRow,
        kind: EventType,
        proposal: ProposalRecord,
        sent: _Sent,
        status: NoticeStatus,
    ) -> None:
        with self.store.transaction() as tx:
            tx.record_notice_attempt(
                self._delivery(tenant, row, kind, proposal, status, sent, tx.now),
                result=sent.result,
                status_code=sent.status_code,
            )

    def _settle(
        self,
        tenant: str,
        row: LedgerRow,
        kind: EventType,
        proposal: ProposalRecord,
        sent: _Sent,
        attempts: int,
    ) -> None:
        """The last attempt, the delivery's end and the cursor past it, in one
        transaction (with a ledger row when it failed); _Stopped if the hold was lost."""
        status = NoticeStatus.DELIVERED if sent.verdict == "delivered" else NoticeStatus.FAILED
        with self.store.transaction() as tx:
            if not tx.advance_notices(tenant, self.name, row.seq):
                raise _Stopped  # another notifier took the tenant over: it sends it
            tx.record_notice_attempt(
                self._delivery(tenant, row, kind, proposal, status, sent, tx.now),
                result=sent.result,
                status_code=sent.status_code,
            )
            if status is NoticeStatus.FAILED:
                tx.append(
                    LedgerEntry(
                        kind="notice",
                        tenant=tenant,
                        principal=self.name,
                        tool=proposal.tool,
                        contract_version=proposal.contract_version,
                        operation_id=proposal.operation_id,
                        proposal_id=proposal.id,
                        outcome=NoticeStatus.FAILED.value,
                        reason_codes=[sent.result],
                        detail={"event": kind, "event_id": event_id(row), "attempts": attempts},
                    )
                )
        if status is NoticeStatus.DELIVERED:
            log.info("notifier %s: %s %s %s of proposal=%s delivered (attempt %d)", self.name,
                     tenant, event_id(row), kind, proposal.id, attempts)  # fmt: skip
        else:
            log.warning(
                "notifier %s: %s %s %s of proposal=%s failed for good after %d attempt(s) "
                "(%s) to host %s",
                self.name, tenant, event_id(row), kind, proposal.id, attempts, sent.result,
                urlsplit(self.settings.tenants[tenant].url).hostname,
            )  # fmt: skip
