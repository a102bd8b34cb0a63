"""The demo: the seed examples and the proposal life cycle, against a real OPA.

Every step states what it expects; the demo checks its own claims and returns a
non-zero exit status if the gateway did anything else (a denied tool entered, an
omen that changed between two identical draws, a missing reason code, an email sent
twice, a secret in the ledger), so it is a smoke test as well as a show.

Each scene runs a gateway over a fresh SQLite store in a temporary folder: the
connections, budgets, evidence and approvals the gateway decides with come from
that store, never from the demo's own calls.

oracle-grove runs twice: in-process, then with the oracle served by an MCP server
(``python -m capgate.demo.oracle_server``, the same oracle function), whose tool
definition a reviewer accepts first. The second run must draw the byte-identical
omen and record the same events (decisions, outcomes, ledger rows) as the first.
The first run takes its registry from the ``MCP_SERVERS`` / ``MCP_ORACLE`` gate
(:func:`capgate.adapters.tools.gate.tool_registry`): with either set, it runs the oracle tool of
the gate's servers instead of the in-process one, the catalogue leaving it unplaced.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from capgate.adapters.fronts.people import People, PeopleConfig, PersonEntry
from capgate.adapters.fronts.session import AgentSession
from capgate.adapters.tools.gate import tool_registry
from capgate.adapters.tools.in_process import InProcessTools
from capgate.adapters.tools.mcp.config import MCP_ORACLE_ENV, MCP_SERVERS_ENV, servers_from_env
from capgate.adapters.tools.mcp.pins import accept_definition
from capgate.demo import demo_catalogue_dir
from capgate.demo.oracle_server import oracle_server_spec
from capgate.demo.tools.oracle import ORACLE_DESCRIPTION, oracle
from capgate.demo.tools.sales_desk import SalesDesk
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.enforce.dispatcher import DecisionEvent
from capgate.gateway.errors import CapabilityViolation, InvalidInput
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ConnectionStatus, Reviewer
from capgate.gateway.model.outcomes import OutcomeStatus
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.service.credentials import StaticCredentials
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.proposals import QuorumProgress, quorum_progress
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.service.worker import Worker, WorkerEvent
from capgate.gateway.state import open_store
from capgate.gateway.state.records import LedgerRow, ProposalRecord, ProposalStatus
from capgate.gateway.state.store import Store
from capgate.gateway.tools.registry import ToolRegistry

__all__ = ["OracleRun", "mcp_installed", "run_demo", "run_oracle_grove"]

#: The demo's connection secrets. They must never appear in the ledger or the trace.
_SECRETS = {
    ("acme", "crm"): "demo-secret-crm-7f3a",
    ("acme", "sales_mailbox"): "demo-secret-mailbox-91c2",
    ("acme", "bank"): "demo-secret-bank-c0de",
}


@dataclass
class _Trace:
    out: TextIO
    failures: list[str] = field(default_factory=list)
    events: list[DecisionEvent] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def observe(self, event: DecisionEvent) -> None:
        self.events.append(event)
        decision = f"decision_id={event.decision_id or '-'}"
        if event.kind == "compose":
            visible = ", ".join(event.visible) or "(none)"
            self.say(f"  compose  {event.agent:<16} visible: {visible}   {decision}")
            return
        verdict = "ALLOW" if event.allow else "DENY "
        detail = (event.status or "granted") if event.allow else ", ".join(event.reason_codes)
        if event.via:
            detail += f" (via {event.via})"
        stage = f"[{event.stage}]" if event.stage else ""
        self.say(
            f"  execute  {event.agent:<16} {event.tool or '?':<22} {stage:<10} "
            f"{verdict} {detail}   {decision}"
        )

    def expect(self, ok: bool, claim: str) -> None:
        self.say(f"    {'ok  ' if ok else 'FAIL'} {claim}")
        if not ok:
            self.failures.append(claim)


@contextmanager
def _gateway(
    catalogue: Catalogue,
    registry: ToolRegistry | Callable[[Store], ToolRegistry],
    trace: _Trace,
    seed: Callable[[Any], None],
) -> Iterator[Gateway]:
    # A generous timeout: the demo runs on busy shared machines too, and a flaky demo
    # teaches nothing. Services keep the short default (docs/architecture.md).
    with (
        tempfile.TemporaryDirectory(prefix="capgate-demo-") as folder,
        PolicySidecar(catalogue, timeout=5.0) as sidecar,
    ):
        for line in sidecar.describe_lines():
            trace.say(f"  {line}")
        store = open_store(str(Path(folder) / "state.db"))
        try:
            with store.transaction() as tx:
                seed(tx)
            trace.say(f"  store: {store.location} (tenants, connections and budgets seeded)")
            yield Gateway(
                catalogue,
                sidecar.client,
                registry if isinstance(registry, ToolRegistry) else registry(store),
                store,
                credentials=StaticCredentials(_SECRETS),
                observer=trace.observe,
            )
        finally:
            store.close()


def _denied(call: Callable[[], Any]) -> CapabilityViolation | None:
    try:
        call()
    except CapabilityViolation as exc:
        return exc
    return None


def _request(agent: str, role: str, tenant: str, task: dict[str, Any], env: str) -> AgentRequest:
    return AgentRequest.model_validate(
        {"principal": {"agent": agent, "role": role, "tenant": tenant}, "task": task,
         "environment": env}
    )  # fmt: skip


# -- oracle-grove ---------------------------------------------------------------------

#: The seed both oracle-grove runs draw with.
_OMEN_SEED = "harvest-moon"


@dataclass
class OracleRun:
    """What one oracle-grove run produced, to compare the two transports."""

    omen: str | None
    #: The decisions of the scene itself, without decision ids or policy revisions.
    events: list[tuple[Any, ...]]
    #: Its ledger rows: kind, principal, tool, version, outcome, reason codes and the
    #: detail without the MCP definition digest (which only an upstream tool has).
    ledger: list[tuple[Any, ...]]
    #: The digest of the oracle's accepted MCP definition in the run's intent rows.
    definitions: set[str]


def _event_key(event: DecisionEvent) -> tuple[Any, ...]:
    return (event.kind, event.agent, event.allow, event.tool, event.visible,
            event.reason_codes, event.status, event.stage, event.via)  # fmt: skip


def _row_key(row: LedgerRow) -> tuple[Any, ...]:
    detail = {k: v for k, v in row.detail.items() if k != "definition"}
    return (row.kind, row.tenant, row.principal, row.tool, row.contract_version, row.outcome,
            tuple(row.reason_codes), sorted(detail.items()))  # fmt: skip


def run_oracle_grove(out: TextIO = sys.stdout, *, over_mcp: bool = False) -> tuple[int, OracleRun]:
    """One oracle-grove run, in-process or over MCP; its exit status and what it did."""
    trace = _Trace(out)
    run = _oracle_grove(trace, {MCP_ORACLE_ENV: "1"} if over_mcp else {})
    return (1 if trace.failures else 0), run


def _oracle_grove(trace: _Trace, gate: Mapping[str, str]) -> OracleRun:
    """oracle-grove with the registry the gate ``gate`` (an environment) gives: the
    in-process oracle, or, with MCP_SERVERS or MCP_ORACLE set, the oracle tool of the
    gate's servers (the catalogue leaves it unplaced), accepted by a reviewer first."""
    servers = servers_from_env(gate, oracle=oracle_server_spec())
    over_mcp = bool(servers)
    transport = (
        f"over MCP (server {', '.join(repr(server.id) for server in servers)})"
        if over_mcp
        else "in-process"
    )
    trace.say(f"== oracle-grove {transport}: a tool-using agent beside a tool-less one ==")
    catalogue = load_catalogue(demo_catalogue_dir("oracle-grove"))
    closers: list[Callable[[], None]] = []

    def tools(store: Store) -> ToolRegistry:
        local = InProcessTools()
        if not over_mcp:
            local.register("oracle", ORACLE_DESCRIPTION, oracle)
        servers_open = ExitStack()
        closers.append(servers_open.close)
        return servers_open.enter_context(
            tool_registry(catalogue, store, local, environ=gate, oracle=oracle_server_spec(),
                          connect_timeout=30.0)
        )  # fmt: skip

    def seed(tx: Any) -> None:
        tx.put_tenant("grove", budget_class="standard", budget_limit=None)

    def request(agent: str) -> AgentRequest:
        return _request(agent, agent, "grove", {"type": "scene", "id": "scene-1"}, "development")

    try:
        with _gateway(catalogue, tools, trace, seed) as gateway:
            if over_mcp:
                _review_oracle_definition(trace, gateway, request("fortune-teller"))
            start = len(trace.events)
            after = gateway.store.ledger()[-1].seq if gateway.store.ledger() else 0
            omen = _grove_beats(trace, gateway, request)
            rows = gateway.store.ledger(after_seq=after)
            return OracleRun(
                omen=omen,
                events=[_event_key(e) for e in trace.events[start:]],
                ledger=[_row_key(row) for row in rows],
                definitions={
                    str(row.detail["definition"]) for row in rows if "definition" in row.detail
                },
            )
    finally:
        for close in closers:
            close()


