"""What the ``capgate serve`` tests share: a recording tool adapter, a seeded store,
configuration files, and ways to start real servers and connect real clients.

Every server here is a real ``capgate serve`` process (stdio: started by the MCP
SDK's own client; HTTP: started by the test, on 127.0.0.1 port 0) over a real
embedded OPA and a SQLite store in the test's temporary folder; every client is the
official ``mcp`` client (``mcp.client.client.Client``).

:class:`RecordingDesk` is the servers' ``tools`` entry point: the demo's sales desk,
wrapped so that every run is written (name, parameters, the whole ``CallContext``,
the revealed credential) to the JSON-lines file ``$CAPGATE_TEST_RECORD``, so a test
can show what reached the tools; and so that reading contact ``c-slow`` holds its
tool until the test releases it (:func:`release_slow`: a file beside the record, at
most ``SLOW_HOLD_SECONDS``), contact ``c-busy`` ends ``retryable`` (retry after
``RETRY_AFTER_SECONDS``) and contact ``c-lost`` ends ``unknown``. Its descriptions are
deliberately wrong: a server that showed an adapter's description instead of the
catalogue's would be caught.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import httpx2
import yaml
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.auth.middleware.auth_context import get_access_token

from capgate.adapters.fronts.mcp.config import Binding, token_digest
from capgate.adapters.fronts.mcp.desk_tools import desk_tools
from capgate.adapters.tools.in_process import InProcessTools
from capgate.cli.main import main
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.model.outcomes import ToolRetryable, ToolUnknown
from capgate.gateway.opa.binary import find_opa_binary
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.state import open_store
from capgate.gateway.state.records import LedgerEntry
from capgate.gateway.tools.contract import CallContext
from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.opa_servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
CAPGATE = ROOT / ".venv" / "bin" / "capgate"
SALES = demo_catalogue_dir("sales")
RECORD_ENV = "CAPGATE_TEST_RECORD"
#: The longest contact ``c-slow`` holds its tool when nobody releases it: only a bound
#: on a test that forgot to (the tests release it as soon as they have seen enough), so
#: the hang bound: a shorter hold could end while a slow machine is still running the
#: calls that must finish before it.
SLOW_HOLD_SECONDS = HANG_SECONDS
#: The wait contact ``c-busy``'s retryable outcome asks for.
RETRY_AFTER_SECONDS = 30
#: The connection secrets the servers resolve (EnvironmentCredentials).
SECRETS = {
    "CAPGATE_SECRET_ACME__CRM": "crm-secret-7f3a",
    "CAPGATE_SECRET_ACME__SALES_MAILBOX": "mailbox-secret-91c2",
    "CAPGATE_SECRET_ACME__BANK": "bank-secret-c0de",
}
Mode = Literal["legacy", "auto"]
#: The client's era: the 2025-11-25 initialize handshake, or 2026-07-28 (what
#: ``auto`` negotiates with this server).
MODES: list[Mode] = ["legacy", "auto"]


# ------------------------------------------------------------------ the tools


class _Recording:
    """An adapter in front of the desk's InProcessTools that records every run."""

    def __init__(self, inner: InProcessTools, record: Path | None) -> None:
        self._inner = inner
        self._record = record
        self._lock = threading.Lock()

    def names(self) -> Iterable[str]:
        return self._inner.names()

    def has(self, name: str) -> bool:
        return self._inner.has(name)

    def describe(self, name: str) -> str | None:
        return "UPSTREAM DESCRIPTION: must never be shown" if self._inner.has(name) else None

    def run(self, name: str, params: Mapping[str, Any], context: CallContext) -> Mapping[str, Any]:
        if self._record is not None:
            entry = {
                "name": name,
                "params": dict(params),
                "context": {
                    "repr": repr(context),
                    "operation_id": context.operation_id,
                    "idempotency_key": context.idempotency_key,
                    "connection_alias": context.connection_alias,
                    "tenant": context.tenant,
                    "account": context.account,
                    "credential": context.credential.reveal() if context.credential else None,
                },
                "environ": dict(os.environ),
                # What a tool could find in its context: the SDK's auth contextvar,
                # which the worker thread inherits from the HTTP request.
                "access_token": repr(get_access_token()),
            }
            with self._lock, self._record.open("a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")
        if name == "contact.read" and params.get("contact_id") == "c-slow":
            released = _release_file(self._record)
            held_until = time.monotonic() + SLOW_HOLD_SECONDS
            while not (released is not None and released.exists()):
                if time.monotonic() > held_until:
                    break
                time.sleep(0.01)
        if name == "contact.read" and params.get("contact_id") == "c-busy":
            raise ToolRetryable("the CRM is busy", retry_after_seconds=RETRY_AFTER_SECONDS)
        if name == "contact.read" and params.get("contact_id") == "c-lost":
            raise ToolUnknown("the CRM took the request, then its answer was lost")
        return self._inner.run(name, params, context)


