"""A real Prometheus (Debian's package) scrapes a running ``capgate serve --http`` and
answers a PromQL query with the decisions this test caused, by reason code."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from capgate.adapters.fronts.mcp.config import token_digest
from capgate.gateway.catalogue import load_catalogue
from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.mcp_server_support import (
    SALES,
    SALES_BOT,
    http_server,
    http_session,
    seed_store,
    write_config,
)

pytestmark = pytest.mark.integration

AGENT_TOKEN = "agent-token-metrics-5f5f5f"
SCRAPE_TOKEN = "scrape-token-metrics-a1a1a1"
QUERY = 'sum by (reason) (capgate_decisions_total{question="execute"})'


def free_port() -> int:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        return int(held.getsockname()[1])


def prometheus(tmp_path: Path, target: str) -> tuple[subprocess.Popen[bytes], str]:
    executable = shutil.which("prometheus")
    assert executable, "Prometheus is missing: run `make setup-test` (Debian's prometheus)"
    token = tmp_path / "scrape.token"
    token.write_text(SCRAPE_TOKEN)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "capgate",
                        "metrics_path": "/metrics",
                        "authorization": {"type": "Bearer", "credentials_file": str(token)},
                        "static_configs": [{"targets": [target]}],
                    }
                ],
            }
        )
    )
    address = f"127.0.0.1:{free_port()}"
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [executable, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address={address}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, f"http://{address}"


def query(
    http: httpx.Client, url: str, promql: str = QUERY, by: str = "reason"
) -> dict[str, float]:
    try:
        answer = http.get(f"{url}/api/v1/query", params={"query": promql})
    except httpx.TransportError:
        return {}  # not listening yet
    if answer.status_code != 200:
        return {}
    return {r["metric"].get(by, ""): float(r["value"][1]) for r in answer.json()["data"]["result"]}


def test_prometheus_scrapes_the_decisions_by_reason_code(tmp_path: Path):
    store = seed_store(tmp_path / "state.db")
    config = write_config(
        tmp_path / "serve.yaml",
        http={"sales": (AGENT_TOKEN, SALES_BOT)},
        extra={"metrics": {"token_sha256": token_digest(SCRAPE_TOKEN)}},
    )
    with http_server(store, config, tmp_path / "record.jsonl") as server:
        base = server.url.removesuffix("/mcp")
        with httpx.Client(timeout=INNER_HANG_SECONDS) as http:
            assert http.get(f"{base}/metrics").status_code == 401
            wrong = http.get(f"{base}/metrics", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401

            async def calls() -> None:
                with anyio.fail_after(HANG_SECONDS):
                    async with http_session(server.url, AGENT_TOKEN) as client:
                        for contact in ("c-42", "c-77"):
                            assert not (
                                await client.call_tool("contact.read", {"contact_id": contact})
                            ).is_error
                        for _ in range(3):
                            denied = await client.call_tool(
                                "contact.read", {"contact_id": "c-nobody"}
                            )
                            assert denied.is_error

            anyio.run(calls)
            exposed = http.get(
                f"{base}/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}
            ).text
            assert "c-nobody" not in exposed
            assert "c-42" not in exposed
            assert "acme" not in exposed  # no tenant labels

            proc, url = prometheus(tmp_path, base.removeprefix("http://"))
            try:
                expected = {"none": 2.0, "subject_out_of_scope": 3.0}
                seen: dict[str, float] = {}
                deadline = time.monotonic() + HANG_SECONDS
                while seen != expected and time.monotonic() < deadline:
                    assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                    time.sleep(0.5)
                    seen = query(http, url)
                assert seen == expected, (seen, (tmp_path / "prometheus.log").read_text()[-2000:])
                # The same scrape carries the latencies (5 execute steps and 5 OPA
                # round trips: 2 allowed, 3 denied; and the catalogue's fixtures,
                # asked once at start) and OPA's readiness.
                steps = query(
                    http, url, 'sum by (result) (capgate_step_seconds_count{step="execute"})',
                    by="result",
                )  # fmt: skip
                assert steps == {"ok": 2.0, "denied": 3.0}
                exchanges = query(
                    http, url, "sum by (question) (capgate_policy_exchange_seconds_count)",
                    by="question",
                )  # fmt: skip
                fixtures = len(load_catalogue(SALES).fixtures)
                assert exchanges.get("execute") == 5.0 + fixtures, exchanges
                assert query(http, url, "capgate_opa_ready", by="") == {"": 1.0}
                targets: Any = http.get(f"{url}/api/v1/targets").json()
                [target] = targets["data"]["activeTargets"]
                assert target["health"] == "up"
            finally:
                proc.terminate()
                proc.wait(timeout=INNER_HANG_SECONDS)
