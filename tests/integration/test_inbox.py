"""The review inbox, used in a real browser against a real ``capgate serve --http``.

An agent with the official MCP client proposes a quote and then the email that
sends it (``quote.prepare_send``, whose body carries a ``<script>``); reviewers sign
in to ``/inbox`` in Debian's Chromium (driven by Playwright) and approve each; the
server's execution worker dispatches them; the agent's status query shows the email
dispatched with the mailbox's receipt; the mailbox ran once; the ledger names the
authenticated reviewer. Around that, what an attacker would try: a second reviewer
deciding the same proposal sees "already decided"; the person the agent acts for is
refused as a self-review; a reviewer of another tenant sees nothing and gets the
same page for the proposal's id as for no proposal; a decision without the
session's CSRF token, from another origin, or from another site's auto-submitting
form changes nothing; a host name the inbox does not serve is refused; failed
sign-ins are limited. The screenshots in docs/images are this test's
(``CAPGATE_INBOX_SCREENSHOTS=docs/images``).
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from playwright.sync_api import Page

from capgate.adapters.fronts.mcp.config import token_digest
from capgate.cli.main import main
from capgate.gateway.state.records import LedgerEntry
from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS
from tests.integration.browser import launch_chromium, new_page
from tests.integration.mcp_server_support import (
    FINANCE_BOT,
    SALES_BOT,
    HttpServer,
    http_server,
    http_session,
    ledger,
    records,
    seed_store,
    write_config,
)
from tests.integration.test_mcp_review_tools import facts

pytestmark = pytest.mark.integration
T = TypeVar("T")

AGENT_TOKEN = "agent-token-sales-0a1b2c3d4e5f"
TOKENS = {
    "maria": "maria-reviewer-token-71f0c9",
    "mike": "mike-reviewer-token-33aa01",
    "sam": "sam-reviewer-token-5d5d5d",
    "gina": "gina-reviewer-token-9e9e9e",
    "carl": "carl-controller-token-7c7c7c",
    "dana": "dana-controller-token-4d4d4d",
}
FINANCE_TOKEN = "agent-token-finance-9f8e7d6c5b4a"
QUOTE = {"opportunity_id": "opp-17", "amount_cents": 1200, "currency": "EUR"}
HOSTILE = "<script>document.title='pwned'</script><b>bold?</b>"
EMAIL = {
    "opportunity_id": "opp-17",
    "recipient": "ada@example.test",
    "subject": "Your quote",
    "body": f"Dear Ada,\nplease find our quote attached.\n{HOSTILE}",
}


def person(name: str, tenant: str = "acme", role: str = "sales_manager") -> dict[str, Any]:
    return {
        "id": name,
        "name": name.title(),
        "role": role,
        "tenant": tenant,
        "token_sha256": token_digest(TOKENS[name]),
    }


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[HttpServer, dict[str, Any]]]:
    store = seed_store(tmp_path / "state.db")
    assert main(["tenants", "add", "globex", "--budget-class", "standard", "--store", store]) == 0
    agent = {**SALES_BOT, "principal": {**SALES_BOT["principal"], "acts_for": "sam"}}
    config = write_config(
        tmp_path / "serve.yaml",
        http={"sales": (AGENT_TOKEN, agent), "finance": (FINANCE_TOKEN, FINANCE_BOT)},
        extra={
            "people": [
                *(person(name) for name in ("maria", "mike", "sam")),
                person("gina", "globex"),
                *(person(name, role="controller") for name in ("carl", "dana")),
            ],
            "inbox": {"live_update_seconds": 0.5},
        },
    )
    record = tmp_path / "record.jsonl"
    with http_server(store, config, record) as server:
        yield server, {"store": store, "record": record, "shots": tmp_path / "shots"}


def inbox_url(server: HttpServer) -> str:
    return server.url.removesuffix("/mcp") + "/inbox"


def agent(
    server: HttpServer, steps: list[tuple[str, dict[str, Any]]], token: str = AGENT_TOKEN
) -> list[dict[str, Any]]:
    """The agent's calls, in order, over one MCP session: each call's facts."""

    async def run() -> list[dict[str, Any]]:
        with anyio.fail_after(HANG_SECONDS):
            async with http_session(server.url, token) as client:
                answers = []
                for name, arguments in steps:
                    result = await client.call_tool(name, arguments)
                    assert result.is_error is False, (name, result.content)
                    answers.append({**facts(result), "structured": result.structured_content})
                return answers

    return elsewhere(run)


def dispatched(server: HttpServer, proposal_id: str, token: str = AGENT_TOKEN) -> dict[str, Any]:
    """The agent's view of its proposal once the worker dispatched it."""

    async def run() -> dict[str, Any]:
        with anyio.fail_after(HANG_SECONDS):
            async with http_session(server.url, token) as client:
                while True:
                    status = await client.call_tool(
                        "capgate.proposals.status", {"proposal_id": proposal_id}
                    )
                    seen = dict(status.structured_content or {})
                    if seen.get("status") == "dispatched" and "outcome" in seen:
                        return seen
                    await anyio.sleep(0.1)

    return elsewhere(run)


