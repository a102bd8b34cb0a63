"""A deployment on this machine, as docs/deployment.md describes it, for the deploy tests.

- :class:`BundleServer`: a static HTTP server on 127.0.0.1 (Python's http.server in a
  thread) serving one folder, the way any bundle server or CDN would;
- :func:`sidecar_opa`: an OPA sidecar started with :func:`capgate.gateway.opa.deploy.opa_run_args`
  (token authentication, ``system.authz``, the deployment's config), on a free
  127.0.0.1 port, with an empty environment;
- :func:`new_deployment`: ``capgate deploy init`` for a test, polling every 1-2 s.

The container tests can run the same deployment with the OPA and the bundle server in
containers: only where the processes run changes, not these files.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from capgate import (
    AgentRequest,
    ConnectionStatus,
    DecisionEvent,
    Gateway,
    StaticCredentials,
    Store,
    ToolRegistry,
)
from capgate.adapters.tools.in_process import InProcessTools
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.deploy import Deployment, SignedBundle, init_deployment, opa_run_args
from capgate.gateway.opa.deploy import write_signed_bundle as _write_signed_bundle
from capgate.gateway.opa.sidecar import read_token_file
from capgate.gateway.policy.client import PolicyClient
from tests.hang import INNER_HANG_SECONDS
from tests.integration.opa_servers import free_port

#: Where the bundle server serves the bundle, under its root.
RESOURCE = "bundles/capgate.tar.gz"
#: The sidecars' polling in these tests: a new bundle is fetched within 2 s.
POLLING = (1, 2)
#: How long a test waits for something that the polling should bring within 2 s: a
#: hang bound (tests/hang.py), never a pace.
PROPAGATION_SECONDS = INNER_HANG_SECONDS


class _QuietHandler(SimpleHTTPRequestHandler):
    """Serves files; records each request path; logs nothing to stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        seen: list[str] = self.server.seen  # type: ignore[attr-defined]
        seen.append(self.path)


class BundleServer:
    """A static file server on 127.0.0.1:<free port> serving ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._server = ThreadingHTTPServer(
            ("127.0.0.1", 0), partial(_QuietHandler, directory=str(root))
        )
        self._server.seen = []  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def bundle_url(self) -> str:
        return f"{self.url}/{RESOURCE}"

    @property
    def bundle_path(self) -> Path:
        return self.root / RESOURCE

    @property
    def requests(self) -> int:
        """How many requests the server has answered (OPA polls included)."""
        return len(self._server.seen)  # type: ignore[attr-defined]

    def publish_file(self, source: Path) -> None:
        """Serve ``source``'s bytes from now on (atomically: never half a file)."""
        self.bundle_path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.bundle_path.with_name(".publishing.tmp")
        shutil.copyfile(source, staging)
        os.replace(staging, self.bundle_path)

    def withdraw(self) -> None:
        self.bundle_path.unlink(missing_ok=True)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@contextmanager
def bundle_server(root: Path) -> Iterator[BundleServer]:
    server = BundleServer(root)
    try:
        yield server
    finally:
        server.close()


def new_deployment(
    folder: Path, server: BundleServer, *, allow_opa_metrics: bool = False
) -> tuple[Deployment, str]:
    """A deployment folder whose sidecars poll ``server`` every 1-2 s, and its token."""
    made = init_deployment(
        folder,
        bundle_url=server.bundle_url,
        polling=POLLING,
        allow_opa_metrics=allow_opa_metrics,
    )
    return made, read_token_file(made.token_file)


def publish(
    server: BundleServer,
    deployment: Deployment,
    catalogue: Catalogue,
    tokens: list[str],
    *,
    policies_dir: Path | None = None,
    signing_key: Path | None = None,
) -> SignedBundle:
    """Build and sign a bundle straight into the server's folder (renamed into place)."""
    return _write_signed_bundle(
        catalogue,
        server.bundle_path,
        signing_key=signing_key or deployment.signing_key,
        tokens=tokens,
        policies_dir=policies_dir,
    )