def _review_oracle_definition(trace: _Trace, gateway: Gateway, teller: AgentRequest) -> None:
    """Before the scene: the oracle's MCP definition is quarantined until reviewed."""
    trace.say("  -- a reviewer accepts the oracle server's tool definition")
    hidden = gateway.compose(teller, reasons=True)
    trace.expect(
        hidden.reasons_for("oracle") == ["tool_quarantined"],
        "before review the oracle is hidden: tool_quarantined (no definition accepted)",
    )
    adapter = gateway.registry.adapter_for("oracle")
    listings = adapter.discover()  # type: ignore[union-attr]
    with gateway.store.transaction(read_only=True) as tx:
        shown = [tx.get_pin(server, "oracle") for server in listings]
    pending = next((pin for pin in shown if pin is not None and pin.observed_digest), None)
    if pending is None:
        trace.expect(False, f"a server of the gate ({', '.join(listings)}) lists an oracle tool")
        return
    trace.say(
        f"    discovered {len(listings[pending.server])} tool(s) on server "
        f"{pending.server!r}: oracle is {pending.status.value}, {pending.observed_digest}"
    )
    pin = accept_definition(
        gateway.store, gateway.catalogue, pending.server, "oracle",
        as_tool="oracle", digest=pending.observed_digest, by="demo-reviewer",
    )  # fmt: skip
    trace.expect(pin.status.value == "accepted", "accepted as catalogue tool oracle")


