"""docs/deployment.md's Docker Compose example, run exactly as the page says.

In a fresh folder (a symlink to every top-level entry of the checkout but ``.git``,
``.capgate`` and ``build``, as tests/integration/test_docs.py's shell sessions), the
test runs the page's ``deploy init`` and ``bundle`` commands (its first ``sh`` block),
then the lines of the Compose section's first indented block as one bash script: the
engine and the images, ``docker/gateway-init.sh``, ``docker-compose up -d`` and the
demo's MCP client. Then, against the running containers:

- the demo printed the composed set, and the official MCP client with the
  deployment's client token gets exactly the set an embedded OPA composes for that
  binding, before and after the attempted writes;
- ``PUT /v1/policies/...`` and ``PUT /v1/data/...`` to the OPA container are refused
  (401), without a token and with the gateway's own;
- OPA's decision log (``docker-compose logs opa``) is masked and carries the decision
  ids of the gateway's ledger;
- every container becomes healthy (their healthchecks, polled with
  ``docker inspect``); ``docker-compose stop opa`` turns the gateway's ``/readyz`` to
  503 naming opa, ``docker-compose start opa`` back to 200 (each polled, bounded by
  the hang bound);
- no token is in any container's log.

Last, the section's last indented block (``docker-compose down``), and in any case a
``docker-compose down`` of the test's project and a check that no container is left.
Each run has a compose project of its own (``COMPOSE_PROJECT_NAME``); the ports are
the page's, so they must be free.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from capgate import Gateway, ToolRegistry, open_store
from capgate.adapters.fronts.mcp.config import load_config
from capgate.demo import demo_catalogue_dir
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.opa.deploy import opa_run_args
from capgate.gateway.opa.sidecar import PolicySidecar
from tests.conftest import CONTAINER_MARK
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.containers_support import pinned_opa_version
from tests.integration.mcp_server_support import http_session, readyz_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"
SECTION = "## Docker Compose: the worked example"
OPA = "http://127.0.0.1:8181"
MCP = "http://127.0.0.1:8765/mcp"
READYZ = "http://127.0.0.1:8765/readyz"
PORTS = (8181, 8282, 8765)


#: The fields of an OPA decision log event OPA fills with ids and times of its own.
_RANDOM_FIELDS = frozenset({"decision_id", "labels", "req_id", "timestamp", "metrics"})


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def indented_blocks(section: str) -> list[str]:
    """The section's indented code blocks (paragraphs whose every line starts with four
    spaces), without the indentation."""
    blocks = []
    for paragraph in re.split(r"\n\s*\n", section):
        lines = paragraph.strip("\n").splitlines()
        if lines and all(line.startswith("    ") for line in lines):
            blocks.append("\n".join(line[4:] for line in lines) + "\n")
    return blocks


def first_sh_block(text: str) -> str:
    """The page's first ```sh block: ``deploy init`` and ``bundle``."""
    match = re.search(r"^```sh\n(.*?)^```", text, re.M | re.S)
    assert match is not None, f"{DOC.name} has no sh block"
    return match.group(1)


def session_folder(tmp_path: Path) -> Path:
    session = tmp_path / "session"
    session.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".capgate", "build"}:
            (session / entry.name).symlink_to(entry)
    return session


