"""Readiness checks (capgate.gateway.service.health) and the probe routes that serve
them (capgate.adapters.fronts.mcp.probes), without OPA: probes are plain functions.

A probe that must answer gets the hang bound as its timeout; one that must not
answer waits on an event the test sets afterwards, so no assertion depends on how
fast the machine is. tests/integration/test_serve_probes.py runs them against real
OPA processes and a real store.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from capgate.adapters.fronts.mcp.probes import probe_routes
from capgate.gateway.model.health import CheckResult
from capgate.gateway.service.health import (
    Readiness,
    public_detail,
    store_check,
    worker_check,
)
from capgate.gateway.state import SCHEMA_VERSION, Store
from tests.hang import INNER_HANG_SECONDS

OK = CheckResult(ok=True, detail="fine", facts={"bundle_revision": "abc"})
BAD = CheckResult(ok=False, detail="OPA at http://127.0.0.1:8181 is unreachable")


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    released = threading.Event()
    yield released
    released.set()  # never leave a probe's thread waiting


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("OPA at http://127.0.0.1:8181 is unreachable", "OPA at <address> is unreachable"),
        ("store postgresql://capgate:pw@db:5432/x failed", "store <address> failed"),
        ("OPA at unix:///tmp/cg-x/opa.sock: [Errno 2]", "OPA at <address> [Errno 2]"),
        ("store /srv/capgate/state.db is locked", "store <path> is locked"),
        ("connect to 10.0.0.7:5432 refused", "connect to <address> refused"),
        ("connect to [::1]:8181 refused", "connect to <address> refused"),
        ("GET /health?bundles did not answer 200", "GET /health?bundles did not answer 200"),
        ("the store is at schema version 6", "the store is at schema version 6"),
    ],
)
def test_public_details_name_no_address_or_path(text: str, shown: str) -> None:
    assert public_detail(text) == shown


def test_every_check_must_pass() -> None:
    report = Readiness(
        {"opa": lambda: OK, "worker": lambda: OK}, timeout=INNER_HANG_SECONDS
    ).check()
    assert report.ready
    assert report.to_json() == {
        "status": "ready",
        "checks": {
            "opa": {"ok": True, "detail": "fine", "bundle_revision": "abc"},
            "worker": {"ok": True, "detail": "fine", "bundle_revision": "abc"},
        },
    }
    report = Readiness(
        {"opa": lambda: BAD, "worker": lambda: OK}, timeout=INNER_HANG_SECONDS
    ).check()
    assert not report.ready
    assert report.to_json()["status"] == "not_ready"
    # What is shown has no address, whatever the check said.
    assert report.checks["opa"].detail == "OPA at <address> is unreachable"


def test_a_check_that_raises_is_not_ready() -> None:
    def broken() -> CheckResult:
        raise RuntimeError("/srv/secret/path")

    report = Readiness({"opa": broken}, timeout=INNER_HANG_SECONDS).check()
    assert report.checks["opa"] == CheckResult(ok=False, detail="the check failed (RuntimeError)")


def test_a_hung_check_answers_not_ready_and_is_not_started_twice(
    gate: threading.Event,
) -> None:
    calls: list[int] = []

    def hung() -> CheckResult:
        calls.append(1)
        gate.wait()
        return OK

    # The timeout is the behaviour under test: the check never answers within it.
    readiness = Readiness({"opa": hung, "store": lambda: OK}, timeout=0.05)
    for _ in range(3):
        report = readiness.check()
        assert report.checks["opa"] == CheckResult(ok=False, detail="no answer within 0.05 s")
        assert not report.ready
    assert calls == [1], "a check still running is waited for again, not started again"
    gate.set()
    deadline = time.monotonic() + INNER_HANG_SECONDS
    while not readiness.check().ready:
        assert time.monotonic() < deadline, "the released check never answered"
        time.sleep(0.01)


def test_changes_of_state_are_logged_once_with_the_whole_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state = {"now": OK}
    readiness = Readiness({"opa": lambda: state["now"]}, timeout=INNER_HANG_SECONDS)
    caplog.set_level(logging.INFO, logger="capgate.service.health")
    readiness.check()
    assert caplog.records == []  # ready from the start: nothing to say
    state["now"] = BAD
    readiness.check()
    readiness.check()
    state["now"] = OK
    readiness.check()
    assert [r.getMessage() for r in caplog.records] == [
        "readiness: opa is not ready: OPA at http://127.0.0.1:8181 is unreachable",
        "readiness: opa is ready again",
    ]


def test_the_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Readiness({}, timeout=0)


def test_the_store_check_names_its_schema_version(store: Store, tmp_path: Path) -> None:
    assert store_check(store) == CheckResult(
        ok=True,
        detail="answers at the current schema version",
        facts={"schema_version": SCHEMA_VERSION},
    )
    with closing(sqlite3.connect(store.location)) as db, db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION - 1,))
    older = store_check(store)
    assert not older.ok
    assert older.facts == {"schema_version": SCHEMA_VERSION - 1}
    assert f"works at {SCHEMA_VERSION}" in older.detail
    store.close()
    closed = store_check(store)
    assert not closed.ok
    assert closed.detail.startswith("the store did not answer (store_error")


def test_no_worker_passes_and_says_so() -> None:
    check = worker_check(None)
    assert check.ok
    assert check.detail.startswith("not configured")


# ------------------------------------------------------------------ the routes


def client_of(readiness: Readiness) -> TestClient:
    return TestClient(Starlette(routes=probe_routes(readiness)), base_url="http://127.0.0.1")


def test_the_routes_answer_get_and_head_only() -> None:
    ready = Readiness({"opa": lambda: OK}, timeout=INNER_HANG_SECONDS)
    unready = Readiness({"opa": lambda: BAD}, timeout=INNER_HANG_SECONDS)
    with client_of(ready) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        answer = client.get("/readyz")
        assert answer.status_code == 200
        assert answer.headers["cache-control"] == "no-store"
        assert answer.json()["checks"]["opa"]["bundle_revision"] == "abc"
        assert client.head("/readyz").status_code == 200
        for path in ("/healthz", "/readyz"):
            assert client.post(path).status_code == 405
            assert client.delete(path).status_code == 405
    with client_of(unready) as client:
        answer = client.get("/readyz")
        assert answer.status_code == 503
        assert answer.json() == {
            "status": "not_ready",
            "checks": {"opa": {"ok": False, "detail": "OPA at <address> is unreachable"}},
        }
        assert client.get("/healthz").status_code == 200  # alive all the same
