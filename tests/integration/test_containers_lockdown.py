"""The locked-down sidecar in a container refuses writes, as the local process does.

The same deployment as tests/integration/test_deploy_lockdown.py (``capgate deploy
init``'s folder, a signed bundle on a bundle server on 127.0.0.1), with the sidecar OPA
started by testcontainers from the locally built OPA image instead of as a local
process: ``--authentication=token --authorization=basic`` and the deployment's
configuration, mounted read-only. Only where OPA runs changes; what it must refuse
does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from capgate import PolicySidecar
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ComposeInput
from capgate.gateway.opa.deploy import SignedBundle, opa_run_args
from capgate.gateway.policy.client import PolicyClient
from tests.conftest import CONTAINER_MARK
from tests.hang import ANSWER_TIMEOUT
from tests.integration.containers_support import OpaContainer, opa_container
from tests.integration.deploy_support import bundle_server, new_deployment, publish, wait_until
from tests.integration.test_deploy_lockdown import COMPOSE_INPUT, assert_locked_down

pytestmark = [pytest.mark.integration, getattr(pytest.mark, CONTAINER_MARK)]


@dataclass
class Rig:
    token: str
    bundle: SignedBundle
    opa: OpaContainer


@pytest.fixture
def rig(tmp_path: Path, sales_catalogue: Catalogue) -> Iterator[Rig]:
    with bundle_server(tmp_path / "www") as server:
        deployment, token = new_deployment(tmp_path / "deploy", server)
        bundle = publish(server, deployment, sales_catalogue, [token])
        config = deployment.opa_config

        def command(addr: str) -> list[str]:
            # Exactly a deployment's sidecar (opa_run_args), but for the binary's path.
            return opa_run_args(config_file=Path("/deploy") / config.name, addr=addr)[1:]

        # Only the configuration folder: no token file and no key reaches the container.
        with opa_container(command, mounts=[(config.parent, "/deploy")], wait="listening") as opa:
            with PolicyClient(opa.address, token=token, timeout=ANSWER_TIMEOUT) as client:
                wait_until(client.ready, "the container activates the signed bundle")
            yield Rig(token, bundle, opa)


def test_a_container_refuses_writes_and_reads_to_anyone_and_decisions_stay(rig: Rig) -> None:
    assert_locked_down(rig.opa.address, rig.token, rig.bundle.revision)
    # OPA says why, in its own log; the token is not in it.
    logs = rig.opa.logs()
    assert "request rejected by administrative policy" in logs or '"resp_status":401' in logs
    assert rig.token not in logs


def test_capgate_fails_closed_without_the_token_and_works_with_it(
    rig: Rig, sales_catalogue: Catalogue
) -> None:
    with pytest.raises(PolicyUnavailable, match=r"HTTP 401 \(unauthorized\)"):
        PolicySidecar(sales_catalogue, opa_url=rig.opa.address)
    with PolicySidecar(sales_catalogue, opa_url=rig.opa.address, token=rig.token) as sidecar:
        assert sidecar.ready()
        decision = sidecar.client.compose(ComposeInput.model_validate(COMPOSE_INPUT))
        assert decision.visible
        assert decision.decision_id
