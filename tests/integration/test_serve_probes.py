"""``/healthz`` and ``/readyz`` of a real ``capgate serve --http`` (127.0.0.1, port 0),
over a real OPA process and a real SQLite store.

- With an operator's OPA (``--opa``): ready with the bundle's revision, the store's
  schema version and the worker running; OPA stopped: 503 naming opa, back to 200
  once it is started again; OPA frozen (SIGSTOP): 503, not a probe that hangs, and
  200 after SIGCONT; the store set to another schema version: 503 naming store.
- With the embedded OPA and ``--no-worker``: the worker is "not configured" and
  passes; the OPA process killed: 503 naming opa.
- Every body holds no address, port, file path, tenant or token; both probes answer
  GET and HEAD only.

Every change of state is waited for by polling, bounded by the hang bound; the
server's readiness timeout is generous (a busy machine is slow, not unready), so a
frozen OPA is caught by the policy client's own deadline.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.bundle import bundle_revision, write_bundle
from capgate.gateway.opa.policies import locate_policies
from capgate.gateway.state import SCHEMA_VERSION
from tests.hang import INNER_HANG_SECONDS
from tests.integration.mcp_server_support import (
    SALES,
    SALES_BOT,
    HttpServer,
    http_server,
    opa_at,
    readyz_until,
    seed_store,
    write_config,
)
from tests.integration.opa_servers import free_port

pytestmark = pytest.mark.integration

TOKEN = f"cg-probe-{secrets.token_urlsafe(24)}"
#: The readiness timeout the servers run with: the most the configuration allows, so
#: that no check of a healthy part fails for a slow machine.
GENEROUS = 60


def served_config(folder: Path) -> Path:
    return write_config(
        folder / "serve.yaml",
        http={"ada": (TOKEN, SALES_BOT)},
        extra={"readiness_timeout_seconds": GENEROUS},
    )


def base_of(server: HttpServer) -> str:
    return server.url.removesuffix("/mcp")


@contextlib.contextmanager
def probe_client(server: HttpServer) -> Iterator[httpx.Client]:
    # Each answer must come (the server bounds its checks): the hang bound, not a pace.
    with httpx.Client(
        base_url=base_of(server), trust_env=False, timeout=INNER_HANG_SECONDS
    ) as client:
        yield client


def assert_discreet(body: object, *secrets_: str) -> None:
    """Nothing in a probe's body says where anything is or who uses it."""
    text = str(body)
    for word in ("127.0.0.1", "http://", "unix://", "/tmp", "acme", "sales-bot", TOKEN):
        assert word not in text, f"{word!r} in a probe's answer: {text}"
    for secret in secrets_:
        assert secret not in text


def set_schema_version(store: str, version: int) -> int:
    with contextlib.closing(sqlite3.connect(store)) as db, db:
        (before,) = db.execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
        db.execute("UPDATE schema_version SET version = ? WHERE id = 1", (version,))
    return int(before)