def _grove_beats(
    trace: _Trace, gateway: Gateway, request: Callable[[str], AgentRequest]
) -> str | None:
    teller = AgentSession(gateway, request("fortune-teller"))
    trace.say("    prompt block: " + teller.available_tools_block().replace("\n", " | "))
    first = teller.call_tool("oracle", seed=_OMEN_SEED)
    event = {"type": "oracle.spoke", "payload": {"omen": first["omen"], "seed": first["seed"]}}
    trace.say(f"    emitted {event}")
    again = teller.call_tool("oracle", seed=_OMEN_SEED)
    trace.expect(again["omen"] == first["omen"], "same seed, same omen")

    whisperer = AgentSession(gateway, request("scene-whisperer"))
    trace.say("    prompt block: " + whisperer.available_tools_block())
    trace.expect(whisperer.visible_tools == [], "scene-whisperer sees no tool")
    denial = _denied(lambda: whisperer.call_tool("oracle", seed=_OMEN_SEED))
    trace.expect(
        denial is not None and "role_not_granted" in denial.reason_codes,
        "scene-whisperer's oracle call is denied: role_not_granted",
    )
    trace.say("    emitted {'type': 'world.observed', 'payload': {'omen': None}}")
    omen = first.get("omen")
    return omen if isinstance(omen, str) else None


