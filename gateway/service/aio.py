"""The gateway for asyncio code: every operation awaited, none blocking the loop.

The gateway, its policy client and its store are synchronous, so
:class:`AsyncGateway` runs each operation in a worker thread of its own pools and
awaits it. There are two pools, as in ``capgate serve``: one for calls and
dispatches, which last as long as their tool does, and one for compose and
reviews, so that slow tools never hold up an agent's question of what it may see.

Cancelling an await does not undo anything. An operation that has not started yet
(its pool was full) is dropped and never runs; one that has started runs to its
end in its thread, with its outcome recorded in the store and the ledger as
always (pass ``operation_id`` to :meth:`AsyncGateway.call` to look it up by that
id; calling again with it returns the recorded outcome). Concurrency is that of
threads: the decisions themselves run in OPA, and the Python around them shares
the interpreter, so two agents on one event loop go about as fast as two agents
in two threads (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import TracebackType
from typing import Any, Final, TypeVar

from capgate.gateway.model.decisions import ComposeDecision
from capgate.gateway.model.facts import Reviewer
from capgate.gateway.model.outcomes import Outcome
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.state.records import ProposalRecord, ReviewRecord, ReviewVerdict

__all__ = ["DEFAULT_MAX_CALLS", "DEFAULT_MAX_DECISIONS", "AsyncGateway"]

#: Calls and dispatches running at once, each holding a thread while its tool runs.
DEFAULT_MAX_CALLS: Final = 16
#: Compose questions and reviews answered at once.
DEFAULT_MAX_DECISIONS: Final = 8

_T = TypeVar("_T")


class AsyncGateway:
    """A :class:`~capgate.gateway.service.gateway.Gateway` to await, from one event loop.

    Each method takes the arguments of the gateway's own and raises its errors.
    Use it as an async context manager, or call :meth:`close`: closing drops the
    operations still waiting for a thread and lets running ones finish. The
    wrapped gateway stays usable directly.
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        max_calls: int = DEFAULT_MAX_CALLS,
        max_decisions: int = DEFAULT_MAX_DECISIONS,
    ) -> None:
        if not isinstance(gateway, Gateway):
            raise TypeError(f"AsyncGateway wraps a Gateway, not a {type(gateway).__name__}")
        for name, value in (("max_calls", max_calls), ("max_decisions", max_decisions)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of threads, 1 or more")
        self.gateway = gateway
        self._closed = False
        self._calls = ThreadPoolExecutor(max_calls, thread_name_prefix="capgate-call")
        self._decisions = ThreadPoolExecutor(max_decisions, thread_name_prefix="capgate-decide")

    async def compose(self, request: AgentRequest, *, reasons: bool = False) -> ComposeDecision:
        """:meth:`Gateway.compose`, awaited."""
        return await self._run(self._decisions, self.gateway.compose, request, reasons=reasons)

    async def call(
        self,
        request: AgentRequest,
        tool: str,
        params: dict[str, Any],
        *,
        operation_id: str | None = None,
    ) -> Outcome | ProposalRecord:
        """:meth:`Gateway.call`, awaited: an Outcome, or the pending ProposalRecord."""
        return await self._run(
            self._calls, self.gateway.call, request, tool, params, operation_id=operation_id
        )

    async def review(
        self,
        proposal_id: str,
        reviewer: Reviewer,
        verdict: ReviewVerdict | str,
        *,
        ttl: timedelta | None = None,
        comment: str | None = None,
    ) -> ReviewRecord:
        """:meth:`Gateway.review`, awaited."""
        return await self._run(
            self._decisions,
            self.gateway.review,
            proposal_id,
            reviewer,
            verdict,
            ttl=ttl,
            comment=comment,
        )

    async def dispatch(self, proposal_id: str) -> Outcome:
        """:meth:`Gateway.dispatch`, awaited."""
        return await self._run(self._calls, self.gateway.dispatch, proposal_id)

    async def _run(
        self, pool: ThreadPoolExecutor, method: Callable[..., _T], *args: Any, **kwargs: Any
    ) -> _T:
        if self._closed:
            raise RuntimeError("this AsyncGateway is closed")
        # The caller's context variables go along, as asyncio.to_thread carries them.
        context = contextvars.copy_context()
        work = functools.partial(context.run, method, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(pool, work)

    def close(self) -> None:
        """Drop the operations still waiting for a thread; running ones finish."""
        self._closed = True
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._decisions.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> AsyncGateway:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
