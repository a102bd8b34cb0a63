"""``capgate proposals watch``: the proposals now, then each change, until SIGTERM.

The command runs as a real process against a SQLite and a PostgreSQL store; the test
writes proposals and their changes through the store, as the gateway would from
another process, and reads the watch's JSON lines. Every wait is bounded by the
suite's hang bound, never timed.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from capgate.gateway.state import open_store
from capgate.gateway.state.records import ProposalStatus
from tests.hang import HANG_SECONDS
from tests.integration import postgres_server as pg_fixtures
from tests.integration import store_support as fixtures
from tests.integration.store_support import proposal

pytestmark = pytest.mark.integration

# The shared fixtures, bound here so pytest finds them (one server per session).
postgres_server = pg_fixtures.postgres_server
postgres_url = pg_fixtures.postgres_url
store_url = fixtures.store_url

CAPGATE = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "capgate"


class Watch:
    """The running command, its stdout read line by line in a thread."""

    def __init__(self, *argv: str) -> None:
        self.process = subprocess.Popen(
            [str(CAPGATE), "proposals", "watch", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_event(self) -> dict[str, Any]:
        line = self.lines.get(timeout=HANG_SECONDS)
        assert line is not None, self.stop()
        return dict(json.loads(line))

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=HANG_SECONDS)
        self._reader.join(timeout=HANG_SECONDS)
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        err = self.process.stderr.read()
        self.process.stdout.close()
        self.process.stderr.close()
        return code, err


def test_the_watch_prints_what_is_there_then_each_change(store_url):
    now = datetime.now(UTC)
    store = open_store(store_url)
    try:
        with store.transaction() as tx:
            tx.put_tenant("acme", budget_class="standard", budget_limit=None)
            tx.put_tenant("globex", budget_class="standard", budget_limit=None)
            tx.insert_proposal(proposal(now, id="pr-1", operation_id="op-1"))
        watch = Watch("--tenant", "acme", "--interval", "0.1", "--json", "--store", store_url)
        try:
            first = watch.next_event()
            assert (first["event"], first["proposal"]["id"]) == ("now", "pr-1")
            assert first["proposal"]["params"] is None  # content stays out of the stream
            with store.transaction() as tx:
                tx.insert_proposal(proposal(now, id="pr-2", operation_id="op-2"))
                tx.insert_proposal(proposal(now, id="pr-g", tenant="globex", operation_id="op-g"))
            second = watch.next_event()
            assert (second["event"], second["proposal"]["id"]) == ("new", "pr-2")
            with store.transaction() as tx:
                tx.update_proposal("pr-1", status=ProposalStatus.APPROVED, reason_codes=[])
            third = watch.next_event()
            assert (third["event"], third["proposal"]["id"]) == ("approved", "pr-1")
        finally:
            code, err = watch.stop()
        assert code == 0, err
        assert "stopped (SIGTERM)" in err
        assert watch.lines.get(timeout=HANG_SECONDS) is None  # nothing of globex's came
    finally:
        store.close()


def test_the_watch_refuses_bad_input_before_it_watches(tmp_path):
    store_path = tmp_path / "state.db"
    store = open_store(str(store_path))
    store.close()
    for argv, says in (
        (["--interval", "0"], "--interval: '0' is not between 0.1 and 3600"),
        (["--interval", "often"], "--interval: 'often'"),
        (["--tenant", "nobody"], "unknown tenant 'nobody'"),
    ):
        done = subprocess.run(
            [str(CAPGATE), "proposals", "watch", *argv, "--store", str(store_path)],
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,
        )
        assert done.returncode == 2, (argv, done.stderr)
        assert says in done.stderr, done.stderr
