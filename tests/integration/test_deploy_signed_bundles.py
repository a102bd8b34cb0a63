"""Signed bundles, tampering and readiness, against real OPA sidecars polling a bundle
server on 127.0.0.1.

- OPA activates only a bundle that verifies with the deployment's public key: an edited
  policy, a removed signature or another key's signature is refused, and the last good
  bundle keeps serving (same revision, same decisions);
- a sidecar that never had a valid bundle answers nothing, and capgate fails closed
  before any tool is entered;
- capgate waits for readiness (``startup_timeout``) and reports it (``ready()``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from capgate import Dispatcher, PolicySidecar, ToolRegistry
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ComposeInput
from capgate.gateway.opa.deploy import (
    BUNDLE_NAME,
    Deployment,
    SignedBundle,
    generate_signing_key,
    write_signed_bundle,
)
from capgate.gateway.opa.policies import default_policies_dir
from capgate.gateway.opa.sidecar import OPA_STARTUP_TIMEOUT_ENV, OPA_TOKEN_ENV, OPA_URL_ENV
from capgate.gateway.policy.client import PolicyClient
from capgate.gateway.state import open_store
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.deploy_support import (
    BundleServer,
    Sidecar,
    agent_request,
    bundle_server,
    new_deployment,
    policies_with_comment,
    publish,
    sales_gateway,
    sidecar_opa,
    tampered,
    wait_until,
)

pytestmark = pytest.mark.integration

FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
        "task": {"type": "customer_quote", "linked_resources": [{"type": "contact", "id": "c-42"}]},
        "connections": {"crm": "active"},
        "environment": "production",
        "budget_class": "standard",
    }
)


@dataclass
class Rig:
    tmp: Path
    server: BundleServer
    deployment: Deployment
    token: str


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with bundle_server(tmp_path / "www") as server:
        deployment, token = new_deployment(tmp_path / "deploy", server)
        yield Rig(tmp_path, server, deployment, token)


def _revision_served(opa: Sidecar, token: str) -> Callable[[], str | None]:
    def served() -> str | None:
        with PolicyClient(opa.address, token=token, timeout=ANSWER_TIMEOUT) as client:
            try:
                return client.compose(FACTS).bundle_revisions.get(BUNDLE_NAME)
            except PolicyUnavailable:
                return None

    return served


def test_tampered_bundles_are_refused_and_the_last_good_keeps_serving(
    rig: Rig, sales_catalogue: Catalogue
):
    good = publish(rig.server, rig.deployment, sales_catalogue, [rig.token])
    # What a tamperer would like to serve: other policies (so, if it were accepted, another
    # revision), built three ways that must all be refused.
    other = policies_with_comment(default_policies_dir(), rig.tmp / "other-policies", "other")
    rogue_key = rig.tmp / "rogue.key"
    generate_signing_key(rogue_key, rig.tmp / "rogue.pub")
    signed_other_copy = rig.tmp / "signed-other.tar.gz"
    signed_other = write_signed_bundle(
        sales_catalogue,
        signed_other_copy,
        signing_key=rig.deployment.signing_key,
        tokens=[rig.token],
        policies_dir=other,
    )
    rogue_copy = rig.tmp / "rogue.tar.gz"
    rogue = write_signed_bundle(
        sales_catalogue, rogue_copy, signing_key=rogue_key, tokens=[rig.token], policies_dir=other
    )
    assert rogue.revision == signed_other.revision != good.revision
    good_copy = rig.tmp / "good.tar.gz"
    good_copy.write_bytes(rig.server.bundle_path.read_bytes())

    def edit_policy(members: dict[str, bytes]) -> None:
        # The signed good bundle with one policy edited after signing: lock nothing.
        members["system/authz/authz.rego"] = b"package system.authz\n\nallow := true\n"

    def strip_signature(members: dict[str, bytes]) -> None:
        del members[".signatures.json"]

    # Each tampered bundle, and what OPA logs when it refuses it.
    tampers = {
        "edited policy": (
            tampered(good_copy, rig.tmp / "edited.tar.gz", edit_policy),
            "digest mismatch",
        ),
        "removed signature": (
            tampered(signed_other_copy, rig.tmp / "unsigned.tar.gz", strip_signature),
            "bundle missing .signatures.json file",
        ),
        "wrong key": (rogue_copy, "failed to verify JWT signature"),
    }

    with sidecar_opa(rig.deployment.opa_config, rig.tmp / "opa.log") as opa:
        served = _revision_served(opa, rig.token)
        wait_until(lambda: served() == good.revision, "the good bundle is active")
        with PolicyClient(opa.address, token=rig.token, timeout=ANSWER_TIMEOUT) as client:
            before = client.compose(FACTS)
        for kind, (archive, refusal) in tampers.items():
            rig.server.publish_file(archive)
            wait_until(lambda r=refusal: r in opa.log.read_text(), f"OPA refuses the {kind}")
            # Refused, and the good bundle still answers exactly as before.
            with PolicyClient(opa.address, token=rig.token, timeout=ANSWER_TIMEOUT) as client:
                after = client.compose(FACTS)
                assert after.bundle_revisions == {BUNDLE_NAME: good.revision}, kind
                assert after.model_dump(exclude={"decision_id"}) == before.model_dump(
                    exclude={"decision_id"}
                )
                assert client.ready()
            anonymous = PolicyClient(opa.address, timeout=ANSWER_TIMEOUT)
            with anonymous, pytest.raises(PolicyUnavailable, match="401"):
                anonymous.compose(FACTS)  # the edited authz did not take
        assert opa.bundle_failures() >= len(tampers)
        # The control: a bundle signed with the deployment's key is taken at the next poll.
        rig.server.publish_file(signed_other_copy)
        wait_until(lambda: served() == signed_other.revision, "the properly signed bundle")


def test_a_sidecar_that_never_had_a_valid_bundle_answers_nothing(
    rig: Rig, sales_catalogue: Catalogue, tmp_path: Path
):
    """Served only a bundle signed with another key: OPA never activates anything, so
    its authorisation policy is missing and it refuses everything, health included."""
    rogue_key = tmp_path / "rogue.key"
    generate_signing_key(rogue_key, tmp_path / "rogue.pub")
    publish(rig.server, rig.deployment, sales_catalogue, [rig.token], signing_key=rogue_key)
    with sidecar_opa(rig.deployment.opa_config, tmp_path / "opa.log") as opa:
        wait_until(lambda: opa.bundle_failures() >= 2, "OPA refuses the bundle twice")
        with PolicyClient(opa.address, token=rig.token, timeout=ANSWER_TIMEOUT) as client:
            assert not client.ready()
            with pytest.raises(PolicyUnavailable, match=r"HTTP 500 \(internal_error\)"):
                client.compose(FACTS)
            # A gateway built on it anyway (no start-up check) enters no tool.
            store = open_store(str(tmp_path / "state.db"))
            try:
                gateway, entered = sales_gateway(sales_catalogue, client, store)
                with pytest.raises(PolicyUnavailable):
                    gateway.compose(agent_request())
                with pytest.raises(PolicyUnavailable):
                    gateway.call(agent_request(), "contact.read", {"contact_id": "c-42"})
                with pytest.raises(PolicyUnavailable):
                    Dispatcher(sales_catalogue, client, ToolRegistry()).compose(FACTS)
            finally:
                store.close()
            assert entered == []
        with pytest.raises(PolicyUnavailable):
            PolicySidecar(sales_catalogue, opa_url=opa.address, token=rig.token)
        started = time.monotonic()
        with pytest.raises(PolicyUnavailable, match=r"not ready within 1\.5s"):
            PolicySidecar(
                sales_catalogue, opa_url=opa.address, token=rig.token, startup_timeout=1.5
            )
        # Waited its 1.5 s, then gave up ("not ready within 1.5s"); how much later a
        # loaded machine got round to it is no behaviour.
        assert time.monotonic() - started >= 1.5


def test_capgate_waits_for_a_sidecar_started_before_its_bundle_server_serves(
    rig: Rig, sales_catalogue: Catalogue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """OPA starts with nothing to download (404); a gateway starting beside it waits
    (``$CAPGATE_OPA_STARTUP_TIMEOUT``), not ready and denying, until the bundle is
    published and active."""
    with sidecar_opa(rig.deployment.opa_config, tmp_path / "opa.log") as opa:
        monkeypatch.setenv(OPA_URL_ENV, opa.address)
        monkeypatch.setenv(OPA_TOKEN_ENV, rig.token)
        wait_until(lambda: rig.server.requests >= 1, "OPA asks the bundle server")
        with PolicyClient(opa.address, token=rig.token, timeout=ANSWER_TIMEOUT) as client:
            assert not client.ready()
            with pytest.raises(PolicyUnavailable):
                client.compose(FACTS)
        with pytest.raises(PolicyUnavailable, match="not ready"):
            PolicySidecar(sales_catalogue, startup_timeout=0.5)

        # The wait for a bundle that will come: a hang bound, not a pace.
        monkeypatch.setenv(OPA_STARTUP_TIMEOUT_ENV, str(INNER_HANG_SECONDS))
        outcome: dict[str, object] = {}

        def start_gateway() -> None:
            started = time.monotonic()
            try:
                outcome["sidecar"] = PolicySidecar(sales_catalogue)
            except BaseException as exc:  # reported below, in the test's thread
                outcome["error"] = exc
            outcome["waited"] = time.monotonic() - started

        starting = threading.Thread(target=start_gateway)
        starting.start()
        time.sleep(1.5)
        assert starting.is_alive(), f"did not wait: {outcome}"
        bundle: SignedBundle = publish(rig.server, rig.deployment, sales_catalogue, [rig.token])
        starting.join(timeout=HANG_SECONDS)
        assert "error" not in outcome, outcome
        sidecar = outcome["sidecar"]
        assert isinstance(sidecar, PolicySidecar)
        with sidecar:
            # On activation, not at the end of its wait: that only a hang could reach.
            assert 1.5 <= float(str(outcome["waited"])) < INNER_HANG_SECONDS
            assert sidecar.ready()
            decision = sidecar.client.compose(FACTS)
            assert decision.bundle_revisions == {BUNDLE_NAME: bundle.revision}
            assert decision.catalogue_digest == sidecar.expected_digest
