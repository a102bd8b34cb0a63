"""AsyncGateway against a real OPA and a real SQLite store.

The same answers and errors as the Gateway it wraps; calls that overlap instead of
queueing, with the event loop free meanwhile; and cancellation that never undoes
anything: a call that started runs to its end and is recorded, one still waiting
for a thread never runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from capgate import AsyncGateway, CapabilityViolation, Gateway, OutcomeStatus
from capgate.adapters.tools.in_process import InProcessTools
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.state import open_store
from capgate.gateway.state.store import Store
from tests.hang import HANG_SECONDS
from tests.integration.lifecycle_support import (
    FINANCE,
    QUOTE_TASK,
    SALES,
    agent_request,
    make_gateway,
    operation_of,
    seed,
)

pytestmark = pytest.mark.integration

AGENT = agent_request(SALES, QUOTE_TASK)


@dataclass
class Contacts:
    """contact.read that takes ``delay`` seconds, or waits for ``release``."""

    delay: float = 0.0
    release: threading.Event | None = None
    entered: list[str] = field(default_factory=list)
    running: int = 0
    most_at_once: int = 0
    started: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, contact_id: str) -> dict[str, Any]:
        with self._lock:
            self.entered.append(contact_id)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.started.set()
        try:
            if self.release is not None:
                assert self.release.wait(HANG_SECONDS), "the test never released the tool"
            time.sleep(self.delay)
        finally:
            with self._lock:
                self.running -= 1
        return {"contact_id": contact_id, "name": "Ada", "email": "ada@example.test"}


@dataclass
class Rig:
    gateway: Gateway
    store: Store
    contacts: Contacts


@pytest.fixture
def rig(
    lifecycle_catalogue: Catalogue, lifecycle_sidecar: PolicySidecar, tmp_path: Path
) -> Iterator[Rig]:
    store = open_store(str(tmp_path / "state.db"))
    seed(store)
    contacts = Contacts()
    tools = InProcessTools()
    tools.register("contact.read", "Read one CRM contact.", contacts.read)
    gateway = make_gateway(lifecycle_catalogue, lifecycle_sidecar.client, store, tools)
    yield Rig(gateway, store, contacts)
    store.close()


def read(agent: AsyncGateway, contact: str, **kwargs: Any) -> Any:
    return agent.call(AGENT, "contact.read", {"contact_id": contact}, **kwargs)


def test_answers_are_the_gateways(rig: Rig) -> None:
    async def main() -> tuple[Any, Any]:
        async with AsyncGateway(rig.gateway) as agent:
            return await agent.compose(AGENT), await read(agent, "c-42", operation_id="op-a-1")

    composed, outcome = asyncio.run(main())
    assert composed.visible == rig.gateway.compose(AGENT).visible
    assert "contact.read" in composed.visible
    assert isinstance(outcome, Outcome)
    assert outcome.status is OutcomeStatus.SUCCESS
    assert outcome.result == {"contact_id": "c-42", "name": "Ada", "email": "ada@example.test"}
    recorded = operation_of(rig.store, "op-a-1")
    assert recorded is not None
    assert recorded.outcome is not None
    assert recorded.outcome["status"] == "success"


def test_errors_are_the_gateways(rig: Rig) -> None:
    """A tool the agent may not use raises the gateway's own error, tool not entered."""

    async def main() -> None:
        async with AsyncGateway(rig.gateway) as agent:
            await agent.call(
                agent_request(FINANCE, QUOTE_TASK), "contact.read", {"contact_id": "c-42"}
            )

    with pytest.raises(CapabilityViolation):
        asyncio.run(main())
    assert rig.contacts.entered == []


def test_calls_overlap_and_the_loop_stays_free(rig: Rig) -> None:
    """Both calls are inside the tool at once, and only the event loop lets them out:
    had they queued, or had a call blocked the loop, neither would end."""
    release = threading.Event()
    rig.contacts.release = release

    async def let_out_once_both_are_in() -> None:
        try:
            while rig.contacts.running < 2:
                await asyncio.sleep(0.01)
        finally:
            release.set()

    async def main() -> list[Any]:
        async with AsyncGateway(rig.gateway) as agent:
            outcomes = asyncio.gather(read(agent, "c-42"), read(agent, "c-77"))
            # A bound against a hang only, not a measure: both enter at once or never.
            await asyncio.wait_for(let_out_once_both_are_in(), timeout=HANG_SECONDS)
            return list(await outcomes)

    outcomes = asyncio.run(main())
    assert [o.status for o in outcomes] == [OutcomeStatus.SUCCESS] * 2
    assert rig.contacts.most_at_once == 2


