"""A real OPA that misbehaves mid-session: capgate fails closed and the tool stays idle.

- OPA frozen with SIGSTOP: calls and composes fail within the client's deadline,
  and after SIGCONT the same dispatcher works again;
- OPA's unix socket removed: nothing that connects afresh reaches a decision;
- an external OPA restarted at the same address with another bundle, in which the
  sales role is granted payment.execute: the next call fails closed on the catalogue
  digest, and the payment tool is never entered. A client pinned to the new
  catalogue gets the payment through, which shows the call was really at stake.

(OPA killed mid-run is tested in test_end_to_end.py and test_policy_client_live.py.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from capgate.adapters.tools.in_process import InProcessTools
from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.digest import params_digest
from capgate.gateway.enforce.dispatcher import Dispatcher
from capgate.gateway.errors import CapabilityViolation, PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import (
    Approval,
    Budget,
    ComposeInput,
    EvidencePiece,
    ProposalRef,
    Stage,
)
from capgate.gateway.opa.binary import find_opa_binary
from capgate.gateway.opa.bundle import bundle_revision, write_bundle
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.policy.client import PolicyClient
from capgate.gateway.tools.registry import ToolRegistry
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS
from tests.integration.opa_servers import Server, external_opa, free_port, wait_healthy

pytestmark = pytest.mark.integration

#: The client's timeout where the deadline is under test: the questions to a frozen
#: OPA, which never answers, so any timeout shows the bound. Everywhere else a test
#: waits for OPA's answer, by ANSWER_TIMEOUT (tests/hang.py).
TIMEOUT = 1.0

PAYMENT = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}

#: A sales agent whose task lists payment.execute (the sales catalogue lists it on
#: purpose), with everything else the payment needs: only the role check stops it.
SALES_FACTS = ComposeInput.model_validate(
    {
        "principal": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
        "task": {
            "type": "customer_quote",
            "linked_resources": [
                {"type": "invoice", "id": "inv-9"},
                {"type": "contact", "id": "c-42"},
            ],
        },
        "connections": {"crm": "active", "bank": "active"},
        "environment": "production",
        "budget_class": "unlimited",
    }
)


class Tools:
    """In-process tools that record being entered."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.tools = InProcessTools()
        self.tools.register("contact.read", "Read one CRM contact.", self._read)
        self.tools.register("payment.execute", "Pay an approved invoice.", self._pay)

    def _read(self, contact_id: str) -> dict[str, str]:
        self.entered.append("contact.read")
        return {"contact_id": contact_id, "name": "Ada", "email": "ada@example.test"}

    def _pay(self, **params: Any) -> dict[str, str]:
        self.entered.append("payment.execute")  # stands in for moving money
        return {"payment_id": "p-1", "status": "executed"}

    def dispatcher(self, catalogue: Catalogue, client: PolicyClient) -> Dispatcher:
        return Dispatcher(catalogue, client, ToolRegistry(self.tools))


def budget(dispatcher: Dispatcher, tool: str) -> Budget:
    """No limit; the cost the gateway would reserve: the contract's."""
    return Budget(remaining=None, cost=dispatcher.catalogue.tools[tool].cost_units)


def read_contact(dispatcher: Dispatcher) -> None:
    dispatcher.call(
        SALES_FACTS,
        "contact.read",
        {"contact_id": "c-42"},
        budget=budget(dispatcher, "contact.read"),
    )


def pay(dispatcher: Dispatcher) -> None:
    """Dispatch the approved payment proposal, with every fact it needs but the role."""
    approval = Approval.model_validate(
        {
            "kind": "exact_content_and_recipient",
            "tool": "payment.execute",
            "operation_id": "pay-inv-9",
            "tenant": "acme",
            "digest": params_digest(PAYMENT),
            "expires_at": datetime.now(UTC) + timedelta(minutes=10),
            "approved_by": "founder",
            "used": False,
        }
    )
    dispatcher.call(
        SALES_FACTS,
        "payment.execute",
        PAYMENT,
        operation_id="pay-inv-9",
        stage=Stage.DISPATCH,
        approval=approval,
        proposal=ProposalRef(id="prop-1", status="approved"),
        budget=budget(dispatcher, "payment.execute"),
        # The invoice's approval as invoice.check_approval records it: about inv-9.
        evidence_about=[
            EvidencePiece(name="invoice_approved", subject={"type": "invoice", "id": "inv-9"})
        ],
    )


