"""Races run in separate OS processes (multiprocessing, "spawn") on one store.

Kept apart from the test modules so a spawned child imports only this and the
store, not pytest's fixtures. Each child opens the store by its URL, waits at a
barrier shared with its siblings, then starts ``attempts`` threads at once, each
making one attempt in its own transaction, and reports how many succeeded.
"""

from __future__ import annotations

import threading
import traceback
from datetime import timedelta
from typing import Any

from capgate.gateway.state import open_store
from capgate.gateway.state.records import LedgerEntry
from capgate.gateway.state.store import Tx
from tests.hang import INNER_HANG_SECONDS

DIGEST = "sha256:" + "ab" * 32


def attempt(tx: Tx, race: str, worker: int, n: int) -> bool:
    """One attempt of ``race`` in ``tx``; True when it won (got what it asked for)."""
    if race == "budget":
        return tx.reserve_budget("acme", None, 1)
    if race == "operation":
        record = tx.insert_operation(
            "acme",
            "op-shared",
            tool="email.send",
            params_digest=DIGEST,
            cost=1,
            task_id=None,
            lease_until=tx.now + timedelta(minutes=1),
        )
        return record is not None
    if race == "review":
        return tx.consume_review("rv-1")
    if race == "ledger":
        tx.append(LedgerEntry(kind="race", detail={"worker": worker, "n": n}))
        return True
    if race == "claim":  # one queued dispatch job, if any is left
        claimed = tx.claim_dispatches(f"w{worker}-{n}", limit=1, claim=timedelta(minutes=1))
        return len(claimed) == 1
    raise ValueError(race)


def run_races(url: str, race: str, worker: int, attempts: int, start: Any, results: Any) -> None:
    """A child process's body: ``attempts`` threads racing after ``start`` (a Barrier)."""
    try:
        store = open_store(url)
    except BaseException:
        results.put((worker, 0, traceback.format_exc()))
        start.abort()
        return
    wins: list[bool] = []
    errors: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(attempts)

    def one(n: int) -> None:
        try:
            go.wait(timeout=INNER_HANG_SECONDS)  # the sibling threads must come
            with store.transaction() as tx:
                won = attempt(tx, race, worker, n)
            with lock:
                wins.append(won)
        except BaseException:
            with lock:
                errors.append(traceback.format_exc())

    try:
        start.wait(timeout=INNER_HANG_SECONDS)  # the sibling processes must come
        threads = [threading.Thread(target=one, args=(n,)) for n in range(attempts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results.put((worker, sum(wins), "\n".join(errors) or None))
    except BaseException:
        results.put((worker, sum(wins), traceback.format_exc()))
    finally:
        store.close()