def bash(script: str, cwd: Path, env: dict[str, str], what: str) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,  # the script must end: a hang bound
        check=False,
    )
    assert done.returncode == 0, (
        f"{what} failed (exit {done.returncode}):\n{script}\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def compose_logs(session: Path, env: dict[str, str], *services: str) -> str:
    return bash(
        "docker-compose logs --no-color " + " ".join(services), session, env, "docker-compose logs"
    )


def health_of(session: Path, env: dict[str, str], service: str) -> str:
    """The service's container's health (``starting``, ``healthy``, ``unhealthy``)."""
    container = bash(f"docker-compose ps -q {service}", session, env, "docker-compose ps").strip()
    assert container, f"no container for {service}"
    return bash(
        f"docker inspect --format '{{{{.State.Health.Status}}}}' {container}",
        session,
        env,
        "docker inspect",
    ).strip()


def wait_healthy(session: Path, env: dict[str, str], *services: str) -> None:
    """Poll until every service's container is healthy (a hang bound, not a pace)."""
    deadline = time.monotonic() + INNER_HANG_SECONDS
    for service in services:
        while (status := health_of(session, env, service)) != "healthy":
            assert status in ("starting", "healthy"), f"{service} is {status}"
            if time.monotonic() > deadline:
                pytest.fail(f"{service} did not become healthy: {status}")
            time.sleep(0.5)


def decision_events(logs: str) -> list[dict[str, Any]]:
    events = []
    for line in logs.splitlines():
        _, _, payload = line.partition("| ")
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("msg") == "Decision Log":
            events.append(event)
    return events


def expected_listed(visible: list[str]) -> list[str]:
    """What tools/list shows the binding: the composed set and the server's own tools
    (capgate.proposals.status for every caller), sorted as ``listed`` sorts."""
    return sorted([*visible, "capgate.proposals.status"])


def expected_visible(deploy: Path, tmp_path: Path) -> list[str]:
    """What an embedded OPA composes for the binding, over a copy of the store."""
    config = load_config(deploy / "gateway" / "serve.yaml")
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    copy = tmp_path / "state-copy.db"
    shutil.copyfile(deploy / "gateway" / "state.db", copy)
    store = open_store(str(copy))
    try:
        with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
            gateway = Gateway(catalogue, sidecar.client, ToolRegistry(SalesDesk().tools()), store)
            return sorted(gateway.compose(config.http[0].request).visible)
    finally:
        store.close()


async def _listed(token: str) -> list[str]:
    async with http_session(MCP, token) as client:
        return sorted(tool.name for tool in (await client.list_tools()).tools)


def listed(token: str) -> list[str]:
    return anyio.run(_listed, token)


def test_the_compose_sidecar_runs_exactly_opa_run_args(tmp_path: Path) -> None:
    """The compose file's OPA command is a deployment's sidecar: ``opa_run_args``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPGATE_")}
    # `config` reads the gateway's env_file: an empty one, in a folder of this test.
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "secrets.env").write_text("")
    env["CAPGATE_DEPLOY_DIR"] = str(tmp_path)
    rendered = subprocess.run(
        ["docker-compose", "--file", str(ROOT / "docker-compose.yml"), "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=True,
    ).stdout
    services = yaml.safe_load(rendered)["services"]
    wanted = opa_run_args(config_file=Path("/config/config.yaml"), addr="127.0.0.1:8181")
    assert services["opa"]["command"] == wanted[1:]
    assert services["opa"]["image"] == f"openpolicyagent/opa:{pinned_opa_version()}-static"
    for service in services.values():
        assert service["network_mode"] == "host"
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
        assert service["restart"] == "unless-stopped"
        assert service["healthcheck"]["test"][0] == "CMD"
    # Each starts once what it needs is healthy.
    assert services["opa"]["depends_on"] == {"bundle-server": {"condition": "service_healthy"}}
    assert services["gateway"]["depends_on"] == {"opa": {"condition": "service_healthy"}}
    assert services["opa"]["healthcheck"]["test"][1] == "/opa"  # the image's one program
    assert "/readyz" in services["gateway"]["healthcheck"]["test"][-1]


def test_docker_compose_up_and_the_demo_work_as_the_page_says(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    request.applymarker(CONTAINER_MARK)  # counted in the run's summary
    text = DOC.read_text(encoding="utf-8")
    blocks = indented_blocks(_section(text, SECTION))
    assert len(blocks) >= 2, f"{SECTION}: expected an 'up' and a 'down' block"
    up, down = blocks[0], blocks[-1]
    assert "docker-compose up -d" in up
    assert down.strip() == "docker-compose down"
    taken = [port for port in PORTS if not _free(port)]
    assert not taken, f"the page's ports {taken} are in use on 127.0.0.1: stop what uses them"

    session = session_folder(tmp_path)
    project = f"capgate-test-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPGATE_")}
    env["COMPOSE_PROJECT_NAME"] = project
    # What the page's export line sets, for the cleanup below (which runs even when the
    # page's block failed before reaching that line).
    owner = {"CAPGATE_UID": str(os.getuid()), "CAPGATE_GID": str(os.getgid())}
    deploy = session / "build" / "deploy"
    try:
        bash(first_sh_block(text), session, env, "the page's deploy init and bundle")
        demo = bash(up, session, env, "the page's docker-compose up and demo")

        # The demo's client printed the set an embedded OPA composes for its binding.
        visible = expected_visible(deploy, tmp_path)
        assert visible, "the binding should see some tools"
        lines = demo.splitlines()
        heading = f"tools/list: {len(visible)} tools composed for this client"
        assert heading in lines, demo
        start = lines.index(heading) + 1
        assert [line.strip() for line in lines[start : start + len(visible)]] == visible
        # ... and the page names that set.
        named = re.search(r"\(for the sales agent: ([^)]*)\)", " ".join(text.split()))
        assert named is not None, "the page no longer names the composed tools"
        assert re.findall(r"`([^`]+)`", named.group(1)) == visible
        assert '"contact_id": "c-42"' in demo

        # The official MCP client, with the deployment's client token: the same set.
        client_token = (deploy / "gateway" / "mcp-token").read_text().strip()
        opa_token = (deploy / "gateway" / "opa-token").read_text().strip()
        assert listed(client_token) == expected_listed(visible)

        # The OPA container: healthy with its bundle; writes refused to anyone.
        with httpx.Client(base_url=OPA, trust_env=False, timeout=ANSWER_TIMEOUT) as http:
            assert http.get("/health", params={"bundles": "true"}).status_code == 200
            for headers in ({}, {"Authorization": f"Bearer {opa_token}"}):
                for path, body in (
                    ("/v1/policies/x", b"package x\n\nallow := true\n"),
                    ("/v1/data/x", b'{"x": 1}'),
                    ("/v1/data/capgate/catalogue/meta/digest", b'"sha256:' + b"0" * 64 + b'"'),
                ):
                    answer = http.put(path, content=body, headers=headers)
                    assert answer.status_code == 401, (path, headers.keys(), answer.text)
                    assert answer.json()["code"] == "unauthorized"
        assert listed(client_token) == expected_listed(visible)

        # OPA's decision log: masked, with the decision ids of the gateway's ledger.
        events = decision_events(compose_logs(session, env | owner, "opa"))
        assert events, "OPA logged no decision"
        logged_ids = {event["decision_id"] for event in events}
        for event in events:
            # OPA's own ids are random hex, which may hold a fact's text by chance
            # ("069c-42c8" holds "c-42"): only what the event says of the decision.
            said = {k: v for k, v in event.items() if k not in _RANDOM_FIELDS}
            flat = json.dumps(said)
            for fact in ("sales-bot", "task-compose-1", "c-42", "acme"):
                assert fact not in flat, f"{fact!r} in OPA's decision log: {flat[:500]}"
        store = open_store(str(deploy / "gateway" / "state.db"))
        try:
            ledger_ids = {row.decision_id for row in store.ledger() if row.decision_id}
        finally:
            store.close()
        assert ledger_ids, "the gateway's ledger records no decision"
        assert ledger_ids <= logged_ids

        # Healthy, as `docker-compose ps` shows; the gateway's readiness follows OPA's:
        # OPA stopped, /readyz answers 503 naming it; started again, 200.
        wait_healthy(session, env | owner, "bundle-server", "opa", "gateway")
        with httpx.Client(trust_env=False, timeout=INNER_HANG_SECONDS) as http:
            ready = readyz_until(http, READYZ, 200, "the deployment is up")
            assert ready["checks"]["opa"]["bundle_revision"]
            bash("docker-compose stop opa", session, env | owner, "docker-compose stop opa")
            body = readyz_until(http, READYZ, 503, "OPA stopped")
            assert [name for name, check in body["checks"].items() if not check["ok"]] == ["opa"]
            bash("docker-compose start opa", session, env | owner, "docker-compose start opa")
            body = readyz_until(http, READYZ, 200, "OPA started again")
            assert (
                body["checks"]["opa"]["bundle_revision"]
                == ready["checks"]["opa"]["bundle_revision"]
            )
        wait_healthy(session, env | owner, "opa", "gateway")
        assert "(healthy)" in bash("docker-compose ps", session, env | owner, "docker-compose ps")

        # No token in any container's log.
        everything = compose_logs(session, env | owner)
        for secret in (client_token, opa_token):
            assert secret not in everything

        bash(down, session, env | owner, "the page's docker-compose down")
    finally:
        subprocess.run(
            ["docker-compose", "down", "--remove-orphans", "--timeout", "5"],
            cwd=session,
            env=env | owner,
            capture_output=True,
            timeout=HANG_SECONDS,  # it must end, or the next run finds its containers
            check=False,
        )
    left = subprocess.run(
        ["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=True,
    )
    assert left.stdout.strip() == "", f"containers left behind: {left.stdout}"