def mcp_installed() -> bool:
    """Whether the ``mcp`` extra can be imported (the MCP scene needs it)."""
    try:
        return importlib.util.find_spec("mcp") is not None
    except ImportError:
        return False


def _oracle_scenes(trace: _Trace) -> None:
    """oracle-grove in-process (or over MCP with MCP_ORACLE=1), then over MCP: the
    same omen, the same events."""
    gate = {
        name: os.environ[name] for name in (MCP_SERVERS_ENV, MCP_ORACLE_ENV) if name in os.environ
    }
    first_over_mcp = bool(servers_from_env(gate, oracle=oracle_server_spec()))
    first = _oracle_grove(trace, gate)
    first_mode = "first MCP run's" if first_over_mcp else "in-process one"
    trace.say("")
    if not mcp_installed():
        trace.say("== oracle-grove over MCP: skipped, the mcp extra is not installed "
                  "(pip install 'capgate[mcp]') ==")  # fmt: skip
        return
    second = _oracle_grove(trace, {MCP_ORACLE_ENV: "1"})
    trace.expect(
        second.omen is not None and second.omen == first.omen,
        f"the omen drawn over MCP is the {first_mode}, byte for byte: {second.omen!r}",
    )
    trace.expect(
        second.events == first.events and second.ledger == first.ledger,
        f"the same {len(second.events)} decisions and {len(second.ledger)} ledger rows in "
        "both modes",
    )
    trace.expect(
        len(second.definitions) == 1,
        f"every MCP call's ledger rows name the accepted definition {sorted(second.definitions)}",
    )


# -- sales -----------------------------------------------------------------------------


def _seed_acme(tx: Any) -> None:
    tx.put_tenant("acme", budget_class="unlimited", budget_limit=100)
    for alias, account in (
        ("crm", "acme@crm.example"),
        ("sales_mailbox", "sales@acme.example"),
        ("bank", "acme-treasury@bank.example"),
    ):
        tx.put_connection("acme", alias, status=ConnectionStatus.ACTIVE, account=account)


_QUOTE_TASK = {
    "type": "customer_quote",
    "id": "task-quote-17",
    "linked_resources": [
        {"type": "contact", "id": "c-42"},
        {"type": "opportunity", "id": "opp-17"},
        {"type": "invoice", "id": "inv-9"},
    ],
}
_PAY_TASK = {
    "type": "invoice_payment",
    "id": "task-pay-9",
    "linked_resources": [{"type": "invoice", "id": "inv-9"}],
}
_PAYMENT: dict[str, Any] = {
    "invoice_id": "inv-9",
    "amount_cents": 120_000,
    "currency": "EUR",
    "beneficiary": "DE44500105175407324931",
}
_EMAIL: dict[str, Any] = {
    "opportunity_id": "opp-17",
    "recipient": "ada@example.test",
    "subject": "Your quote",
    "body": "Dear Ada, please find our quote attached.",
}
#: The demo's reviewers, declared as a service's configuration declares people: each
#: signs in with a bearer token, of which the gateway holds only the digest.
_TOKENS: Final = {
    "maria": "demo-token-maria-4c1e",
    "carl": "demo-token-carl-90ab",
    "dana": "demo-token-dana-7f3d",
}
_PEOPLE: Final = People(
    PeopleConfig(
        people=[
            PersonEntry(
                id=person,
                name=name,
                role=role,
                tenant="acme",
                token_sha256=hashlib.sha256(_TOKENS[person].encode()).hexdigest(),
            )
            for person, name, role in (
                ("maria", "Maria Rossi", "sales_manager"),
                ("carl", "Carl Berg", "controller"),
                ("dana", "Dana Okafor", "controller"),
            )
        ]
    )
)
_MANAGER = _PEOPLE.by_token(_TOKENS["maria"])
_CONTROLLER = _PEOPLE.by_token(_TOKENS["carl"])
_SECOND_CONTROLLER = _PEOPLE.by_token(_TOKENS["dana"])