def test_readyz_follows_an_operators_opa_and_the_store(tmp_path: Path) -> None:
    store = seed_store(tmp_path / "state.db")
    config = served_config(tmp_path)
    bundle = write_bundle(load_catalogue(SALES), tmp_path / "bundle")
    revision = bundle_revision(load_catalogue(SALES), locate_policies().path)
    address = f"http://127.0.0.1:{free_port()}"
    port = address.rsplit(":", 1)[1]
    with contextlib.ExitStack() as first_opa:
        pid = first_opa.enter_context(opa_at(address, bundle, tmp_path / "opa.log"))
        record = tmp_path / "record.jsonl"
        with (
            http_server(store, config, record, extra=("--opa", address)) as server,
            probe_client(server) as client,
        ):
            live = client.get("/healthz")
            assert (live.status_code, live.json()) == (200, {"status": "ok"})
            assert live.headers["cache-control"] == "no-store"
            ready = client.get("/readyz")
            assert ready.status_code == 200, ready.text
            body = ready.json()
            assert body["status"] == "ready"
            assert set(body["checks"]) == {"opa", "store", "worker"}
            assert body["checks"]["opa"]["ok"] is True
            assert body["checks"]["opa"]["bundle_revision"] == revision
            assert body["checks"]["store"] == {
                "ok": True,
                "detail": "answers at the current schema version",
                "schema_version": SCHEMA_VERSION,
            }
            assert body["checks"]["worker"] == {"ok": True, "detail": "running"}
            assert_discreet(body, port)

            # GET and HEAD only, and no token needed (one that is wrong changes nothing).
            assert client.head("/readyz").status_code == 200
            assert client.head("/healthz").status_code == 200
            for path in ("/healthz", "/readyz"):
                for method in ("POST", "PUT", "DELETE"):
                    assert client.request(method, path).status_code == 405
            wrong = client.get("/readyz", headers={"Authorization": "Bearer not-a-token"})
            assert wrong.status_code == 200

            # OPA frozen: the probe still answers, 503 naming opa; thawed: ready again.
            os.kill(pid, signal.SIGSTOP)
            try:
                body = readyz_until(client, "/readyz", 503, "OPA frozen")
            finally:
                os.kill(pid, signal.SIGCONT)
            assert body["status"] == "not_ready"
            assert body["checks"]["opa"]["ok"] is False
            assert body["checks"]["store"]["ok"] is True
            assert_discreet(body, port)
            readyz_until(client, "/readyz", 200, "OPA thawed")

            # OPA stopped: 503 naming opa, and alive all the same; started again: 200.
            first_opa.close()
            body = readyz_until(client, "/readyz", 503, "OPA stopped")
            assert body["checks"]["opa"]["ok"] is False
            assert "bundle_revision" not in body["checks"]["opa"]
            assert [name for name, check in body["checks"].items() if not check["ok"]] == ["opa"]
            assert_discreet(body, port)
            assert client.get("/healthz").status_code == 200
            with opa_at(address, bundle, tmp_path / "opa-again.log"):
                body = readyz_until(client, "/readyz", 200, "OPA started again")
                assert body["checks"]["opa"]["bundle_revision"] == revision

                # The store at another schema version: 503 naming store. A newer one
                # is refused by the store itself; an older one is read and named.
                for version, code in (
                    (SCHEMA_VERSION + 1, "store_version_unsupported"),
                    (SCHEMA_VERSION - 1, None),
                ):
                    current = set_schema_version(store, version)
                    try:
                        body = readyz_until(client, "/readyz", 503, f"store at schema {version}")
                    finally:
                        set_schema_version(store, current)
                    store_check = body["checks"]["store"]
                    assert store_check["ok"] is False, body
                    if code is None:
                        assert store_check["schema_version"] == version, body
                    else:
                        assert code in store_check["detail"], body
                    assert body["checks"]["opa"]["ok"] is True
                    assert_discreet(body, port)
                    readyz_until(client, "/readyz", 200, "store back at its schema")


def embedded_opa_pid(server: HttpServer) -> int:
    """The pid of the serve process's own OPA: its one ``opa`` child."""
    found = []
    for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if Path(f"/proc/{child}/comm").read_text().strip() == "opa":
                found.append(int(child))
    assert len(found) == 1, f"expected one OPA child, found {found}"
    return found[0]


def test_readyz_without_a_worker_and_with_the_embedded_opa_killed(tmp_path: Path) -> None:
    store = seed_store(tmp_path / "state.db")
    config = served_config(tmp_path)
    revision = bundle_revision(load_catalogue(SALES), locate_policies().path)
    with (
        http_server(store, config, tmp_path / "record.jsonl", extra=("--no-worker",)) as server,
        probe_client(server) as client,
    ):
        body = readyz_until(client, "/readyz", 200, "served")
        assert body["checks"]["opa"]["bundle_revision"] == revision
        assert body["checks"]["worker"]["ok"] is True
        assert body["checks"]["worker"]["detail"].startswith("not configured")
        assert_discreet(body)

        os.kill(embedded_opa_pid(server), signal.SIGKILL)
        body = readyz_until(client, "/readyz", 503, "the embedded OPA killed")
        assert [name for name, check in body["checks"].items() if not check["ok"]] == ["opa"]
        assert_discreet(body)
        assert client.get("/healthz").status_code == 200
