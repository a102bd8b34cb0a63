"""Errors that say what to do, against a real OPA: a name the catalogue lacks is warned
about with a did-you-mean on every surface (and nothing decided differs), an
unreachable OPA says where its address came from, and an embedded OPA that dies while
starting is reported as having exited, with its log."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from capgate.adapters.fronts.mcp.desk_tools import DESK_PREFIX
from capgate.cli.commands.common import EXIT_DENIED, EXIT_ERROR, EXIT_OK
from capgate.cli.main import main
from capgate.demo import demo_catalogue_dir
from capgate.gateway.errors import OPAProcessError
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import HANG_SECONDS
from tests.integration.mcp_server_support import (
    SALES_BOT,
    binding,
    http_server,
    http_session,
    seed_store,
    stdio_session,
    write_config,
)
from tests.integration.opa_servers import free_port
from tests.unit.gateway_support import open_seeded_store

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SALES = str(demo_catalogue_dir("sales"))
DID_YOU_MEAN = "role 'salse' is not declared in the catalogue; did you mean 'sales'?"


def _typo(tmp_path: Path, example: str) -> Path:
    """The example input with the role misspelt ``salse``."""
    document = yaml.safe_load((EXAMPLES / example).read_text(encoding="utf-8"))
    document["principal"]["role"] = "salse"
    path = tmp_path / f"typo-{example}"
    text = json.dumps(document) if example.endswith(".json") else yaml.safe_dump(document)
    path.write_text(text, encoding="utf-8")
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args, "--catalogue", SALES])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- a name the catalogue lacks --------------------------------------------------------


def test_eval_warns_about_a_typod_role_and_decides_as_before(tmp_path, capsys):
    code, out, err = _run(capsys, "eval", "compose", str(_typo(tmp_path, "compose.json")))
    assert code == EXIT_OK
    assert "visible: (none)" in out
    assert "role_not_granted" in out
    assert f"capgate: warning: {DID_YOU_MEAN}" in err
    assert "(declared: 'controller', 'finance', 'sales', 'sales_manager', 'support')" in err
    assert DID_YOU_MEAN not in out  # the decision on stdout stays as it was

    code, out, err = _run(capsys, "eval", "execute", str(_typo(tmp_path, "execute.yaml")))
    assert code == EXIT_DENIED
    assert "allow: false" in out
    assert DID_YOU_MEAN in err

    code, _, err = _run(capsys, "eval", "compose", str(EXAMPLES / "compose.json"))
    assert code == EXIT_OK
    assert "warning" not in err


def test_explain_warns_about_a_typod_role_and_explains_as_before(tmp_path, capsys):
    code, out, err = _run(capsys, "explain", "compose", str(_typo(tmp_path, "compose.json")))
    assert code == EXIT_OK
    assert out.splitlines()[-1] == "visible: 0 of 7 tool(s)"
    assert DID_YOU_MEAN in err

    code, out, err = _run(capsys, "explain", "execute", str(_typo(tmp_path, "execute.yaml")))
    assert code == EXIT_DENIED
    assert "allow: false" in out
    assert DID_YOU_MEAN in err


def test_the_library_logs_each_undeclared_name_once(
    tmp_path: Path,
    sales_catalogue: Catalogue,
    sales_sidecar: PolicySidecar,
    caplog: pytest.LogCaptureFixture,
):
    store = open_seeded_store(tmp_path)
    try:
        gateway = Gateway(sales_catalogue, sales_sidecar.client, ToolRegistry(), store)

        def request(role: str) -> AgentRequest:
            return AgentRequest.model_validate(
                {
                    "principal": {"agent": "bot", "role": role, "tenant": "t"},
                    "task": {"type": "customer_quote", "id": "task-1"},
                    "environment": "production",
                }
            )

        with caplog.at_level(logging.WARNING, logger="capgate"):
            right = gateway.compose(request("sales"))
            decisions = [gateway.compose(request("salse")) for _ in range(3)]
            seen = gateway.visible(request("salse"))
    finally:
        store.close()

    assert right.visible  # the right name sees tools; the typo sees none, as before
    assert all(decision.visible == [] for decision in decisions)
    assert seen == frozenset()
    warned = [r for r in caplog.records if r.name.startswith("capgate") and "salse" in r.message]
    assert len(warned) == 1
    assert warned[0].levelno == logging.WARNING
    assert warned[0].name == "capgate.catalogue"
    assert DID_YOU_MEAN in warned[0].getMessage()


def test_serve_warns_at_start_up_about_a_typod_binding(tmp_path: Path):
    store = seed_store(tmp_path / "state.db")
    config = write_config(tmp_path / "typo.yaml", stdio=binding("sales-bot", "salse", "task-1"))
    errlog = tmp_path / "stderr.log"

    async def listed() -> list[str]:
        with anyio.fail_after(HANG_SECONDS):
            async with stdio_session(store, config, tmp_path / "record.jsonl", errlog) as client:
                return [tool.name for tool in (await client.list_tools()).tools]

    names: list[Any] = anyio.run(listed)
    assert [name for name in names if not name.startswith(DESK_PREFIX)] == []
    err = errlog.read_text(encoding="utf-8")
    assert f"capgate: warning: {config}: binding 'stdio': {DID_YOU_MEAN}" in err


def test_serve_http_warns_about_the_typod_binding_by_its_name(tmp_path: Path):
    store = seed_store(tmp_path / "state.db")
    token = "agent-token-typo-7a7a7a"
    config = write_config(
        tmp_path / "typo.yaml",
        http={
            "good": ("agent-token-good-8b8b8b", SALES_BOT),
            "typo": (token, binding("sales-bot", "salse", "task-1")),
        },
    )

    async def listed(url: str) -> list[str]:
        with anyio.fail_after(HANG_SECONDS):
            async with http_session(url, token) as client:
                return [tool.name for tool in (await client.list_tools()).tools]

    with http_server(store, config, tmp_path / "record.jsonl") as server:
        names: list[Any] = anyio.run(listed, server.url)
        err = server.stderr
    assert [name for name in names if not name.startswith(DESK_PREFIX)] == []
    assert f"capgate: warning: {config}: binding 'typo': {DID_YOU_MEAN}" in err
    assert "binding 'good'" not in err  # a declared role is not warned about


# -- an OPA that cannot be reached, or does not start -----------------------------------


def test_an_unreachable_opa_from_the_environment_names_the_variable_and_doctor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    address = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv(OPA_URL_ENV, address)

    code, _, err = _run(capsys, "eval", "compose", str(EXAMPLES / "compose.json"))

    assert code == EXIT_ERROR
    assert f"OPA at {address} (from ${OPA_URL_ENV}) is unreachable" in err
    assert "`capgate doctor`" in err
    # Where the address came from first; the policy path asked only at the end.
    assert err.index("$CAPGATE_OPA_URL") < err.index("capgate/catalogue/meta/digest")

    code, _, err = _run(capsys, "eval", "compose", str(EXAMPLES / "compose.json"), "--opa", address)
    assert code == EXIT_ERROR
    assert f"OPA at {address} (given with --opa) is unreachable" in err
    assert f"`capgate doctor --opa {address}`" in err


def _fake_opa(tmp_path: Path, body: str) -> Path:
    """A program that passes capgate's version check, then does ``body``."""
    fake = tmp_path / "fake-opa"
    fake.write_text(
        "#!/bin/sh\n[ \"$1\" = version ] && echo 'Version: 1.22.4' && exit 0\n" + body,
        encoding="utf-8",
    )
    fake.chmod(0o755)
    return fake