def _sales(trace: _Trace) -> None:
    trace.say("")
    trace.say("== sales / support / finance: compose, propose, review, dispatch ==")
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    desk = SalesDesk()

    with _gateway(catalogue, ToolRegistry(desk.tools()), trace, _seed_acme) as gateway:
        _sales_agent(trace, gateway, desk)
        _quote_email(trace, gateway, desk)
        _revoked_while_queued(trace, gateway, desk)
        _payment(trace, gateway, desk)
        _ledger(trace, gateway)


def _sales_agent(trace: _Trace, gateway: Gateway, desk: SalesDesk) -> None:
    trace.say("  -- a sales agent: compose by intersection, every call checked")
    sales = AgentSession(gateway, _request("sales-bot", "sales", "acme", _QUOTE_TASK, "production"))
    trace.expect(
        "payment.execute" not in sales.visible_tools and "contact.read" in sales.visible_tools,
        "sales sees the CRM and quote tools, not payment.execute",
    )
    trace.expect(
        gateway.compose(sales.request, reasons=True).reasons_for("payment.execute")
        == ["role_not_granted"],
        "payment.execute is hidden from sales by role alone",
    )
    sales.call_tool("contact.read", contact_id="c-42")
    denial = _denied(lambda: sales.call_tool("payment.execute", **_PAYMENT))
    trace.expect(
        denial is not None and "role_not_granted" in denial.reason_codes,
        "sales' payment.execute is denied, role_not_granted among the reasons",
    )
    trace.expect("payment.execute" not in desk.entered, "the payment function was never entered")
    denial = _denied(lambda: sales.call_tool("contact.read", contact_id="c-99"))
    trace.expect(
        denial is not None and denial.reason_codes == ["subject_out_of_scope"],
        "a contact the task does not link is out of scope",
    )


def _quote_email(trace: _Trace, gateway: Gateway, desk: SalesDesk) -> None:
    trace.say("  -- propose a quote and its email; a manager reviews; the worker dispatches")
    sales = AgentSession(gateway, _request("sales-bot", "sales", "acme", _QUOTE_TASK, "production"))
    denial = _denied(lambda: sales.call_tool("quote.prepare_send", **_EMAIL))
    trace.expect(
        denial is not None and "evidence_missing" in denial.reason_codes,
        "the email cannot even be proposed before its evidence exists: evidence_missing",
    )
    quote = sales.call_tool(
        "quote.propose", opportunity_id="opp-17", amount_cents=120_000, currency="EUR"
    )
    trace.expect(quote["status"] == "pending_review", "quote.propose is a proposal, nothing sent")
    trace.say(
        f"    maria signs in with her token: reviewer {_MANAGER.id} "
        f"({_MANAGER.authenticated_by}, role {_MANAGER.role})"
    )
    gateway.review(quote["proposal_id"], _MANAGER, "approved")
    recorded = gateway.dispatch(quote["proposal_id"])
    trace.expect(
        recorded.status is OutcomeStatus.SUCCESS and recorded.provider_receipt is not None,
        f"the reviewed quote is recorded in the CRM (receipt {recorded.provider_receipt})",
    )
    sales.call_tool("contact.verify_email", contact_id="c-42", email=_EMAIL["recipient"])
    sales.call_tool("consent.check", contact_id="c-42")
    # The verification is evidence about Ada's address (its digest), not about
    # whoever the agent mails next.
    elsewhere = {**_EMAIL, "recipient": "cb@example.test"}
    denial = _denied(lambda: sales.call_tool("quote.prepare_send", **elsewhere))
    trace.expect(
        denial is not None and denial.reason_codes == ["evidence_missing"],
        "a verified recipient licenses mail to that address only: another is evidence_missing",
    )
    email = sales.call_tool("quote.prepare_send", **_EMAIL)
    proposal = email["proposal_id"]
    trace.say(f"    proposal {proposal}: to {_EMAIL['recipient']!r}, subject {_EMAIL['subject']!r}")
    denial = _denied(
        lambda: gateway.review(
            proposal,
            Reviewer.of_agent(sales.request.principal, authenticated_by="demo:session"),
            "approved",
        )
    )
    trace.expect(
        denial is not None and "self_review" in denial.reason_codes,
        "the agent cannot approve its own proposal: self_review",
    )
    gateway.review(proposal, _MANAGER, "approved")
    # The execution worker (capgate serve runs one) takes what reviewers approved.
    done: list[WorkerEvent] = []
    Worker(gateway, on_event=done.append).run_once()
    [sent] = [event for event in done if event.proposal_id == proposal]
    again = gateway.dispatch(proposal)
    trace.expect(
        sent.kind == "dispatched" and again.provider_receipt == sent.provider_receipt
        and len(desk.mailbox) == 1,
        f"the worker dispatched it exactly once (message {sent.provider_receipt}); "
        "dispatching again returns the same outcome",
    )  # fmt: skip