def _release_file(record: Path | None) -> Path | None:
    return None if record is None else record.with_name(record.name + ".release")


def hold_slow(record: Path) -> int:
    """Hold the next ``c-slow`` reads of the servers recording to ``record`` until
    :func:`release_slow` (a release left by an earlier test is taken back); returns
    how many have entered so far, for :func:`slow_entered`."""
    released = _release_file(record)
    assert released is not None
    released.unlink(missing_ok=True)
    return _slow_reads(record)


def release_slow(record: Path) -> None:
    """Let every held ``c-slow`` read of the servers recording to ``record`` finish."""
    released = _release_file(record)
    assert released is not None
    released.touch()


def _slow_reads(record: Path) -> int:
    text = record.read_text(encoding="utf-8") if record.exists() else ""
    return text.count('"contact_id": "c-slow"')


async def slow_entered(record: Path, before: int) -> None:
    """Return once one more ``c-slow`` read than ``before`` is inside its tool
    (recorded, so held); the test's own bound stops a wait that never ends."""
    while _slow_reads(record) <= before:
        await anyio.sleep(0.01)


class RecordingDesk:
    """The ``tools`` entry point of the test servers."""

    def __init__(self) -> None:
        self.desk = SalesDesk()
        self.desk.contacts["c-slow"] = {
            "name": "Sloane Slow",
            "email": "slow@example.test",
            "verified": True,
            "consent": True,
        }

    def tools(self) -> _Recording:
        record = os.environ.get(RECORD_ENV)
        return _Recording(self.desk.tools(), Path(record) if record else None)


ENTRY_POINT = "tests.integration.mcp_server_support:RecordingDesk"


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------ the state


def seed_store(path: Path) -> str:
    """A SQLite store with tenant acme and its three active connections."""
    url = str(path)
    assert main(["tenants", "add", "acme", "--budget-class", "unlimited", "--store", url]) == 0
    for alias in ("crm", "sales_mailbox", "bank"):
        assert main(["connections", "add", "acme", alias, "--account", f"{alias}@acme.example",
                     "--store", url]) == 0  # fmt: skip
    return url


def set_connection(store: str, alias: str, action: Literal["revoke", "restore"]) -> None:
    """Revoke or restore through the command line, i.e. through Gateway.revoke_connection."""
    assert main(["connections", action, "acme", alias, "--by", "ops",
                 "--catalogue", str(SALES), "--store", store]) == 0  # fmt: skip


def ledger(store: str) -> list[LedgerEntry]:
    opened = open_store(store)
    try:
        return opened.ledger()
    finally:
        opened.close()


def stdio_state(
    tmp_path: Path, store: str, bindings: Mapping[str, dict[str, Any]]
) -> dict[str, Any]:
    """What a test of several ``--stdio`` sessions on one store needs: the store, a
    configuration per binding name, the record of what ran and the servers' stderr."""
    return {
        "store": store,
        "configs": {
            name: write_config(tmp_path / f"{name}.yaml", stdio=bound)
            for name, bound in bindings.items()
        },
        "record": tmp_path / "record.jsonl",
        "errlog": tmp_path / "stderr.log",
    }


