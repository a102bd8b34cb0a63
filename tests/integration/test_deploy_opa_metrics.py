"""OPA's own ``GET /metrics`` in a deployment: refused by default, opened by ``capgate
deploy init --allow-opa-metrics`` and nothing beside it.

A real deployment on this machine, as tests/integration/test_deploy_lockdown.py runs
it: ``deploy init``'s folder, a signed bundle on a bundle server on 127.0.0.1, a
sidecar OPA started with ``opa_run_args``, here with OPA's diagnostic listener on a
second 127.0.0.1 port as well (which serves only ``/health`` and ``/metrics``, and which
OPA guards with the same ``system.authz``). Requests go over plain HTTP, as Prometheus
or any local process would send them, the near misses with ``http.client``, which sends
a path exactly as given (dot segments and escapes included).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.policy.client import PolicyClient
from tests.hang import ANSWER_TIMEOUT
from tests.integration.deploy_support import (
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
DECISION = "/v1/data/capgate/compose/decision"
#: A histogram OPA v1.22.4 keeps of every request it handles (internal/prometheus).
OPA_METRIC = "http_request_duration_seconds"
#: What stays refused to a client without the token when /metrics is open.
STILL_REFUSED = [
    ("POST", "/metrics"),
    ("PUT", "/metrics"),
    ("DELETE", "/metrics"),
    ("GET", "/metrics/alloc_bytes"),
    ("GET", "/metrics?name[]=go_goroutines"),
    ("GET", "//metrics"),
    ("GET", "/metrics/../v1/data"),
    ("GET", "/metrics/%2e%2e/v1/data"),
    ("GET", "/metrics/../v1/data/system/gateway/tokens"),
    ("GET", "/v1/data"),
    ("GET", "/v1/data/system/gateway/tokens"),
    ("GET", "/v1/data/system/gateway/diagnostics"),
    ("GET", "/v1/data/capgate/catalogue/meta/digest"),
    ("GET", "/v1/policies"),
    ("GET", "/v1/config"),
    ("GET", "/v1/status"),
    ("POST", "/v1/query"),
]
#: Paths OPA itself answers before system.authz, whatever the deployment: a trailing
#: slash (decoded) is redirected to the path without it, which is then authorised.
REDIRECTED = ["/metrics/", "/metrics%2F"]


@dataclass
class Rig:
    token: str
    opa: Sidecar
    opa_metrics: bool


def _rig(tmp_path: Path, catalogue: Catalogue, *, allow_opa_metrics: bool) -> Iterator[Rig]:
    with bundle_server(tmp_path / "www") as server:
        deployment, token = new_deployment(
            tmp_path / "deploy", server, allow_opa_metrics=allow_opa_metrics
        )
        bundle = publish(server, deployment, catalogue, [token])
        with sidecar_opa(deployment.opa_config, tmp_path / "opa.log", diagnostic_addr=True) as opa:
            with PolicyClient(opa.address, token=token, timeout=ANSWER_TIMEOUT) as client:
                wait_until(client.ready, "the sidecar activates the signed bundle")
            yield Rig(token, opa, bundle.opa_metrics)


@pytest.fixture
def closed(tmp_path: Path, sales_catalogue: Catalogue) -> Iterator[Rig]:
    yield from _rig(tmp_path, sales_catalogue, allow_opa_metrics=False)


@pytest.fixture
def opened(tmp_path: Path, sales_catalogue: Catalogue) -> Iterator[Rig]:
    yield from _rig(tmp_path, sales_catalogue, allow_opa_metrics=True)


def addresses(rig: Rig) -> list[str]:
    """The sidecar's main address and its diagnostic listener's."""
    assert rig.opa.diagnostic_address is not None
    return [rig.opa.address, rig.opa.diagnostic_address]


def raw(address: str, method: str, path: str, token: str | None = None) -> int:
    """The status OPA answers ``method path``, the path sent byte for byte."""
    return raw_answer(address, method, path, token)[0]


def raw_answer(
    address: str, method: str, path: str, token: str | None = None
) -> tuple[int, str | None, bytes]:
    """OPA's status, Location header and body for ``method path``, sent as given."""
    parts = urlsplit(address)
    assert parts.hostname == "127.0.0.1"
    assert parts.port is not None
    connection = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=ANSWER_TIMEOUT)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connection.request(method, path, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Location"), answer.read()
    finally:
        connection.close()


def decide(address: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=address, trust_env=False, timeout=ANSWER_TIMEOUT) as http:
        answer = http.post(DECISION, json={"input": COMPOSE_INPUT}, headers=headers)
        return answer.status_code


def assert_redirected_not_served(address: str) -> None:
    """OPA's own answers before system.authz, the same open or closed: nothing served."""
    for path in REDIRECTED:
        status, location, body = raw_answer(address, "GET", path)
        assert (status, location) == (301, "/metrics"), (address, path)
        assert OPA_METRIC.encode() not in body
    assert raw(address, "HEAD", "/metrics") == 405, address


def test_by_default_nobody_reads_opas_metrics_on_either_listener(closed: Rig):
    assert closed.opa_metrics is False
    for address in addresses(closed):
        # The diagnostic listener is no way round system.authz: OPA guards it too.
        assert raw(address, "GET", "/metrics") == 401, address
        assert raw(address, "GET", "/metrics", token=closed.token) == 401, address
        assert raw(address, "GET", "/health?bundles") == 200, address
        assert_redirected_not_served(address)
    assert decide(closed.opa.address, closed.token) == 200


def test_allowed_opa_metrics_answer_prometheus_text_and_open_nothing_else(opened: Rig):
    assert opened.opa_metrics is True
    for address in addresses(opened):
        scrapes: list[httpx.Response] = []

        def has_the_metric(address: str = address, scrapes: list[httpx.Response] = scrapes) -> bool:
            """Scrape as Prometheus does (no token); OPA records a request's duration as
            it ends, so the first scrape may come before any is recorded."""
            with httpx.Client(base_url=address, trust_env=False, timeout=ANSWER_TIMEOUT) as http:
                scrapes.append(http.get("/metrics"))
            answer = scrapes[-1]
            assert answer.status_code == 200, (address, answer.text[:500])
            return OPA_METRIC in {f.name for f in text_string_to_metric_families(answer.text)}

        wait_until(has_the_metric, f"{OPA_METRIC} in OPA's /metrics at {address}")
        scraped = scrapes[-1]
        assert scraped.headers["content-type"].startswith("text/plain"), address
        families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
        assert families[OPA_METRIC].type == "histogram"
        assert opened.token not in scraped.text
        for method, path in STILL_REFUSED:
            assert raw(address, method, path) == 401, (address, method, path)
        assert_redirected_not_served(address)
    # Decisions still want the gateway's token, and get an answer with it.
    assert decide(opened.opa.address, None) == 401
    assert decide(opened.opa.address, "Bearer-not-the-gateways") == 401
    assert decide(opened.opa.address, opened.token) == 200