def elsewhere(run: Callable[[], Awaitable[T]]) -> T:
    """``anyio.run(run)`` in a thread of its own: Playwright's sync API keeps an
    event loop running in the test's thread."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, run).result()


def sign_in(page: Page, base: str, who: str) -> None:
    page.goto(f"{base}/")
    assert page.url.endswith("/inbox/login")
    page.fill("#credential", TOKENS[who])
    page.click("button[type=submit]")
    page.wait_for_load_state()
    assert page.url == f"{base}/", page.text_content("main")
    assert who in (page.text_content("header") or "")


def shoot(page: Page, shots: Path, name: str) -> None:
    """A screenshot into the test's folder, and into docs/images when asked."""
    shots.mkdir(exist_ok=True)
    page.screenshot(path=str(shots / f"inbox-{name}.png"), full_page=True)
    wanted = os.environ.get("CAPGATE_INBOX_SCREENSHOTS")
    if wanted:
        page.screenshot(path=str(Path(wanted) / f"inbox-{name}.png"), full_page=True)


def approve(page: Page, base: str, proposal_id: str, comment: str) -> str:
    page.goto(f"{base}/proposals/{proposal_id}")
    page.fill("#comment", comment)
    page.click("button.approve")
    page.wait_for_url(f"{base}/proposals/{proposal_id}")
    return page.text_content(".flash") or ""


def kinds(rows: list[LedgerEntry], proposal_id: str) -> list[str]:
    return [r.kind for r in rows if r.proposal_id == proposal_id]