def run_worker(catalogue: Path, store: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """``capgate worker`` on ``catalogue`` and ``store`` in a process of its own, as an
    operator runs it (its logging set-up stays there), with the demo desk's tools:
    for a start that must be refused, so it is waited for (within the hang bound)."""
    config = folder / "worker.yaml"
    config.write_text("tools: capgate.demo.tools.sales_desk:SalesDesk\n", encoding="utf-8")
    config.chmod(0o600)
    return subprocess.run(
        [str(CAPGATE), "worker", "--catalogue", str(catalogue), "--store", store,
         "--config", str(config)],
        env=server_env(folder / "record.jsonl"),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )  # fmt: skip


def linking_catalogue(folder: Path) -> Path:
    """The demo catalogue copied to ``folder``, in which invoice payments work on the
    recorded links and a ``work_order`` role may link invoices (#21)."""
    shutil.copytree(SALES, folder)
    types_path = folder / "task_types.yaml"
    document = yaml.safe_load(types_path.read_text(encoding="utf-8"))
    document["task_types"]["invoice_payment"]["links"] = "recorded"
    types_path.write_text(yaml.safe_dump(document), encoding="utf-8")
    roles_path = folder / "roles.yaml"
    roles = yaml.safe_load(roles_path.read_text(encoding="utf-8"))
    roles["roles"]["work_order"] = {
        "description": "Hands out work: links invoices to the finance agents' tasks.",
        "links": ["invoice"],
    }
    roles_path.write_text(yaml.safe_dump(roles), encoding="utf-8")
    return folder


def work_order(agent: str, task: str, tenant: str = "acme") -> dict[str, Any]:
    """A binding of a work-order agent (of :func:`linking_catalogue`) working in ``task``."""
    return {
        "principal": {"agent": agent, "role": "work_order", "tenant": tenant},
        "task": {"type": "customer_quote", "id": task},
        "environment": "production",
    }


def outcome_facts(result: Any) -> dict[str, Any]:
    """The facts of a ``tools/call`` answer (``_meta["capgate/outcome"]``)."""
    return dict((result.meta or {})["capgate/outcome"])


def bounded(test: Any, seconds: float = HANG_SECONDS) -> None:
    """Run the async ``test``, failing it after ``seconds``: a bound on a hang, never
    a measure of speed."""

    async def run() -> None:
        with anyio.fail_after(seconds):
            await test()

    anyio.run(run)


LINKED = [
    {"type": "contact", "id": "c-42"},
    {"type": "contact", "id": "c-77"},
    {"type": "contact", "id": "c-slow"},
    {"type": "contact", "id": "c-busy"},
    {"type": "contact", "id": "c-lost"},
    {"type": "opportunity", "id": "opp-17"},
    {"type": "invoice", "id": "inv-9"},
]


def listed_names(gateway: Gateway, bound: Binding) -> list[str]:
    """What ``tools/list`` shows a binding: the composed set, sorted, then the server's
    own tools for it (:func:`capgate.adapters.fronts.mcp.desk_tools.desk_tools`)."""
    composed = sorted(gateway.compose(bound.request).visible)
    own = [tool.name for tool in desk_tools(gateway.catalogue, bound.principal)]
    return composed + own


def binding(agent: str, role: str, task: str, task_type: str = "customer_quote") -> dict[str, Any]:
    return {
        "principal": {"agent": agent, "role": role, "tenant": "acme"},
        "task": {"type": task_type, "id": task, "linked_resources": LINKED},
        "environment": "production",
    }


SALES_BOT = binding("sales-bot", "sales", "task-quote-17")
SUPPORT_BOT = binding("support-bot", "support", "task-support-3")
FINANCE_BOT = binding("finance-bot", "finance", "task-pay-9", "invoice_payment")


def write_config(
    path: Path,
    *,
    stdio: dict[str, Any] | None = None,
    http: Mapping[str, tuple[str, dict[str, Any]]] | None = None,
    poll: float = 0.2,
    upstreams: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """A configuration file (0600). ``http`` maps a binding name to (token, binding);
    ``extra``: more top-level sections (``people``, ``inbox``, ...)."""
    document: dict[str, Any] = {"tools": ENTRY_POINT, "list_changed_poll_seconds": poll}
    document.update(extra or {})
    if upstreams is not None:
        document["upstreams"] = upstreams
    if stdio is not None:
        document["stdio"] = stdio
    if http is not None:
        document["http"] = [
            {"name": name, "token_sha256": token_digest(token), **bound}
            for name, (token, bound) in http.items()
        ]
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    path.chmod(0o600)
    return path


# ------------------------------------------------------------------ processes


@contextmanager
def opa_at(address: str, bundle: Path, log: Path) -> Iterator[int]:
    """``opa run`` serving ``bundle`` at exactly ``address`` (``http://127.0.0.1:PORT``),
    as an operator starts, stops and restarts an OPA of their own; yields its pid."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(find_opa_binary()), "run", "--server", "--skip-version-check",
             "--addr", address.removeprefix("http://"), "--bundle", str(bundle)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        assert wait_healthy(address, proc, log), log.read_text()[-2000:]
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def server_env(record: Path) -> dict[str, str]:
    """The server's environment: the checkout importable (for the entry point), the
    connection secrets, the record file; no external OPA."""
    env = {k: v for k, v in os.environ.items() if k not in ("CAPGATE_OPA_URL", "CAPGATE_STORE")}
    env.update(SECRETS)
    env["PYTHONPATH"] = str(ROOT)
    env[RECORD_ENV] = str(record)
    return env


def serve_args(store: str, config: Path, *extra: str) -> list[str]:
    return ["serve", "--catalogue", str(SALES), "--store", store, "--config", str(config), *extra]


@asynccontextmanager
async def stdio_session(
    store: str,
    config: Path,
    record: Path,
    errlog: Path,
    *,
    mode: Mode = "legacy",
    message_handler: Any = None,
    extra: tuple[str, ...] = (),
) -> AsyncIterator[Client]:
    """The official client, starting ``capgate serve --stdio`` as its subprocess."""
    params = StdioServerParameters(
        command=str(CAPGATE),
        args=serve_args(store, config, "--stdio", "--log-level", "debug", *extra),
        env=server_env(record),
        cwd=str(ROOT),
    )
    with errlog.open("a", encoding="utf-8") as err:
        transport = stdio_client(params, errlog=err)
        async with Client(transport, mode=mode, message_handler=message_handler) as client:
            yield client


@dataclass
class HttpServer:
    proc: subprocess.Popen[str]
    url: str
    log: list[str] = field(default_factory=list)

    @property
    def stderr(self) -> str:
        return "".join(self.log)


@contextmanager
def http_server(
    store: str,
    config: Path,
    record: Path,
    *,
    without: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> Iterator[HttpServer]:
    """``capgate serve --http 127.0.0.1:0``, its URL read from its stderr; stopped
    (SIGTERM) and waited for afterwards. ``without``: variables (say, a connection's
    secret) left out of its environment; ``extra``: more arguments (``--opa``, ...)."""
    env = {k: v for k, v in server_env(record).items() if k not in without}
    args = serve_args(store, config, "--http", "127.0.0.1:0", "--log-level", "debug", *extra)
    proc = subprocess.Popen(
        [str(CAPGATE), *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    server = HttpServer(proc, "")
    found = threading.Event()
    ended = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            server.log.append(line)
            match = re.search(r"MCP over HTTP at (http://\S+)", line)
            if match:
                server.url = match.group(1)
                found.set()
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + INNER_HANG_SECONDS
        while not found.wait(0.1) and not ended.is_set() and time.monotonic() < deadline:
            pass
        if not found.is_set():
            raise AssertionError(f"capgate serve --http did not start:\n{server.stderr}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        proc.stderr.close()


def readyz_until(http: httpx.Client, url: str, status: int, what: str) -> dict[str, Any]:
    """Poll ``GET url`` (a server's ``/readyz``) until it answers ``status``; its body
    then. A server that does not answer yet (being started again) is waited for too;
    the whole wait is bounded by the hang bound, never a pace."""
    deadline = time.monotonic() + INNER_HANG_SECONDS
    while True:
        try:
            answer = http.get(url)
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            assert answer.status_code in (200, 503), answer.text
            if answer.status_code == status:
                body: dict[str, Any] = answer.json()
                return body
            last = answer.text
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer {status} ({what}): {last}")
        time.sleep(0.1)


def bearer(token: str | None, **kw: Any) -> httpx2.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    # Each request waits for an answer that must come: the hang bound, not a pace.
    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(INNER_HANG_SECONDS), **kw)


@asynccontextmanager
async def http_session(
    url: str,
    token: str,
    *,
    mode: Mode = "legacy",
    get_stream: anyio.Event | None = None,
    **kw: Any,
) -> AsyncIterator[Client]:
    """The official client over streamable HTTP, with a bearer token. ``get_stream`` is
    set once the server has answered the session's GET stream, the one a handshake
    session's notifications come by: a test that causes one waits for it first (one
    sent before it is open is lost)."""

    async def opened(response: httpx2.Response) -> None:
        if get_stream is not None and response.request.method == "GET" and response.is_success:
            get_stream.set()

    async with (
        bearer(token, event_hooks={"response": [opened]}) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, **kw) as client,
    ):
        yield client


def run_capgate(
    *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``capgate ARGS`` as a process (for exit statuses and stderr)."""
    return subprocess.run(
        [str(CAPGATE), *args],
        cwd=ROOT,
        env=dict(env) if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        # The process must exit; under load even its interpreter's start and exit can
        # take minutes (8 of these run at once): a hang bound, not a pace.
        timeout=INNER_HANG_SECONDS,
        check=False,
    )
