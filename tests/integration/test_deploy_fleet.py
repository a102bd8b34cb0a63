"""Several sidecars on one bundle server: a change published once reaches them all.

Two OPA sidecars (two services) poll the same signed bundle from one bundle server on
127.0.0.1 every 1-2 s, each with a gateway of its own that is never restarted.

- A policy-only change (a new signed bundle, a new revision, the same catalogue)
  reaches both within the polling interval, and each gateway's trace
  (``DecisionEvent.revision``) and ledger (``policy_revision``) show the revision
  change: ``PolicySidecar`` pins an external OPA's catalogue digest, not its revision.
- A catalogue change the gateways did not load fails closed on both (every decision
  carries the digest it was made under), with no tool entered, until the bundle of
  their catalogue is published again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from capgate import DecisionEvent, Gateway, PolicySidecar
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.deploy import Deployment, SignedBundle
from capgate.gateway.opa.policies import default_policies_dir
from capgate.gateway.state import Store, open_store
from tests.hang import ANSWER_TIMEOUT, INNER_HANG_SECONDS
from tests.integration.deploy_support import (
    BundleServer,
    agent_request,
    bundle_server,
    new_deployment,
    policies_with_comment,
    publish,
    sales_gateway,
    sidecar_opa,
    wait_until,
)

pytestmark = pytest.mark.integration


@dataclass
class Service:
    """One service: its sidecar's gateway, store, trace and the tool's entries."""

    sidecar: PolicySidecar
    gateway: Gateway
    store: Store
    entered: list[str]
    events: list[DecisionEvent] = field(default_factory=list)

    def revision_now(self) -> str | None:
        """Ask (compose) and return the revision the trace recorded for it."""
        self.gateway.compose(agent_request())
        return self.events[-1].revision


@dataclass
class Fleet:
    """Two services, the bundle server they poll, the deployment, the first bundle."""

    services: list[Service]
    server: BundleServer
    deployment: Deployment
    token: str
    first: SignedBundle

    def publish(self, catalogue: Catalogue, policies_dir: Path | None = None) -> SignedBundle:
        return publish(
            self.server, self.deployment, catalogue, [self.token], policies_dir=policies_dir
        )


@pytest.fixture
def fleet(tmp_path: Path, sales_catalogue: Catalogue) -> Iterator[Fleet]:
    with bundle_server(tmp_path / "www") as server, ExitStack() as stack:
        deployment, token = new_deployment(tmp_path / "deploy", server)
        first = publish(server, deployment, sales_catalogue, [token])
        services = []
        for name in ("orders", "billing"):
            opa = stack.enter_context(sidecar_opa(deployment.opa_config, tmp_path / f"{name}.log"))
            sidecar = stack.enter_context(
                PolicySidecar(
                    sales_catalogue,
                    opa_url=opa.address,
                    token=token,
                    timeout=ANSWER_TIMEOUT,
                    startup_timeout=INNER_HANG_SECONDS,
                )
            )
            store = open_store(str(tmp_path / f"{name}.db"))
            stack.callback(store.close)
            events: list[DecisionEvent] = []
            gateway, entered = sales_gateway(
                sales_catalogue, sidecar.client, store, observer=events.append
            )
            services.append(Service(sidecar, gateway, store, entered, events))
        yield Fleet(services, server, deployment, token, first)


def test_a_policy_change_published_once_reaches_every_sidecar_live(
    fleet: Fleet, sales_catalogue: Catalogue, tmp_path: Path
):
    services, first = fleet.services, fleet.first
    for service in services:
        assert service.revision_now() == first.revision
        service.gateway.call(agent_request(), "contact.read", {"contact_id": "c-42"})
    other = policies_with_comment(default_policies_dir(), tmp_path / "policies-2", "release 2")
    second = fleet.publish(sales_catalogue, policies_dir=other)
    assert second.revision != first.revision
    for service in services:
        wait_until(lambda s=service: s.revision_now() == second.revision, "the new revision")
    # No gateway was restarted: the same objects answered throughout.
    for service in services:
        service.gateway.call(agent_request(), "contact.read", {"contact_id": "c-42"})
        revisions = [event.revision for event in service.events]
        assert revisions[0] == first.revision
        assert revisions[-1] == second.revision
        ledger = [row.policy_revision for row in service.store.ledger() if row.decision_id]
        assert ledger[0] == first.revision
        assert ledger[-1] == second.revision
        assert service.entered == ["c-42", "c-42"]
        assert service.sidecar.ready()


def test_a_catalogue_change_fails_closed_on_every_gateway_until_it_is_undone(
    fleet: Fleet, sales_catalogue: Catalogue, oracle_catalogue: Catalogue
):
    services, first = fleet.services, fleet.first
    fleet.publish(oracle_catalogue)
    for service in services:
        wait_until(lambda s=service: not s.sidecar.ready(), "the sidecar serves the other one")
        with pytest.raises(PolicyUnavailable, match="made under catalogue"):
            service.gateway.compose(agent_request())
        with pytest.raises(PolicyUnavailable, match="made under catalogue"):
            service.gateway.call(agent_request(), "contact.read", {"contact_id": "c-42"})
        assert service.entered == []
    fleet.publish(sales_catalogue)
    for service in services:
        wait_until(service.sidecar.ready, "the gateway's catalogue is served again")
        assert service.revision_now() == first.revision
        service.gateway.call(agent_request(), "contact.read", {"contact_id": "c-42"})
        assert service.entered == ["c-42"]