def test_a_reviewer_approves_in_the_browser_and_the_worker_sends_it_once(served):
    server, state = served
    base = inbox_url(server)
    [quote] = agent(server, [("quote.propose", QUOTE)])
    with launch_chromium() as browser:
        maria = new_page(browser, base)
        mike = new_page(browser, base)
        sign_in(maria, base, "maria")
        assert quote["proposal_id"] in (maria.text_content("#pending") or "")
        shoot(maria, state["shots"], "pending")
        assert "Approved" in approve(maria, base, quote["proposal_id"], "Price as agreed.")
        sent_quote = dispatched(server, quote["proposal_id"])
        assert sent_quote["outcome"]["status"] == "success"

        # The email, once the quote's revision, the recipient and the consent are facts.
        maria.goto(f"{base}/")
        verified, consent, email = agent(
            server,
            [
                ("contact.verify_email", {"contact_id": "c-42", "email": EMAIL["recipient"]}),
                ("consent.check", {"contact_id": "c-42"}),
                ("quote.prepare_send", EMAIL),
            ],
        )
        proposal_id = email["proposal_id"]
        # The open list reloads itself when the proposal arrives: no one reloads it.
        maria.wait_for_selector(f"a[href='/inbox/proposals/{proposal_id}']")

        # Mike opens it too, and will decide second.
        sign_in(mike, base, "mike")
        mike.goto(f"{base}/proposals/{proposal_id}")
        maria.goto(f"{base}/proposals/{proposal_id}")
        # The agent's <script> is text on the page, never markup.
        assert HOSTILE in (maria.text_content("#content") or "")
        assert maria.locator("#content script").count() == 0
        assert maria.locator("#content b").count() == 0
        assert maria.title() != "pwned"
        assert maria.text_content("#recipient") == "ada@example.test"
        assert "active" in (maria.text_content("#connection") or "")
        shoot(maria, state["shots"], "proposal")

        flash = approve(maria, base, proposal_id, "Checked the recipient and the quote.")
        assert "Approved" in flash
        # Mike's page, opened before, now shows that it changed.
        mike.wait_for_selector("#changed", state="visible")
        mike.fill("#comment", "Looks fine to me too.")
        mike.click("button.approve")
        mike.wait_for_url(f"{base}/proposals/{proposal_id}")
        assert "Already decided" in (mike.text_content(".flash") or "")
        shoot(mike, state["shots"], "already-decided")

        seen = dispatched(server, proposal_id)
        maria.goto(f"{base}/proposals/{proposal_id}")
        assert "dispatched" in (maria.text_content("#status") or "")
        assert "Checked the recipient" in (maria.text_content("#reviews") or "")
        maria.goto(f"{base}/")
        shoot(maria, state["shots"], "history")

    assert seen["outcome"]["status"] == "success"
    assert seen["outcome"]["receipt"], seen
    assert [r["reviewer"] for r in seen["reviews"]] == ["maria"]
    assert verified["status"] == consent["status"] == "success"
    runs = [r["name"] for r in records(state["record"])]
    assert runs.count("quote.dispatch_reviewed") == 1  # the mailbox sent it once
    rows = ledger(state["store"])
    steps = kinds(rows, proposal_id)
    for kind in ("proposal", "review", "dispatch", "outcome"):
        assert kind in steps, steps
    assert steps.index("proposal") < steps.index("review") < steps.index("dispatch")
    reviews = [r for r in rows if r.kind == "review" and r.proposal_id == proposal_id]
    assert [(r.outcome, r.detail["reviewer"]) for r in reviews] == [
        ("approved", "maria"),
        ("refused", "mike"),
    ]
    assert reviews[0].detail["authenticated_by"] == "token:maria"
    assert reviews[0].detail["reviewer_kind"] == "person"
    # Nothing of the content reached the server's log.
    assert "pwned" not in server.stderr
    assert TOKENS["maria"] not in server.stderr


def test_the_inbox_shows_a_payment_waiting_for_its_second_controller(served):
    server, state = served
    base = inbox_url(server)
    large = {
        "invoice_id": "inv-9",
        "amount_cents": 300_000,
        "currency": "EUR",
        "beneficiary": "DE44500105175407324931",
    }
    _, payment = agent(
        server,
        [("invoice.check_approval", {"invoice_id": "inv-9"}), ("payment.execute", large)],
        token=FINANCE_TOKEN,
    )
    proposal_id = payment["proposal_id"]
    with launch_chromium() as browser:
        carl, dana = new_page(browser, base), new_page(browser, base)
        sign_in(carl, base, "carl")
        carl.goto(f"{base}/proposals/{proposal_id}")
        assert carl.locator("#quorum").count() == 0  # nobody approved: no count claimed
        flash = approve(carl, base, proposal_id, "First of two.")
        assert "1 of the 2 distinct reviewers" in flash, flash
        assert "dispatches" not in flash
        assert "pending" in (carl.text_content("#status") or "")
        assert "1 of the 2" in (carl.text_content("#quorum") or "")
        shoot(carl, state["shots"], "quorum")

        sign_in(dana, base, "dana")
        assert "Approved" in approve(dana, base, proposal_id, "Second.")
        assert dana.locator("#quorum").count() == 0
    seen = dispatched(server, proposal_id, FINANCE_TOKEN)
    assert seen["outcome"]["status"] == "success"
    assert sorted(r["reviewer"] for r in seen["reviews"]) == ["carl", "dana"]