@dataclass
class Sidecar:
    """A running sidecar OPA: its address, process and console log."""

    address: str
    proc: subprocess.Popen[bytes]
    log: Path
    #: OPA's diagnostic listener, when it was started with one.
    diagnostic_address: str | None = None

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines

    def decision_events(self) -> list[dict[str, Any]]:
        return [line for line in self.log_lines() if line.get("msg") == "Decision Log"]

    def bundle_failures(self) -> int:
        """How many bundle downloads OPA refused to activate (logged as errors)."""
        messages = (str(line.get("msg", "")) for line in self.log_lines())
        return sum(1 for message in messages if message.startswith("Bundle load failed"))


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def sidecar_opa(config: Path, log: Path, *, diagnostic_addr: bool = False) -> Iterator[Sidecar]:
    """A locked-down OPA as :func:`opa_run_args` runs it, on a free 127.0.0.1 port.

    Returns once OPA listens, not once it is ready: whether it becomes ready is what
    the tests look at. Its environment is empty but for HOME (a test folder).
    With ``diagnostic_addr``, OPA also serves its diagnostic listener (``/health`` and
    ``/metrics`` only) on a second free 127.0.0.1 port, ``Sidecar.diagnostic_address``.
    """
    home = log.parent / f"{log.stem}-home"
    home.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):  # the port can be taken between probe and bind
        port = free_port()
        diagnostic = free_port() if diagnostic_addr else None
        extra = ["--diagnostic-addr", f"127.0.0.1:{diagnostic}"] if diagnostic else []
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*opa_run_args(config_file=config, addr=f"127.0.0.1:{port}"), *extra],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={"HOME": str(home)},
            )
        try:
            # A slow start is no taken port: only a hang ends this wait.
            deadline = time.monotonic() + INNER_HANG_SECONDS
            while proc.poll() is None and time.monotonic() < deadline:
                if _listening(port) and (diagnostic is None or _listening(diagnostic)):
                    diagnostic_address = f"http://127.0.0.1:{diagnostic}" if diagnostic else None
                    yield Sidecar(f"http://127.0.0.1:{port}", proc, log, diagnostic_address)
                    return
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            proc.wait()
    pytest.fail(f"sidecar OPA would not start:\n{log.read_text()[-2000:]}")


def wait_until(
    predicate: Callable[[], bool], what: str, seconds: float = PROPAGATION_SECONDS
) -> float:
    """Poll ``predicate`` until true; return the seconds it took, or fail naming ``what``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > seconds:
            pytest.fail(f"not within {seconds}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def tampered(source: Path, out: Path, edit: Callable[[dict[str, bytes]], None]) -> Path:
    """A copy of the bundle archive ``source`` with its members edited by ``edit``
    (member name to bytes; add, change or delete), written as ``out``."""
    with tarfile.open(source, "r:gz") as archive:
        members: dict[str, bytes] = {}
        for member in archive.getmembers():
            if member.isfile():
                extracted = archive.extractfile(member)
                assert extracted is not None
                with extracted:
                    members[member.name.lstrip("/")] = extracted.read()
    edit(members)
    with tarfile.open(out, "w:gz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            archive.addfile(info, fileobj=io.BytesIO(content))
    return out


def policies_with_comment(source: Path, target: Path, comment: str) -> Path:
    """A copy of the policies folder whose compose policy ends with ``comment``: another
    bundle revision, the same decisions (a policy-only change a publisher might make)."""
    shutil.copytree(source, target)
    compose = target / "capgate" / "compose" / "compose.rego"
    compose.write_text(compose.read_text(encoding="utf-8") + f"\n# {comment}\n", encoding="utf-8")
    return target


def sales_gateway(
    catalogue: Catalogue,
    policy: PolicyClient,
    store: Store,
    *,
    tenant: str = "acme",
    observer: Callable[[DecisionEvent], None] | None = None,
) -> tuple[Gateway, list[str]]:
    """A gateway over the sales catalogue with ``contact.read`` in process, and the
    list of contact ids the tool was entered with (to prove it was, or was not)."""
    entered: list[str] = []

    def read_contact(contact_id: str) -> dict[str, str]:
        entered.append(contact_id)
        return {"contact_id": contact_id, "name": "Ada", "email": "ada@example.test"}

    tools = InProcessTools()
    tools.register("contact.read", "Read one CRM contact.", read_contact)
    with store.transaction() as tx:
        if tx.get_tenant(tenant) is None:
            tx.put_tenant(tenant, budget_class="standard", budget_limit=1000)
            tx.put_connection(tenant, "crm", status=ConnectionStatus.ACTIVE, account="crm")
    gateway = Gateway(
        catalogue,
        policy,
        ToolRegistry(tools),
        store,
        credentials=StaticCredentials({(tenant, "crm"): "crm-secret"}),
        observer=observer,
    )
    return gateway, entered


def agent_request(
    tenant: str = "acme", agent: str = "sales-bot", contact: str = "c-42", task: str = "task-1"
) -> AgentRequest:
    """A sales agent quoting for a customer, linked to one contact."""
    return AgentRequest.model_validate(
        {
            "principal": {"agent": agent, "role": "sales", "tenant": tenant},
            "task": {
                "type": "customer_quote",
                "id": task,
                "linked_resources": [{"type": "contact", "id": contact}],
            },
            "environment": "production",
        }
    )