def _revoked_while_queued(trace: _Trace, gateway: Gateway, desk: SalesDesk) -> None:
    trace.say("  -- the mailbox is revoked while an approved email waits")
    sales = AgentSession(gateway, _request("sales-bot", "sales", "acme", _QUOTE_TASK, "production"))
    follow_up = {**_EMAIL, "subject": "Following up on your quote"}
    proposal = sales.call_tool("quote.prepare_send", **follow_up)["proposal_id"]
    gateway.review(proposal, _MANAGER, "approved")
    gateway.revoke_connection("acme", "sales_mailbox", by="ops")
    denial = _denied(lambda: gateway.dispatch(proposal))
    queued = _proposal(gateway, proposal)
    trace.expect(
        denial is not None
        and "connection_revoked" in denial.reason_codes
        and queued.status is ProposalStatus.BLOCKED
        and len(desk.mailbox) == 1,
        "dispatch is denied (connection_revoked), nothing is sent, the proposal is blocked",
    )
    trace.expect(
        "quote.prepare_send" not in sales.refresh().visible,
        "the next compose no longer shows the email tool",
    )
    gateway.restore_connection("acme", "sales_mailbox", by="ops")


def _payment(trace: _Trace, gateway: Gateway, desk: SalesDesk) -> None:
    trace.say("  -- finance pays an approved invoice; the bank's answer is lost once")
    finance = AgentSession(
        gateway, _request("finance-bot", "finance", "acme", _PAY_TASK, "production")
    )
    finance.call_tool("invoice.check_approval", invoice_id="inv-9")
    large = {**_PAYMENT, "amount_cents": 750_000}
    over = _denied(lambda: finance.call_tool("payment.execute", **large))
    trace.expect(
        over is not None and list(over.reason_codes) == ["value_over_limit"],
        "7,500.00 is over finance's limit of 5,000.00 a payment: value_over_limit, "
        "nothing proposed",
    )
    pounds = {**_PAYMENT, "amount_cents": 450_000, "currency": "GBP"}
    in_pounds = _denied(lambda: finance.call_tool("payment.execute", **pounds))
    trace.expect(
        in_pounds is not None
        and list(in_pounds.reason_codes) == ["value_over_limit"]
        and "526500" in in_pounds.reasons[0].message,
        "4,500.00 GBP is 5,265.00 EUR by currencies.yaml's rate: over the limit too",
    )
    try:
        finance.call_tool("payment.execute", **{**_PAYMENT, "currency": "XTS"})
        unconvertible = None
    except InvalidInput as exc:
        unconvertible = exc
    trace.expect(
        unconvertible is not None and "no rate" in str(unconvertible),
        "a payment in a currency currencies.yaml has no rate for is refused before OPA is asked",
    )
    proposal = finance.call_tool("payment.execute", **_PAYMENT)["proposal_id"]
    denial = _denied(lambda: gateway.review(proposal, _MANAGER, "approved"))
    trace.expect(
        denial is not None and "reviewer_not_permitted" in denial.reason_codes,
        "a sales manager may not approve a payment: reviewer_not_permitted",
    )
    gateway.review(proposal, _CONTROLLER, "approved")
    desk.lose_answer_once.add("payment.execute")
    first = gateway.dispatch(proposal)
    trace.expect(
        first.status is OutcomeStatus.UNKNOWN and first.recovery == "lookup_before_retry",
        "the bank took the payment but its answer was lost: unknown, lookup_before_retry",
    )
    second = gateway.dispatch(proposal)
    trace.expect(
        second.ok and len(desk.payments) == 1 and desk.entered.count("payment.execute") == 1,
        f"the retry looked the payment up (receipt {second.provider_receipt}): paid once",
    )
    trace.say("  -- above 2,000.00 a payment needs two controllers")
    larger = finance.call_tool("payment.execute", **{**_PAYMENT, "amount_cents": 300_000})
    pending = larger["proposal_id"]
    gateway.review(pending, _CONTROLLER, "approved")
    gateway.review(pending, _CONTROLLER, "approved")
    with gateway.store.transaction(read_only=True) as tx:
        waiting = tx.get_proposal(pending)
    progress = quorum_progress(gateway.store, pending)
    trace.expect(
        waiting is not None
        and waiting.status is ProposalStatus.PENDING
        and progress == QuorumProgress(approvals=1, required=2),
        "one controller approving (twice) is one approval of the two the policy asks: "
        "the proposal stays pending",
    )
    gateway.review(pending, _SECOND_CONTROLLER, "approved")
    paid = gateway.dispatch(pending)
    trace.expect(
        paid.ok and len(desk.payments) == 2,
        "a second, distinct controller approves: the 3,000.00 payment is dispatched",
    )