class _Attacker(http.server.BaseHTTPRequestHandler):
    """Another site (another origin on loopback) with a form that posts to the inbox."""

    target = ""

    def do_GET(self) -> None:
        body = (
            "<!doctype html><html><body>"
            f"<form id=f method=post action='{self.target}'>"
            "<input name=verdict value=approve><input name=digest value=x>"
            "<input name=csrf value=guess></form>"
            "<script>document.getElementById('f').submit()</script></body></html>"
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def attacker_site(target: str) -> tuple[http.server.HTTPServer, str]:
    handler = type("Attacker", (_Attacker,), {"target": target})
    site = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    return site, f"http://127.0.0.1:{site.server_address[1]}/"


def pending(store: str, proposal_id: str) -> bool:
    rows = [r for r in ledger(store) if r.kind == "review" and r.proposal_id == proposal_id]
    return not [r for r in rows if r.outcome == "approved"]


def test_what_an_attacker_tries_in_the_browser_changes_nothing(served):
    server, state = served
    base = inbox_url(server)
    [email] = agent(server, [("quote.propose", QUOTE)])
    proposal_id = email["proposal_id"]
    decide = f"{base}/proposals/{proposal_id}/decide"
    with launch_chromium() as browser:
        # Another tenant's reviewer: an empty list, and the id reads as no proposal.
        gina = new_page(browser, base)
        sign_in(gina, base, "gina")
        assert proposal_id not in (gina.content())
        answer = gina.goto(f"{base}/proposals/{proposal_id}")
        assert answer is not None
        assert answer.status == 404
        theirs = gina.text_content("main")
        missing = gina.goto(f"{base}/proposals/prop-does-not-exist")
        assert missing is not None
        assert missing.status == 404
        assert gina.text_content("main") == theirs  # the same page as for no proposal
        assert QUOTE["opportunity_id"] not in (theirs or "")
        # Deciding it by URL: the same answer, and nothing decided.
        csrf = gina.get_attribute("input[name=csrf]", "value") or ""
        by_url = gina.request.post(decide, form={"verdict": "approve", "digest": "x", "csrf": csrf})
        assert by_url.status == 404
        assert "tenant_mismatch" not in (by_url.text())

        # The person the agent acts for: a self-review, refused by the policy.
        sam = new_page(browser, base)
        sign_in(sam, base, "sam")
        assert "self_review" in approve(sam, base, proposal_id, "my own")

        # A decision without the CSRF token, or from another origin: refused.
        maria = new_page(browser, base)
        sign_in(maria, base, "maria")
        maria.goto(f"{base}/proposals/{proposal_id}")
        digest = maria.text_content("#digest")
        no_token = maria.request.post(decide, form={"verdict": "approve", "digest": digest or ""})
        assert no_token.status == 403
        csrf = maria.get_attribute("input[name=csrf]", "value") or ""
        elsewhere = maria.request.post(
            decide,
            form={"verdict": "approve", "digest": digest or "", "csrf": csrf},
            headers={"Origin": "http://127.0.0.1:1"},
        )
        assert elsewhere.status == 403
        # Another site's page that posts a form to the inbox as soon as it loads.
        site, url = attacker_site(decide)
        try:
            maria.goto(url)
            maria.wait_for_url(decide)  # the form went to the inbox, and was refused
        finally:
            site.shutdown()
            site.server_close()
        assert "request_forged" in (maria.text_content("main") or "")
        maria.goto(f"{base}/proposals/{proposal_id}")
        assert "pending" in (maria.text_content("#status") or "")
        # The cookie is out of a script's and another site's reach.
        [cookie] = [c for c in maria.context.cookies() if c["name"] == "capgate_inbox"]
        assert cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Strict"
        assert cookie["path"] == "/inbox"
    assert pending(state["store"], proposal_id)
    refused = [r for r in ledger(state["store"]) if r.kind == "review"]
    # Each attempt is in the ledger, refused: the other tenant's and the self-review.
    assert [(r.outcome, r.detail["reviewer"]) for r in refused] == [
        ("refused", "gina"),
        ("refused", "sam"),
    ]


def test_the_inbox_answers_with_strict_headers_and_limits_sign_ins(served):
    server, _state = served
    base = inbox_url(server)
    with httpx.Client(timeout=INNER_HANG_SECONDS) as http:
        page = http.get(f"{base}/login")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert "'unsafe-inline'" not in csp
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["cache-control"] == "no-store"
        # A name the inbox does not serve (DNS rebinding): refused.
        rebound = http.get(f"{base}/login", headers={"Host": "attacker.example"})
        assert rebound.status_code == 421
        # Without the sign-in form's own token: refused, even with a right credential.
        forged = http.post(f"{base}/login", data={"credential": TOKENS["maria"]})
        assert forged.status_code == 403
        token = page.cookies["capgate_inbox_login"]
        for _ in range(5):
            wrong = http.post(f"{base}/login", data={"credential": "guess", "login_csrf": token})
            assert wrong.status_code == 401
        limited = http.post(
            f"{base}/login", data={"credential": TOKENS["maria"], "login_csrf": token}
        )
        assert limited.status_code == 429
        assert "capgate_inbox" not in limited.cookies
    assert "guess" not in server.stderr


def test_a_person_signs_in_with_an_id_token_of_the_configured_issuer(tmp_path):
    issuer, audience = "https://login.example.test", "capgate-inbox"
    key, stranger = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in "ab")
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "k1"}]}))

    def id_token(signer: Any, sub: str = "sub-maria") -> str:
        now = int(time.time())
        claims = {"iss": issuer, "aud": audience, "sub": sub, "iat": now, "exp": now + 600}
        return jwt.encode(claims, signer, algorithm="RS256", headers={"kid": "k1"})

    store = seed_store(tmp_path / "state.db")
    config = write_config(
        tmp_path / "serve.yaml",
        http={"sales": (AGENT_TOKEN, SALES_BOT)},
        extra={
            "people": [{**person("maria"), "oidc_subject": "sub-maria"}],
            "oidc": {"issuer": issuer, "audience": audience, "jwks_file": str(jwks)},
        },
    )
    with (
        http_server(store, config, tmp_path / "record.jsonl") as server,
        httpx.Client(timeout=INNER_HANG_SECONDS) as http,
    ):
        base = inbox_url(server)
        token = http.get(f"{base}/login").cookies["capgate_inbox_login"]
        for refused in (id_token(stranger), id_token(key, sub="sub-nobody")):
            answer = http.post(f"{base}/login", data={"credential": refused, "login_csrf": token})
            assert answer.status_code == 401
        signed_in = http.post(
            f"{base}/login", data={"credential": id_token(key), "login_csrf": token}
        )
        assert signed_in.status_code == 303
        assert signed_in.headers["location"] == "/inbox/"
        page = http.get(f"{base}/")
        assert page.status_code == 200
        assert "Waiting for review" in page.text
        assert "maria" in page.text
        # A bearer token still names the same person.
        other = httpx.Client(timeout=INNER_HANG_SECONDS)
        with other:
            token = other.get(f"{base}/login").cookies["capgate_inbox_login"]
            by_token = other.post(
                f"{base}/login", data={"credential": TOKENS["maria"], "login_csrf": token}
            )
            assert by_token.status_code == 303
    assert "oidc:https://login.example.test" in server.stderr