# -- OPA frozen ------------------------------------------------------------------


@pytest.fixture(params=["embedded_unix", "external_tcp"])
def live(
    request: pytest.FixtureRequest, sales_catalogue: Catalogue, tmp_path: Path
) -> Iterator[tuple[PolicySidecar, int]]:
    """A sidecar on the real policies and the sales catalogue, and OPA's pid."""
    if request.param == "embedded_unix":
        with PolicySidecar(sales_catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
            assert sidecar.process is not None
            yield sidecar, sidecar.process.pid
        return
    bundle = write_bundle(sales_catalogue, tmp_path / "bundle")
    with (
        external_opa(bundle, tmp_path / "opa.log") as server,
        PolicySidecar(sales_catalogue, opa_url=server.address, timeout=ANSWER_TIMEOUT) as sidecar,
    ):
        yield sidecar, server.pid


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and return once every thread of it has stopped.

    A stop is not synchronous: on a loaded machine OPA's threads went on for a few
    milliseconds after kill() returned, long enough to answer one more question.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + HANG_SECONDS  # a bound against a hang, not a measure
    while True:
        states = [
            (task / "stat").read_text().rpartition(")")[2].split()[0]
            for task in Path(f"/proc/{pid}/task").iterdir()
        ]
        if all(state in {"T", "t"} for state in states):
            return
        assert time.monotonic() < deadline, f"OPA {pid} did not stop: {states}"
        time.sleep(0.01)


def answered(dispatcher: Dispatcher) -> None:
    """``read_contact`` until OPA answers it within TIMEOUT: a loaded machine can keep
    a running OPA past it, and only a hang may fail here. A late answer is the only
    failure asked again; a tool is entered only once the call is allowed."""
    deadline = time.monotonic() + HANG_SECONDS
    while True:
        try:
            return read_contact(dispatcher)
        except PolicyUnavailable as exc:
            if "in time" not in str(exc) or time.monotonic() > deadline:
                raise


def test_a_frozen_opa_fails_closed_within_the_deadline_and_recovers(
    live: tuple[PolicySidecar, int], sales_catalogue: Catalogue
) -> None:
    sidecar, pid = live
    tools = Tools()
    # The sidecar's client, as it is but for the deadline under test.
    client = PolicyClient(
        sidecar.client.address,
        timeout=TIMEOUT,
        expected_catalogue=sidecar.expected_digest,
        expected_revision=sidecar.client.expected_revision,
    )
    with client:
        dispatcher = tools.dispatcher(sales_catalogue, client)
        answered(dispatcher)  # warm: a keep-alive connection is pooled
        assert tools.entered == ["contact.read"]
        tools.entered.clear()

        freeze(pid)
        try:
            # Frozen, OPA never answers: failing "in time" at all is the deadline at
            # work (how soon a loaded machine gets round to it is no behaviour).
            for question in (read_contact, lambda d: d.compose(SALES_FACTS), read_contact):
                with pytest.raises(PolicyUnavailable, match="in time"):
                    question(dispatcher)
            assert tools.entered == []
        finally:
            os.kill(pid, signal.SIGCONT)

        answered(dispatcher)
        assert tools.entered == ["contact.read"]


# -- OPA's socket removed ----------------------------------------------------------


def test_a_removed_socket_fails_closed(sales_catalogue: Catalogue) -> None:
    with PolicySidecar(sales_catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
        assert sidecar.process is not None
        address = sidecar.client.address
        sidecar.process.socket_path.unlink()
        tools = Tools()
        digest = sidecar.expected_digest
        with PolicyClient(address, timeout=ANSWER_TIMEOUT, expected_catalogue=digest) as fresh:
            dispatcher = tools.dispatcher(sales_catalogue, fresh)
            with pytest.raises(PolicyUnavailable, match="unreachable"):
                read_contact(dispatcher)
            with pytest.raises(PolicyUnavailable, match="unreachable"):
                dispatcher.compose(SALES_FACTS)
        with pytest.raises(PolicyUnavailable, match="unreachable"):
            PolicySidecar(sales_catalogue, opa_url=address, timeout=ANSWER_TIMEOUT)
        assert tools.entered == []


# -- an external OPA restarted with another bundle -------------------------------


def sales_may_pay(tmp_path: Path) -> Catalogue:
    """A copy of the sales catalogue in which the sales role is granted payment.execute."""
    folder = tmp_path / "sales-may-pay"
    shutil.copytree(demo_catalogue_dir("sales"), folder)
    tools_file = folder / "tools.yaml"
    document = yaml.safe_load(tools_file.read_text(encoding="utf-8"))
    (payment,) = [tool for tool in document["tools"] if tool["name"] == "payment.execute"]
    payment["roles"] = [*payment["roles"], "sales"]
    tools_file.write_text(yaml.safe_dump(document), encoding="utf-8")
    return load_catalogue(folder)


@contextmanager
def opa_at(address: str, bundle: Path, log: Path) -> Iterator[Server]:
    """``opa run`` serving ``bundle`` at exactly ``address``, as an operator restarts it."""
    listen = address.removeprefix("http://")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(find_opa_binary()),
                "run",
                "--server",
                "--addr",
                listen,
                "--bundle",
                str(bundle),
                "--set",
                "decision_logs.console=true",
                "--skip-version-check",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        if not wait_healthy(address, proc, log):
            pytest.fail(f"OPA did not start at {address}:\n{log.read_text()[-2000:]}")
        yield Server(address, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(params=["unix", "tcp"])
def address(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "tcp":
        yield f"http://127.0.0.1:{free_port()}"
        return
    folder = tempfile.mkdtemp(prefix="capgate-restart-", dir="/tmp")
    try:
        yield f"unix://{folder}/opa.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_an_opa_restarted_with_another_bundle_is_not_obeyed(
    address: str, sales_catalogue: Catalogue, tmp_path: Path
) -> None:
    may_pay = sales_may_pay(tmp_path)
    ours = compile_catalogue(sales_catalogue)["meta"]["digest"]
    theirs = compile_catalogue(may_pay)["meta"]["digest"]
    assert ours != theirs
    ours_bundle = write_bundle(sales_catalogue, tmp_path / "ours")
    theirs_bundle = write_bundle(may_pay, tmp_path / "theirs")
    tools = Tools()

    with ExitStack() as stack:
        with opa_at(address, ours_bundle, tmp_path / "ours.log"):
            sidecar = stack.enter_context(
                PolicySidecar(sales_catalogue, opa_url=address, timeout=ANSWER_TIMEOUT)
            )
            dispatcher = tools.dispatcher(sales_catalogue, sidecar.client)
            with pytest.raises(CapabilityViolation) as denied:
                pay(dispatcher)
            assert denied.value.reason_codes == ["role_not_granted"]
            before = sidecar.client.compose(SALES_FACTS).bundle_revisions
            assert bundle_revision(sales_catalogue) in before.values()

        with opa_at(address, theirs_bundle, tmp_path / "theirs.log"):
            with pytest.raises(PolicyUnavailable) as refused:
                pay(dispatcher)
            assert ours in str(refused.value)
            assert theirs in str(refused.value)
            assert tools.entered == [], "the payment tool must never be entered"
            with pytest.raises(PolicyUnavailable, match=theirs):
                dispatcher.compose(SALES_FACTS)

            # The control: obeyed, this OPA would have paid.
            with PolicyClient(address, timeout=ANSWER_TIMEOUT, expected_catalogue=theirs) as client:
                revisions = client.compose(SALES_FACTS).bundle_revisions
                assert bundle_revision(may_pay) in revisions.values()
                pay(tools.dispatcher(may_pay, client))
            assert tools.entered == ["payment.execute"]
