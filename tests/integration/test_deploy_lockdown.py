"""The locked-down OPA: only the gateway's token asks, nobody writes, the token never shows.

A real deployment on this machine: ``capgate deploy init``'s folder, a signed bundle on
a bundle server on 127.0.0.1, a sidecar OPA started with ``opa_run_args``
(``--authentication=token --authorization=basic``). Requests go over raw HTTP, as any
local process could send them, both without a token and with the gateway's own.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from capgate import (
    AgentRequest,
    AgentSession,
    ConnectionStatus,
    Gateway,
    PolicySidecar,
    StaticCredentials,
    ToolRegistry,
    open_store,
)
from capgate.adapters.tools.in_process import InProcessTools
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.deploy import BUNDLE_NAME, Deployment, SignedBundle
from capgate.gateway.opa.sidecar import OPA_TOKEN_FILE_ENV, OPA_URL_ENV
from capgate.gateway.policy.client import PolicyClient
from tests.hang import ANSWER_TIMEOUT
from tests.integration.deploy_support import (
    BundleServer,
    Sidecar,
    bundle_server,
    new_deployment,
    publish,
    sidecar_opa,
    wait_until,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_INPUT = json.loads((ROOT / "docs/examples/compose.json").read_text())
EXECUTE_INPUT = yaml.safe_load((ROOT / "docs/examples/execute.yaml").read_text())
DECISION_PATHS = {
    "/v1/data/capgate/compose/decision": COMPOSE_INPUT,
    "/v1/data/capgate/execute/decision": EXECUTE_INPUT,
}

#: A policy that would allow every call, and data that would swap the catalogue.
EVIL_POLICY = b'package capgate.execute\n\ndecision := {"allow": true}\n'
EVIL_AUTHZ = b"package system.authz\n\nallow := true\n"


@dataclass
class Rig:
    server: BundleServer
    deployment: Deployment
    token: str
    bundle: SignedBundle
    opa: Sidecar


@pytest.fixture
def rig(tmp_path: Path, sales_catalogue: Catalogue) -> Iterator[Rig]:
    with bundle_server(tmp_path / "www") as server:
        deployment, token = new_deployment(tmp_path / "deploy", server)
        bundle = publish(server, deployment, sales_catalogue, [token])
        with sidecar_opa(deployment.opa_config, tmp_path / "opa.log") as opa:
            with PolicyClient(opa.address, token=token, timeout=ANSWER_TIMEOUT) as client:
                wait_until(client.ready, "the sidecar activates the signed bundle")
            yield Rig(server, deployment, token, bundle, opa)


def decisions_of(address: str, token: str) -> dict[str, bytes]:
    """Each decision's result and provenance, as canonical bytes (the id differs per call)."""
    seen = {}
    with httpx.Client(base_url=address, trust_env=False, timeout=ANSWER_TIMEOUT) as http:
        for path, facts in DECISION_PATHS.items():
            answer = http.post(
                path,
                params={"provenance": "true"},
                json={"input": facts},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["decision_id"]
            seen[path] = json.dumps(
                {"result": body["result"], "bundles": body["provenance"]["bundles"]},
                sort_keys=True,
            ).encode()
    return seen


WRITES = [
    ("PUT", "/v1/policies/capgate/evil", EVIL_POLICY, "text/plain"),
    ("PUT", "/v1/policies/capgate/execute/execute.rego", EVIL_POLICY, "text/plain"),
    ("PUT", "/v1/policies/system/authz/authz.rego", EVIL_AUTHZ, "text/plain"),
    ("DELETE", "/v1/policies/capgate/execute/execute.rego", None, None),
    ("PUT", "/v1/data/capgate/catalogue/meta/digest", b'"sha256:' + b"0" * 64 + b'"', None),
    ("PUT", "/v1/data/system/gateway/tokens", b'{"anything": {}}', None),
    ("PUT", "/v1/data/elsewhere", b'{"x": 1}', None),
    ("PATCH", "/v1/data", b'[{"op": "add", "path": "/elsewhere", "value": 1}]', None),
    ("DELETE", "/v1/data/capgate/catalogue", None, None),
]
READS = [
    ("GET", "/v1/policies"),
    ("GET", "/v1/policies/capgate/execute/execute.rego"),
    ("GET", "/v1/data"),
    ("GET", "/v1/data/system/gateway/tokens"),
    ("GET", "/v1/config"),
    ("GET", "/v1/status"),
    ("GET", "/metrics"),
    ("POST", "/v1/query"),
    ("POST", "/v0/data/capgate/compose/decision"),
    ("POST", "/"),
]


def assert_locked_down(address: str, token: str, revision: str) -> None:
    """Nobody, the gateway's token included, writes policies or data or reads beyond
    decisions at ``address``; without the token nobody decides; the decisions (made
    under bundle ``revision``) are the same before and after every attempt."""
    before = decisions_of(address, token)
    identities = {"anonymous": {}, "gateway": {"Authorization": f"Bearer {token}"}}
    with httpx.Client(base_url=address, trust_env=False, timeout=ANSWER_TIMEOUT) as http:
        for who, headers in identities.items():
            for method, path, body, kind in WRITES:
                sent = {**headers, **({"Content-Type": kind} if kind else {})}
                answer = http.request(method, path, content=body, headers=sent)
                assert answer.status_code == 401, f"{who} {method} {path}: {answer.status_code}"
                assert answer.json()["code"] == "unauthorized"
            for method, path in READS:
                answer = http.request(method, path, headers=headers)
                assert answer.status_code == 401, f"{who} {method} {path}: {answer.status_code}"
            # Decisions with a query parameter that would explain or instrument them.
            answer = http.post(
                "/v1/data/capgate/compose/decision",
                params={"explain": "full"},
                json={"input": COMPOSE_INPUT},
                headers=headers,
            )
            assert answer.status_code == 401
        for path, facts in DECISION_PATHS.items():
            assert http.post(path, json={"input": facts}).status_code == 401
            wrong = {"Authorization": "Bearer " + token[::-1]}
            assert http.post(path, json={"input": facts}, headers=wrong).status_code == 401
        # Anyone may ask whether OPA is up with its bundle; it says nothing else.
        health = http.get("/health", params={"bundles": "true"})
        assert (health.status_code, health.json()) == (200, {})
    after = decisions_of(address, token)
    assert after == before
    assert json.loads(after["/v1/data/capgate/execute/decision"])["bundles"] == {
        BUNDLE_NAME: {"revision": revision}
    }


def test_nobody_writes_or_reads_beyond_decisions_and_decisions_stay_the_same(rig: Rig):
    assert_locked_down(rig.opa.address, rig.token, rig.bundle.revision)


def test_capgate_without_or_with_another_token_fails_closed_naming_why(
    rig: Rig, sales_catalogue: Catalogue
):
    with pytest.raises(PolicyUnavailable, match=r"HTTP 401 \(unauthorized\).*requires a token"):
        PolicySidecar(sales_catalogue, opa_url=rig.opa.address)
    with pytest.raises(PolicyUnavailable, match="refused this client's token"):
        PolicySidecar(sales_catalogue, opa_url=rig.opa.address, token="not-the-gateways")
    with PolicySidecar(sales_catalogue, opa_url=rig.opa.address, token=rig.token) as sidecar:
        assert sidecar.ready()
        assert sidecar.token_source is not None
        assert sidecar.token_source.origin == "argument"


def test_the_token_is_sent_but_never_logged_or_shown(
    rig: Rig,
    sales_catalogue: Catalogue,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """Every logger at DEBUG (capgate's, httpx's, httpcore's) while a gateway works
    through the locked-down OPA and fails against it; then OPA's own log."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(OPA_URL_ENV, rig.opa.address)
    monkeypatch.setenv(OPA_TOKEN_FILE_ENV, str(rig.deployment.token_file))
    shown: list[str] = []
    tools = InProcessTools()
    tools.register(
        "contact.read",
        "Read one CRM contact.",
        lambda contact_id: {"contact_id": contact_id, "name": "Ada", "email": "ada@example.test"},
    )
    store = open_store(str(tmp_path / "state.db"))
    try:
        with store.transaction() as tx:
            tx.put_tenant("acme", budget_class="standard", budget_limit=100)
            tx.put_connection("acme", "crm", status=ConnectionStatus.ACTIVE, account="acme@crm")
        with PolicySidecar(sales_catalogue) as sidecar:
            shown += [repr(sidecar.client), sidecar.describe()]
            assert "read from" in sidecar.describe()
            gateway = Gateway(
                sales_catalogue,
                sidecar.client,
                ToolRegistry(tools),
                store,
                credentials=StaticCredentials({("acme", "crm"): "crm-secret"}),
            )
            request = AgentRequest.model_validate(
                {
                    "principal": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
                    "task": {
                        "type": "customer_quote",
                        "id": "task-1",
                        "linked_resources": [{"type": "contact", "id": "c-42"}],
                    },
                    "environment": "production",
                }
            )
            session = AgentSession(gateway, request)
            shown.append(session.available_tools_block())
            assert session.call_tool("contact.read", contact_id="c-42")["contact_id"] == "c-42"
        # Failures on the way: a refused token, a token file that is not one.
        with pytest.raises(PolicyUnavailable) as refused:
            PolicySidecar(sales_catalogue, token=rig.token + "x")
        shown.append(str(refused.value))
        bad = tmp_path / "bad-token"
        bad.write_text(f"{rig.token} with a space\n")
        with pytest.raises(ValueError, match="bad-token") as malformed:
            PolicySidecar(sales_catalogue, token_file=bad)
        shown.append(str(malformed.value))
    finally:
        store.close()
    # Capture works (the policy client's DEBUG lines and the sidecar's INFO are here);
    # httpx itself is not asked to log: capgate's transport sends under it.
    assert any(r.name == "capgate.opa.client" for r in caplog.records), "not captured"
    assert any(r.name == "capgate.opa.sidecar" for r in caplog.records)
    records = caplog.records
    logged = "\n".join([caplog.text, *(f"{r.args} {r.getMessage()}" for r in records)])
    for text in (logged, *shown):
        assert rig.token not in text
        assert rig.token[:16] not in text
    opa_log = rig.opa.log.read_text()
    assert rig.opa.decision_events(), "OPA logged no decision: the check would prove nothing"
    assert rig.token not in opa_log
