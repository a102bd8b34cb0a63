"""Signed webhook notices against a real OPA, a real store (SQLite and PostgreSQL)
and a real HTTP receiver on 127.0.0.1.

Issue #19, item 4. The receiver is a stdlib HTTP server that checks every request
with :func:`capgate.verify_notice`, as a receiver in Python would, remembering the
ids it has seen; it answers a replay with 200 (it has handled it) and any other
refusal with 401. Over the life-cycle gateway, with a worker dispatching:

- propose, approve, dispatch: an event for each step (created, approved,
  dispatched, outcome) arrives signed, in ledger order, carrying ids, the tool, the
  digest and the inbox link, never the email's content; the same request sent
  again is refused as a replay, and one with a changed body as badly signed;
- a rejection and a block (the mailbox revoked after the approval) arrive too, the
  block with its reason codes;
- a receiver answering 500, then 200, gets the notice again (two recorded
  attempts); one always answering 500 ends in a failure recorded in the store and
  the ledger, and the notices after it still go;
- a notifier that stops between the receiver's answer and the commit that moves the
  cursor (it froze; its claim lapses) leaves the notice to the next notifier, which
  sends it again with the same event id: the receiver sees a replay, nothing lost.

Every wait is for a condition, bounded by the suite's hang bound; no test measures
a duration.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

import httpx
import pytest

from capgate import NoticeRejected, NoticeSettings, Notifier, verify_notice
from capgate.gateway.errors import NoticeReplayed
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.notices import notifier as notifier_module
from capgate.gateway.service.worker import Worker, WorkerSettings
from capgate.gateway.state.records import NoticeStatus, ProposalRecord
from capgate.gateway.state.store import Store
from tests.integration import lifecycle_support as lifecycle_fixtures
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as store_fixtures
from tests.integration.lifecycle_support import (
    EMAIL,
    MANAGER,
    SECRETS,
    TENANT,
    FileProvider,
    make_gateway,
)
from tests.integration.worker_support import HANG, approve, emails, wait_for

pytestmark = pytest.mark.integration

postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = store_fixtures.store_url
clock = lifecycle_fixtures.clock
store = lifecycle_fixtures.store
provider = lifecycle_fixtures.provider

SECRET: Final = "notice-secret-" + "5f" * 20
SECRET_ENV: Final = "CAPGATE_TEST_NOTICE_SECRET"
QUICK: Final = WorkerSettings(
    poll_seconds=0.1, claim_seconds=5, first_backoff_seconds=0.1, longest_backoff_seconds=1
)
INBOX: Final = "https://capgate.example/inbox"


class Receiver:
    """A webhook receiver on 127.0.0.1 that checks each request with verify_notice.

    ``answers`` are the statuses given to the first correctly signed requests, in
    order (a 5xx is not handled, so its id is forgotten again); ``always`` is the
    status after them. Refusals are kept by code: a replay is answered 200 (the
    event was handled), any other 401."""

    def __init__(self, *, answers: list[int] | None = None, always: int = 200) -> None:
        self.answers = list(answers or [])
        self.always = always
        self.seen: set[str] = set()
        self.accepted: list[dict[str, Any]] = []
        self.refused: list[tuple[str, str | None]] = []
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                status = receiver.receive(dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                del format, args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/capgate"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def receive(self, headers: dict[str, str], body: bytes) -> int:
        with self._changed:
            self.requests.append((headers, body))
            try:
                event = verify_notice(SECRET, headers, body, seen=self.seen)
            except NoticeRejected as refused:
                self.refused.append((refused.code, headers.get("capgate-event-id")))
                self._changed.notify_all()
                return 200 if isinstance(refused, NoticeReplayed) else 401
            status = self.answers.pop(0) if self.answers else self.always
            if status >= 300:
                self.seen.discard(event["id"])  # not handled: it may come again
            else:
                self.accepted.append(event)
            self._changed.notify_all()
            return status

    def types(self, proposal_id: str) -> list[str]:
        with self._changed:
            return [e["type"] for e in self.accepted if e["proposal_id"] == proposal_id]

    def wait(self, check: Callable[[Receiver], bool], what: str) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: check(self), timeout=HANG):
                raise AssertionError(f"timed out waiting for {what}: {self.accepted}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mail(
    lifecycle_catalogue: Catalogue,
    lifecycle_sidecar: PolicySidecar,
    store: Store,
    provider: FileProvider,
) -> Gateway:
    return make_gateway(
        lifecycle_catalogue, lifecycle_sidecar.client, store, provider.tools(),
        lease=timedelta(seconds=2), duplicate_wait=30.0,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def _secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


def settings(receiver: Receiver, **hook: Any) -> NoticeSettings:
    return NoticeSettings.model_validate(
        {
            "inbox_url": INBOX,
            "poll_seconds": 0.1,
            "claim_seconds": hook.pop("claim_seconds", 5),
            "tenants": {
                TENANT: {
                    "url": receiver.url,
                    "secret_env": SECRET_ENV,
                    "first_backoff_seconds": 0.05,
                    "longest_backoff_seconds": 0.2,
                    **hook,
                }
            },
        }
    )


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


def _deliveries(store: Store) -> dict[str, Any]:
    with store.transaction(read_only=True) as tx:
        return {
            d.event_id: (d, [(a.attempt, a.result) for a in tx.notice_attempts(d.event_id)])
            for d in tx.notices(tenant=TENANT)
        }


def _no_content(body: bytes) -> None:
    for value in (*EMAIL.values(), *SECRETS.values()):
        assert str(value).encode() not in body, value


def test_each_step_arrives_signed_and_a_replay_or_a_change_is_refused(
    mail: Gateway, store: Store, receiver: Receiver
) -> None:
    with Notifier(store, settings(receiver)) as notifier, Worker(mail, QUICK):
        [proposal] = emails(mail, 1)
        approve(mail, [proposal])
        steps = ["proposal.created", "proposal.approved", "proposal.dispatched", "proposal.outcome"]
        receiver.wait(lambda r: r.types(proposal.id) == steps, "every step of the email")
    events = [e for e in receiver.accepted if e["proposal_id"] == proposal.id]
    assert [e["ledger_seq"] for e in events] == sorted(e["ledger_seq"] for e in events)
    for event in events:
        assert (event["tenant"], event["tool"], event["operation_id"]) == (
            TENANT, proposal.tool, proposal.operation_id,
        )  # fmt: skip
        assert event["params_digest"] == proposal.params_digest
        assert event["inbox_url"] == f"{INBOX}/proposals/{proposal.id}"
    assert events[1]["by"] == "maria/sales_manager"
    assert events[-1]["outcome"] == "success"
    for headers, body in receiver.requests:
        _no_content(body)
        assert headers["capgate-event"] == json.loads(body)["type"]
    assert receiver.refused == []
    # Every notice is recorded delivered at its first attempt, the cursor past them.
    delivered = _deliveries(store)
    assert {e["id"] for e in events} <= set(delivered)
    for record, attempts in delivered.values():
        assert (record.status, attempts) == (NoticeStatus.DELIVERED, [(1, "http_200")])
    assert store.verify_ledger().ok
    assert notifier.name.startswith("notifier-")

    # An attacker who saw a notice sends it again, unchanged and then changed.
    sent, body = receiver.requests[0]
    headers = {k: v for k, v in sent.items() if k.lower() not in ("content-length", "host")}
    with httpx.Client(trust_env=False) as client:
        again = client.post(receiver.url, content=body, headers=headers)
        changed = client.post(
            receiver.url, content=body.replace(b"proposal.created", b"proposal.approved"),
            headers=headers,
        )  # fmt: skip
    assert (again.status_code, changed.status_code) == (200, 401)
    assert [code for code, _ in receiver.refused] == ["notice_replayed", "notice_signature_invalid"]
    assert len(receiver.accepted) == len(events)


def test_a_rejection_and_a_block_arrive_with_their_reasons(
    mail: Gateway, store: Store, receiver: Receiver
) -> None:
    with Notifier(store, settings(receiver)):
        rejected, blocked = emails(mail, 2)
        mail.review(rejected.id, MANAGER, "rejected")
        approve(mail, [blocked])
        with store.transaction() as tx:  # revoked after the approval: the worker finds out
            tx.set_connection_status(TENANT, "sales_mailbox", ConnectionStatus.REVOKED)
        with Worker(mail, QUICK):
            receiver.wait(lambda r: "proposal.blocked" in r.types(blocked.id), "the block")
        receiver.wait(lambda r: "proposal.rejected" in r.types(rejected.id), "the rejection")
    assert receiver.types(rejected.id) == ["proposal.created", "proposal.rejected"]
    assert receiver.types(blocked.id) == [
        "proposal.created", "proposal.approved", "proposal.blocked",
    ]  # fmt: skip
    [block] = [e for e in receiver.accepted if e["type"] == "proposal.blocked"]
    assert block["reason_codes"] == ["connection_revoked"]


def _created(receiver: Receiver, proposal: ProposalRecord) -> Callable[[Receiver], bool]:
    return lambda r: "proposal.created" in r.types(proposal.id)


def test_a_receiver_that_fails_once_gets_the_notice_again(mail: Gateway, store: Store) -> None:
    receiver = Receiver(answers=[500])
    try:
        with Notifier(store, settings(receiver, events=["proposal.created"])):
            [proposal] = emails(mail, 1)
            receiver.wait(_created(receiver, proposal), "the retried notice")
            # Settled in the store: the commit after the receiver's answer.
            wait_for(
                lambda: any(
                    d.status is NoticeStatus.DELIVERED for d, _ in _deliveries(store).values()
                ),
                "the delivery recorded",
            )
    finally:
        receiver.close()
    [(record, attempts)] = _deliveries(store).values()
    assert (record.status, record.attempts) == (NoticeStatus.DELIVERED, 2)
    assert attempts == [(1, "http_500"), (2, "http_200")]
    first, second = receiver.requests
    assert json.loads(first[1])["id"] == json.loads(second[1])["id"] == record.event_id
    assert first[1] == second[1]  # the same bytes, signed again


def test_a_receiver_that_always_fails_ends_in_a_recorded_failure(
    mail: Gateway, store: Store
) -> None:
    receiver = Receiver(always=500)
    try:
        hook = {"max_attempts": 3, "events": ["proposal.created", "proposal.approved"]}
        with Notifier(store, settings(receiver, **hook)):
            [proposal] = emails(mail, 1)
            approve(mail, [proposal])

            def both_failed() -> bool:
                found = _deliveries(store)
                return len(found) == 2 and all(
                    d.status is NoticeStatus.FAILED for d, _ in found.values()
                )

            wait_for(both_failed, "both notices given up")
    finally:
        receiver.close()
    found = sorted(_deliveries(store).values(), key=lambda pair: pair[0].seq)
    assert [record.event for record, _ in found] == ["proposal.created", "proposal.approved"]
    for _, attempts in found:
        assert attempts == [(1, "http_500"), (2, "http_500"), (3, "http_500")]
    failures = [row for row in store.ledger(proposal_id=proposal.id) if row.kind == "notice"]
    assert [(row.outcome, row.reason_codes) for row in failures] == [
        ("failed", ["http_500"]), ("failed", ["http_500"]),
    ]  # fmt: skip
    assert [row.detail["event_id"] for row in failures] == [r.event_id for r, _ in found]
    assert len(receiver.requests) == 6
    assert store.verify_ledger().ok


def test_a_notice_whose_delivery_was_not_recorded_is_sent_again_with_its_id(
    mail: Gateway, store: Store, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = threading.Event()
    thaw = threading.Event()
    settle = notifier_module.Notifier._settle

    def freeze(self: Notifier, *args: Any, **kwargs: Any) -> None:
        if self.name == "notifier-frozen":  # answered, not yet recorded: it freezes
            frozen.set()
            thaw.wait(HANG)
            raise notifier_module._Stopped
        settle(self, *args, **kwargs)

    monkeypatch.setattr(notifier_module.Notifier, "_settle", freeze)
    quick_claim = settings(receiver, events=["proposal.created"], claim_seconds=0.5)
    first = Notifier(store, quick_claim, name="notifier-frozen")
    first.start()
    try:
        [proposal] = emails(mail, 1)
        assert frozen.wait(HANG)
        [event] = receiver.accepted
        assert _deliveries(store) == {}  # nothing recorded: the cursor has not moved
        # Its claim lapses; the next notifier takes the tenant over and sends it again.
        with Notifier(store, quick_claim, name="notifier-next"):
            receiver.wait(lambda r: ("notice_replayed", event["id"]) in r.refused, "again")

            def recorded() -> bool:
                found = _deliveries(store).get(event["id"])
                return found is not None and found[0].status is NoticeStatus.DELIVERED

            wait_for(recorded, "the second delivery recorded")
    finally:
        thaw.set()
        first.stop()
    assert [json.loads(body)["id"] for _, body in receiver.requests] == [event["id"]] * 2
    assert receiver.accepted == [event]  # handled once: the receiver de-duplicated
    [(record, attempts)] = _deliveries(store).values()
    assert (record.event, record.proposal_id) == ("proposal.created", proposal.id)
    assert attempts == [(1, "http_200")]
