"""OPA's distributed tracing, as capgate configures it: one block, refused when OPA
would misread it, off unless asked for, in the same form for the embedded OPA's
``--set`` flags, a deployment's config.yaml and ``capgate serve``'s file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from capgate.adapters.fronts.mcp.config import parse_config
from capgate.cli.main import main
from capgate.gateway.errors import ConfigError
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.deploy import init_deployment, opa_config
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.opa.traces import OPATracing

BLOCK = {
    "type": "http",
    "address": "127.0.0.1:4318",
    "encryption": "off",
    "service_name": "opa",
    "sample_percentage": 0,
}


def test_the_block_and_its_flags_say_the_same() -> None:
    tracing = OPATracing("127.0.0.1:4318")
    assert tracing.config() == BLOCK
    flags = tracing.set_flags()
    assert flags[::2] == ["--set"] * len(BLOCK)
    assert flags[1::2] == [f"distributed_tracing.{key}={value}" for key, value in BLOCK.items()]


@pytest.mark.parametrize(
    "address",
    ["http://127.0.0.1:4318", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "a,b:1", "h:1/v1"],
)
def test_an_address_opa_would_misread_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        OPATracing(address)


def test_other_fields_are_checked() -> None:
    assert OPATracing("[::1]:4318", sample_percentage=100).config()["address"] == "[::1]:4318"
    with pytest.raises(ValueError, match="sample_percentage"):
        OPATracing("127.0.0.1:4318", sample_percentage=12.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample_percentage"):
        OPATracing("127.0.0.1:4318", sample_percentage=101)
    with pytest.raises(ValueError, match="service name"):
        OPATracing("127.0.0.1:4318", service_name="a,b")
    with pytest.raises(ValueError, match="encryption"):
        OPATracing("127.0.0.1:4318", encryption="plain")  # type: ignore[arg-type]


def test_a_deployment_traces_only_when_told(tmp_path: Path) -> None:
    public = init_deployment(tmp_path / "d").verification_key.read_bytes()
    url = "https://b.example/x.tar.gz"
    assert "distributed_tracing" not in opa_config(bundle_url=url, verification_key=public)
    config = opa_config(
        bundle_url=url, verification_key=public, tracing=OPATracing("127.0.0.1:4318")
    )
    assert config["distributed_tracing"] == BLOCK
    written = yaml.safe_load((tmp_path / "d" / "opa" / "config.yaml").read_text())
    assert "distributed_tracing" not in written


def test_deploy_init_takes_the_collectors_address(tmp_path: Path) -> None:
    assert main(["deploy", "init", str(tmp_path / "d"), "--otlp-address", "127.0.0.1:4318"]) == 0
    written = yaml.safe_load((tmp_path / "d" / "opa" / "config.yaml").read_text())
    assert written["distributed_tracing"] == BLOCK
    with pytest.raises(SystemExit) as refused:
        main(["deploy", "init", str(tmp_path / "e"), "--otlp-address", "http://x:1"])
    assert refused.value.code == 2
    assert not (tmp_path / "e").exists()


def test_the_serve_file_names_the_embedded_opas_collector() -> None:
    base = "tools: capgate.demo.tools:SalesDesk\n"
    assert parse_config(base).opa_tracing is None
    config = parse_config(base + "opa_tracing:\n  address: 127.0.0.1:4318\n")
    assert config.opa_tracing is not None
    assert config.opa_tracing.tracing() == OPATracing("127.0.0.1:4318")
    with pytest.raises(ConfigError, match="host:port"):
        parse_config(base + "opa_tracing:\n  address: http://127.0.0.1:4318\n")


def test_an_external_opa_is_not_configured_from_here(sales_catalogue: Catalogue) -> None:
    with pytest.raises(ValueError, match="distributed_tracing in that OPA's own configuration"):
        PolicySidecar(
            sales_catalogue,
            opa_url="http://127.0.0.1:9",
            opa_tracing=OPATracing("127.0.0.1:4318"),
        )
