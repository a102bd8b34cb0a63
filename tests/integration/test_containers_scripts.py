"""The container set-up scripts keep their word, with the engine `make integration` runs.

- ``scripts/docker-engine.sh``: with an engine answering, ``start`` and ``run`` start
  nothing, ``run`` returns its command's status and leaves the engine running, and
  ``stop`` stops only an engine this script started (never one it finds);
- ``scripts/docker-images.sh --check``: every image docker-compose.yml and the
  container tests use is built;
- ``docker/gateway-init.sh``: the gateway's files of a deployment, private, accepted by
  ``capgate serve``'s configuration loader, bound to the token written beside them,
  and never overwritten.

Starting and stopping an engine from cold is what every `make integration` on a fresh
machine does (its log shows it); these tests never stop the engine the run uses.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from capgate.adapters.fronts.mcp.config import load_config, token_digest
from capgate.gateway.opa.deploy import init_deployment
from capgate.gateway.service.credentials import EnvironmentCredentials
from capgate.gateway.state import open_store
from tests.hang import HANG_SECONDS
from tests.integration.containers_support import opa_image, require_engine_and_image

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "scripts" / "docker-engine.sh"
IMAGES = ROOT / "scripts" / "docker-images.sh"
GATEWAY_INIT = ROOT / "docker" / "gateway-init.sh"


def _run(
    args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,  # the script must end: a hang bound
        check=False,
    )


def _engine_id() -> str:
    done = _run(["docker", "info", "--format", "{{.ID}}"])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def engine() -> str:
    """The engine of this run (it must answer), by its id."""
    require_engine_and_image(opa_image())
    return _engine_id()


def test_start_and_run_start_nothing_when_an_engine_answers(engine: str) -> None:
    started = _run(["bash", str(ENGINE), "start"])
    assert started.returncode == 0, started.stderr
    assert "starting dockerd" not in started.stdout
    ran = _run(["bash", str(ENGINE), "run", "bash", "-c", "echo inside; exit 3"])
    assert ran.returncode == 3, ran.stderr
    assert "inside" in ran.stdout
    assert "using the engine that answers" in ran.stdout
    assert "stopping" not in ran.stdout
    assert _run(["bash", str(ENGINE), "status"]).returncode == 0
    assert _engine_id() == engine


def test_stop_leaves_an_engine_it_did_not_start_alone(engine: str, tmp_path: Path) -> None:
    # Another state folder: this script's records say it started nothing.
    stopped = _run(["bash", str(ENGINE), "stop"], env={"CAPGATE_DOCKER_STATE": str(tmp_path)})
    assert stopped.returncode == 0, stopped.stderr
    assert "not started by this script; leaving it alone" in stopped.stdout
    assert _engine_id() == engine


def test_a_wrong_command_is_a_usage_error() -> None:
    for args in (["bogus"], [], ["run"]):
        done = _run(["bash", str(ENGINE), *args])
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "usage:" in done.stderr


def test_every_image_is_built(engine: str) -> None:
    checked = _run(["bash", str(IMAGES), "--check"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count(" present") == 3, checked.stdout


def test_gateway_init_writes_private_files_bound_to_its_token_once(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy"
    init_deployment(deploy)
    done = _run(["bash", str(GATEWAY_INIT), str(deploy)])
    assert done.returncode == 0, done.stdout + done.stderr
    gateway = deploy / "gateway"
    for name in ("mcp-token", "serve.yaml", "secrets.env", "state.db"):
        assert stat.S_IMODE((gateway / name).stat().st_mode) == 0o600, name
    token = (gateway / "mcp-token").read_text().strip()
    assert len(token) >= 43
    config = load_config(gateway / "serve.yaml")
    assert [b.token_sha256 for b in config.http] == [token_digest(token)]
    assert token not in (gateway / "serve.yaml").read_text() + done.stdout
    secrets = dict(
        line.split("=", 1) for line in (gateway / "secrets.env").read_text().splitlines()
    )
    assert set(secrets) == {"CAPGATE_SECRET_ACME__CRM", "CAPGATE_SECRET_ACME__SALES_MAILBOX"}
    assert all(len(value) >= 43 for value in secrets.values())
    # ... the variables the configured resolver reads for the store's connections
    assert config.credentials == "environment"
    store = open_store(str(gateway / "state.db"))
    try:
        with store.transaction(read_only=True) as tx:
            aliases = sorted(tx.connections("acme"))
    finally:
        store.close()
    resolver = EnvironmentCredentials(environ=secrets)
    assert aliases == ["crm", "sales_mailbox"]
    assert {resolver.resolve("acme", alias).reveal() for alias in aliases} == set(secrets.values())
    before = {p.name: p.read_bytes() for p in gateway.iterdir()}
    again = _run(["bash", str(GATEWAY_INIT), str(deploy)])
    assert again.returncode == 2
    assert "never overwritten" in again.stderr
    assert {p.name: p.read_bytes() for p in gateway.iterdir()} == before