def _ledger(trace: _Trace, gateway: Gateway) -> None:
    trace.say("  -- the ledger")
    rows = gateway.store.ledger(tenant="acme")
    email_rows = [r for r in rows if r.tool == "quote.prepare_send" and r.kind != "compose"]
    for row in email_rows[:8]:
        trace.say(
            f"    #{row.seq:<3} {row.kind:<9} {row.outcome or '':<10} op={row.operation_id} "
            f"decision={row.decision_id or '-'}"
        )
    report = gateway.store.verify_ledger()
    trace.expect(report.ok, f"the ledger's hash chain verifies ({report.rows} rows)")
    text = "\n".join(row.model_dump_json() for row in rows)
    trace.expect(
        not any(secret in text for secret in _SECRETS.values()),
        "no connection secret appears in any ledger row",
    )


def _proposal(gateway: Gateway, proposal_id: str) -> ProposalRecord:
    with gateway.store.transaction(read_only=True) as tx:
        proposal = tx.get_proposal(proposal_id)
    assert proposal is not None
    return proposal


def run_demo(out: TextIO = sys.stdout) -> int:
    """Run every scene; return 0 when every expectation held, 1 otherwise."""
    trace = _Trace(out)
    _oracle_scenes(trace)
    _sales(trace)
    trace.say("")
    if trace.failures:
        trace.say(f"DEMO FAILED: {len(trace.failures)} expectation(s) did not hold")
        return 1
    trace.say("demo finished: every expectation held")
    return 0