def test_cancelling_a_started_call_does_not_undo_it(rig: Rig) -> None:
    """The awaiter is cancelled; the call still runs to its end and is recorded."""
    release = threading.Event()
    rig.contacts.release = release

    async def main() -> None:
        agent = AsyncGateway(rig.gateway)
        task = asyncio.create_task(read(agent, "c-42", operation_id="op-cancel-1"))
        while not rig.contacts.started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        agent.close()

    asyncio.run(main())
    release.set()
    deadline = time.monotonic() + HANG_SECONDS
    while (recorded := operation_of(rig.store, "op-cancel-1")) is None or recorded.outcome is None:
        assert time.monotonic() < deadline, "the started call never finished"
        time.sleep(0.02)
    assert recorded.outcome["status"] == "success"
    assert rig.contacts.entered == ["c-42"]

    async def again() -> Any:
        async with AsyncGateway(rig.gateway) as agent:
            return await read(agent, "c-42", operation_id="op-cancel-1")

    # Asking again under the operation id answers with what was recorded.
    repeated = asyncio.run(again())
    assert repeated.status is OutcomeStatus.SUCCESS
    assert repeated.operation_id == "op-cancel-1"
    assert rig.contacts.entered == ["c-42"], "the tool ran a second time"


def test_a_call_still_waiting_for_a_thread_never_runs_once_cancelled(rig: Rig) -> None:
    release = threading.Event()
    rig.contacts.release = release

    async def main() -> None:
        async with AsyncGateway(rig.gateway, max_calls=1) as agent:
            first = asyncio.create_task(read(agent, "c-42", operation_id="op-first"))
            while not rig.contacts.started.is_set():
                await asyncio.sleep(0.01)
            waiting = asyncio.create_task(read(agent, "c-77", operation_id="op-waiting"))
            await asyncio.sleep(0.1)  # queued behind the first, in the one-thread pool
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            release.set()
            assert (await first).status is OutcomeStatus.SUCCESS
            await asyncio.sleep(0.2)  # time the dropped call would have had to start

    asyncio.run(main())
    assert rig.contacts.entered == ["c-42"]
    assert operation_of(rig.store, "op-waiting") is None


def test_closing_drops_queued_calls_and_lets_running_ones_finish(rig: Rig) -> None:
    release = threading.Event()
    rig.contacts.release = release

    async def main() -> None:
        agent = AsyncGateway(rig.gateway, max_calls=1)
        first = asyncio.create_task(read(agent, "c-42", operation_id="op-running"))
        while not rig.contacts.started.is_set():
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(read(agent, "c-77", operation_id="op-queued"))
        await asyncio.sleep(0.1)
        agent.close()
        release.set()
        assert (await first).status is OutcomeStatus.SUCCESS
        with pytest.raises(asyncio.CancelledError):
            await queued

    asyncio.run(main())
    assert rig.contacts.entered == ["c-42"]
    assert operation_of(rig.store, "op-queued") is None


def test_a_closed_async_gateway_refuses_work(rig: Rig) -> None:
    async def main() -> None:
        agent = AsyncGateway(rig.gateway)
        agent.close()
        await agent.compose(AGENT)

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(main())


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "4"])
def test_pool_sizes_are_checked(rig: Rig, bad: Any) -> None:
    with pytest.raises(ValueError, match="max_calls"):
        AsyncGateway(rig.gateway, max_calls=bad)
    with pytest.raises(ValueError, match="max_decisions"):
        AsyncGateway(rig.gateway, max_decisions=bad)


def test_only_a_gateway_is_wrapped() -> None:
    with pytest.raises(TypeError, match="Gateway"):
        AsyncGateway(object())  # type: ignore[arg-type]
