"""Gateway processes for the life-cycle races and crashes, and the races themselves.

Kept apart from the test modules so a spawned child imports only this, capgate and
:mod:`tests.integration.lifecycle_support`, never pytest's fixtures. Each child is
a whole gateway of its own: it opens the store by URL, starts its own embedded OPA
(:class:`~capgate.gateway.opa.sidecar.PolicySidecar`, from its main thread) and builds a
:class:`~capgate.gateway.service.gateway.Gateway`; the only things it shares with its
siblings and the test are the store and the provider's file.

- :func:`call_race` runs ``threads`` calls of ``meter.tick`` at once in one gateway
  (the test process uses it directly for the one-process races);
- :func:`race_child` is a spawned process's body: a gateway, a barrier shared with
  the siblings, then :func:`call_race`;
- :func:`crash_child` (``python -m tests.integration.lifecycle_children crash ...``)
  dispatches a proposal, or calls a tool, and SIGKILLs its own process at one step
  of the life cycle (:data:`CRASH_STEPS`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import CapabilityViolation
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service import operations
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.operations import Operations
from capgate.gateway.state import open_store
from capgate.gateway.state.records import OperationRecord
from tests.hang import ANSWER_TIMEOUT, INNER_HANG_SECONDS
from tests.integration.lifecycle_support import (
    METER_TASK,
    SALES,
    FileProvider,
    agent_request,
    make_gateway,
)

METER_REQUEST: Final = agent_request(SALES, METER_TASK)
#: What each call of a race came back with: ("outcome", Outcome JSON),
#: ("denied", reason codes) or ("error", a traceback).
Result = tuple[str, str]


def call_race(gateway: Gateway, race: str, worker: int, threads: int) -> list[Result]:
    """``threads`` calls of ``meter.tick`` released together by a barrier.

    ``budget``: each call its own operation; ``duplicate``: one operation id and the
    same parameters for all of them.
    """
    go = threading.Barrier(threads)

    def one(n: int) -> Result:
        if race == "duplicate":
            operation_id, label = "op-duplicate", "the-same"
        else:
            operation_id, label = f"op-{worker}-{n}", f"tick-{worker}-{n}"
        try:
            go.wait(timeout=INNER_HANG_SECONDS)  # the siblings must come: a hang bound
            answer = gateway.call(
                METER_REQUEST, "meter.tick", {"label": label}, operation_id=operation_id
            )
            return ("outcome", answer.model_dump_json())
        except CapabilityViolation as exc:
            return ("denied", ",".join(exc.reason_codes))
        except BaseException:
            return ("error", traceback.format_exc())

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, range(threads)))


def race_child(
    url: str,
    catalogue_dir: str,
    effects: str,
    race: str,
    worker: int,
    threads: int,
    start: Any,
    results: Any,
) -> None:
    """A spawned gateway process: open, start OPA, wait for the siblings, race."""
    try:
        catalogue = load_catalogue(Path(catalogue_dir))
        store = open_store(url)
    except BaseException:
        results.put((worker, [], traceback.format_exc()))
        start.abort()
        return
    try:
        with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
            provider = FileProvider(effects)
            provider.delay = 0.05  # a tool body that takes a while: duplicates overlap
            gateway = make_gateway(catalogue, sidecar.client, store, provider.tools())
            start.wait(timeout=INNER_HANG_SECONDS)  # the sibling processes must come
            results.put((worker, call_race(gateway, race, worker, threads), None))
    except BaseException:
        results.put((worker, [], traceback.format_exc()))
        start.abort()
    finally:
        store.close()


# -- crashes --------------------------------------------------------------------------------

#: Where a crash child kills itself, in life-cycle order.
CRASH_STEPS: Final = (
    "after_decision",  # OPA allowed; nothing recorded yet
    "during_intent",  # inside the claim's transaction, before it commits
    "after_intent",  # the intent (and reservation) committed; the tool not entered
    "before_effect",  # inside the tool, before the provider recorded anything
    "after_effect",  # inside the tool, the provider recorded the effect
    "before_record",  # the tool returned; its outcome not yet recorded
    "after_record",  # the outcome committed
)


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _install_crash(step: str, provider: FileProvider) -> None:
    """Make this process SIGKILL itself at ``step`` (gateway internals, patched here:
    the operation's steps are :class:`capgate.gateway.service.operations.Operations`')."""
    if step == "after_decision":

        def run(self: Operations, *args: Any, **kwargs: Any) -> Any:
            _die()

        Operations.run = run  # type: ignore[method-assign]
    elif step == "during_intent":
        entry = operations.entry

        def entry_or_die(kind: str, *args: Any, **kwargs: Any) -> Any:
            if kind == "intent":  # built just before it is appended and committed
                _die()
            return entry(kind, *args, **kwargs)

        operations.entry = entry_or_die  # type: ignore[assignment]
    elif step == "after_intent":
        claim = Operations._claim

        def claim_then_die(self: Operations, *args: Any, **kwargs: Any) -> Any:
            result = claim(self, *args, **kwargs)
            claimed = result[0] if isinstance(result, tuple) else result
            if isinstance(claimed, OperationRecord):  # this process now runs it
                _die()
            return result

        Operations._claim = claim_then_die  # type: ignore[method-assign]
    elif step == "before_effect":
        provider.before_effect = lambda tool: _die()
    elif step == "after_effect":
        provider.after_effect = lambda tool: _die()
    elif step in ("before_record", "after_record"):
        finish = Operations._finish

        def finish_and_die(self: Operations, *args: Any, **kwargs: Any) -> None:
            if step == "before_record":
                _die()
            finish(self, *args, **kwargs)
            _die()

        Operations._finish = finish_and_die  # type: ignore[method-assign]
    else:
        raise ValueError(step)


def crash_child(spec: dict[str, Any]) -> None:
    """Dispatch ``spec["proposal"]`` or call ``spec["tool"]``, dying at ``spec["step"]``.

    Writes the embedded OPA's pid to ``spec["opa_pid_file"]`` first, so the test can
    check that OPA does not outlive its killed parent. Exits 3 if it was not killed.
    """
    catalogue = load_catalogue(Path(spec["catalogue"]))
    store = open_store(spec["url"])
    provider = FileProvider(spec["effects"])
    with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
        assert sidecar.process is not None
        Path(spec["opa_pid_file"]).write_text(str(sidecar.process.pid))
        gateway = make_gateway(
            catalogue,
            sidecar.client,
            store,
            provider.tools(),
            lease=timedelta(seconds=spec["lease_seconds"]),
        )
        _install_crash(spec["step"], provider)
        if "proposal" in spec:
            answer: Any = gateway.dispatch(spec["proposal"])
        else:
            answer = gateway.call(
                METER_REQUEST, spec["tool"], spec["params"], operation_id=spec["operation_id"]
            )
        print(f"not killed: {answer!r}", flush=True)
    store.close()
    sys.exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] != ["crash"] or len(sys.argv) != 3:
        sys.exit("usage: python -m tests.integration.lifecycle_children crash SPEC_JSON")
    crash_child(json.loads(sys.argv[2]))