def test_an_embedded_opa_that_exits_at_once_is_reported_as_exited(
    tmp_path: Path, sales_catalogue: Catalogue
):
    fake = _fake_opa(
        tmp_path, "echo 'Error: unknown flag: --optimize-store-for-read-speed'\nexit 1\n"
    )

    with pytest.raises(OPAProcessError) as info:
        PolicySidecar(sales_catalogue, opa_binary=fake, startup_timeout=HANG_SECONDS)

    message = str(info.value)
    assert "OPA exited with status 1 while starting" in message
    assert "unknown flag" in message
    assert "no bundle" not in message


def test_a_real_opa_refusing_its_bundle_is_reported_as_exited(tmp_path: Path):
    from capgate.gateway.opa.process import EmbeddedOPA

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / ".manifest").write_text("{ not json", encoding="utf-8")

    with pytest.raises(OPAProcessError) as info:
        EmbeddedOPA(bundle, startup_timeout=HANG_SECONDS).start()

    assert "OPA exited with status" in str(info.value)
    assert "no bundle" not in str(info.value)


def test_a_start_up_timeout_says_the_last_thing_that_went_wrong(
    tmp_path: Path, sales_catalogue: Catalogue
):
    fake = _fake_opa(tmp_path, "echo 'pretending to be OPA'\nexec sleep 60\n")

    with pytest.raises(OPAProcessError) as info:
        PolicySidecar(sales_catalogue, opa_binary=fake, startup_timeout=0.5)

    message = str(info.value)
    assert "within 0.5s" in message
    assert "the last try: its socket is not there yet (OPA is not listening)" in message
    assert "pretending to be OPA" in message
