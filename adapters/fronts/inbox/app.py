"""The review inbox: a small web application at ``/inbox`` for people who review.

A person signs in with their credential (a bearer token of ``people:``, or an OIDC ID
token when an issuer is configured), sees their tenant's pending proposals and the
decided ones, opens one to read its exact content (untrusted data an agent wrote,
always rendered escaped), and approves or rejects it with a comment. Every rule is the
review desk's (:class:`~capgate.adapters.fronts.desk.ReviewDesk`) and every verdict
the review policy's: the page only carries the signed-in reviewer to the desk, with
the digest of the content it showed.

How it keeps a browser's requests honest (each rule here, once):

- **Host and origin.** A request for a host the inbox does not serve is refused (DNS
  rebinding); a state change whose ``Origin`` is another origin, or whose
  ``Sec-Fetch-Site`` is not ``same-origin``, is refused as
  :class:`~capgate.gateway.errors.RequestForged`, and so is one without the
  session's CSRF token (a pre-session token for the sign-in form itself).
- **Cookies** hold a random id only: ``HttpOnly``, ``SameSite=Strict``, path
  ``/inbox``, ``Secure`` behind a TLS proxy (``inbox.public_origin``).
- **Headers** on every answer: a Content-Security-Policy allowing this origin's own
  script and style and nothing else (no inline script, no frames, forms post here
  only), ``no-store``, ``nosniff``, no referrer to other sites, no framing.
- **Nothing of a proposal in a URL or a log line**: URLs carry ids; the digest a
  verdict names travels in the form body; log lines name ids and codes.
- **Sign-in attempts are limited** per address and in all (:mod:`.sessions`).

Pages ask ``/inbox/changes`` every few seconds (the only script: ``static/inbox.js``):
the list reloads itself when anything changed, an open proposal says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import anyio.to_thread
from jinja2 import Environment, PackageLoader
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capgate.adapters.fronts.answers import quorum_text
from capgate.adapters.fronts.desk import ProposalView, ReviewDesk
from capgate.adapters.fronts.inbox.sessions import (
    LoginLimiter,
    Session,
    Sessions,
    new_token,
    same_token,
)
from capgate.adapters.fronts.inbox.settings import InboxSettings
from capgate.adapters.fronts.people import People
from capgate.gateway.errors import (
    AuthenticationFailed,
    CapabilityViolation,
    CapgateError,
    InvalidInput,
    LoginLimited,
    ProposalStale,
    RequestForged,
    UnknownProposal,
)
from capgate.gateway.model.facts import ConnectionStatus, Reviewer
from capgate.gateway.service.proposals import person_of
from capgate.gateway.state.records import (
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
)

__all__ = ["INBOX_PATH", "Inbox"]

log = logging.getLogger("capgate.inbox")

#: Where the inbox is served.
INBOX_PATH: Final = "/inbox"
SESSION_COOKIE: Final = "capgate_inbox"
LOGIN_COOKIE: Final = "capgate_inbox_login"
#: The largest request body a form may have (a comment, a credential).
MAX_BODY: Final = 64 * 1024
#: The longest credential accepted from the sign-in form.
MAX_CREDENTIAL: Final = 16 * 1024

_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS: Final = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    # Not no-referrer: under it Chromium sends ``Origin: null`` with the inbox's own
    # forms, which the origin check must refuse. same-origin keeps URLs (ids only)
    # from other sites all the same.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]
_STATIC: Final = {
    "inbox.css": "text/css; charset=utf-8",
    "inbox.js": "text/javascript; charset=utf-8",
}
_VERDICTS: Final = {"approve": "approved", "reject": "rejected"}


class Inbox:
    """The inbox of one service: its sessions, its sign-in limits, its pages."""

    def __init__(
        self,
        desk: ReviewDesk,
        people: People,
        settings: InboxSettings,
        *,
        hosts: list[str],
        now: Callable[[], float] = time.time,
    ) -> None:
        self.desk = desk
        self.people = people
        self.settings = settings
        self.sessions = Sessions(
            idle_seconds=settings.idle_minutes * 60,
            lifetime_seconds=settings.session_hours * 3600,
            now=now,
        )
        self.limiter = LoginLimiter(
            per_address=settings.login_failures_per_address,
            in_all=settings.login_failures_in_all,
            window_seconds=settings.login_window_seconds,
        )
        origins = {f"http://{host}" for host in hosts}
        allowed_hosts = set(hosts)
        if settings.public_origin is not None:
            origins.add(settings.public_origin)
            allowed_hosts.add(settings.public_origin.removeprefix("https://"))
        self._hosts = frozenset(h.lower() for h in allowed_hosts)
        self._origins = frozenset(o.lower() for o in origins)
        self._templates = Environment(
            loader=PackageLoader("capgate.adapters.fronts.inbox", "templates"),
            autoescape=True,  # every value is escaped unless a template says otherwise (none does)
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._static = {name: _read_static(name) for name in _STATIC}

    # -- the application ------------------------------------------------------------------

    def app(self) -> ASGIApp:
        """The ASGI app to mount at :data:`INBOX_PATH`, behind its guard."""
        routes = [
            Route("/", self.index, methods=["GET"]),
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/changes", self.changes, methods=["GET"]),
            Route("/proposals/{proposal_id}", self.proposal, methods=["GET"]),
            Route("/proposals/{proposal_id}/decide", self.decide, methods=["POST"]),
            Route("/static/{name}", self.static, methods=["GET"]),
        ]

        async def forged(_request: Request, error: Exception) -> Response:
            assert isinstance(error, RequestForged)
            return self._refused(error, 403)

        async def invalid(_request: Request, error: Exception) -> Response:
            assert isinstance(error, InvalidInput)
            return self._refused(error, 400)

        app = Starlette(
            routes=routes, exception_handlers={RequestForged: forged, InvalidInput: invalid}
        )
        return _Guard(app, self._hosts, self._origins, self._refused)

    # -- pages ------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return _redirect("/login")
        reviewer = session.reviewer
        pending, decided = await _blocking(
            lambda: (self.desk.pending(reviewer), self.desk.history(reviewer))
        )
        return self._page(
            "inbox.html",
            session,
            pending=[_row(p) for p in pending],
            decided=[_row(p) for p in decided],
            version=_version([*pending, *decided]),
            changes_url=f"{INBOX_PATH}/changes",
            live="reload",
        )

    async def proposal(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return _redirect("/login")
        proposal_id = request.path_params["proposal_id"]
        try:
            view = await _blocking(lambda: self.desk.show(session.reviewer, proposal_id))
        except (UnknownProposal, InvalidInput):
            return self._no_such_proposal(session)
        valid_until = datetime.now(UTC) + self.desk.gateway.approval_ttl
        return self._page(
            "proposal.html",
            session,
            p=_row(view.proposal),
            view=view,
            fields=_fields(view.proposal.params),
            reviews=[_review(r) for r in view.reviews],
            outcome=view.outcome(),
            connection=_connection(view),
            quorum=quorum_text(view.quorum) if view.quorum is not None else None,
            # Approving again would count once: the page says so instead of asking.
            approved_already=view.quorum is not None
            and any(
                r.verdict is ReviewVerdict.APPROVED
                and r.expires_at > datetime.now(UTC)
                and person_of(r.reviewer) == person_of(session.reviewer)
                for r in view.reviews
            ),
            valid_until=_when(valid_until),
            approval_ttl=_duration(self.desk.gateway.approval_ttl.total_seconds()),
            version=_version([view.proposal], reviews=len(view.reviews)),
            changes_url=f"{INBOX_PATH}/changes?proposal={view.proposal.id}",
            live="notice",
        )

    async def changes(self, request: Request) -> Response:
        """What the open page compares its own version with."""
        session = self._session(request)
        if session is None:
            return JSONResponse({"error": "authentication_failed"}, status_code=401)
        reviewer = session.reviewer
        proposal_id = request.query_params.get("proposal")

        def version() -> str:
            if proposal_id is None:
                return _version([*self.desk.pending(reviewer), *self.desk.history(reviewer)])
            view = self.desk.show(reviewer, proposal_id)
            return _version([view.proposal], reviews=len(view.reviews))

        try:
            return JSONResponse({"version": await _blocking(version)})
        except (UnknownProposal, InvalidInput):
            return JSONResponse({"error": "unknown_proposal"}, status_code=404)

    async def decide(self, request: Request) -> Response:
        session = self._session(request)
        if session is None:
            return _redirect("/login")
        form = await self._form(request)
        if not same_token(form.get("csrf"), session.csrf):
            raise RequestForged("the form carries no valid CSRF token; nothing was decided")
        proposal_id = request.path_params["proposal_id"]
        verdict = _VERDICTS.get(str(form.get("verdict")))
        comment = str(form.get("comment") or "").strip() or None
        digest = str(form.get("digest") or "")
        if verdict is None:
            session.flash = ("error", "Choose approve or reject.")
            return _redirect(f"/proposals/{proposal_id}")
        reviewer = session.reviewer
        try:
            review = await _blocking(
                lambda: self.desk.decide(
                    reviewer, proposal_id, verdict, digest=digest, comment=comment
                )
            )
        except ProposalStale:
            session.flash = (
                "error",
                "Stale: the proposal's content is not what you were shown. Nothing was "
                "decided; read it again.",
            )
        except CapabilityViolation as refused:
            codes = refused.reason_codes
            if "tenant_mismatch" in codes:
                # Refused and recorded; shown as the page for an id that exists nowhere.
                return self._no_such_proposal(session)
            if "proposal_not_pending" in codes:
                session.flash = ("error", "Already decided: someone decided this proposal first.")
            else:
                session.flash = (
                    "error",
                    f"The review policy refused your verdict ({', '.join(codes)}). "
                    "Nothing was decided.",
                )
        except UnknownProposal:
            return self._no_such_proposal(session)
        except InvalidInput as bad:
            session.flash = ("error", str(bad))
        else:
            quorum = (
                await _blocking(lambda: self.desk.progress(review.proposal_id))
                if review.verdict.value == "approved"
                else None
            )
            if quorum is not None:
                session.flash = (
                    "ok",
                    f"Approval recorded. {quorum_text(quorum)}; it stays pending until they have.",
                )
            elif review.verdict.value == "approved":
                session.flash = (
                    "ok",
                    "Approved. An execution worker dispatches it, asking the policy again first.",
                )
            else:
                session.flash = ("ok", "Rejected. It will not run.")
            log.info(
                "inbox: %s %s proposal %s (review %s)",
                reviewer.id,
                review.verdict.value,
                review.proposal_id,
                review.id,
            )
        return _redirect(f"/proposals/{proposal_id}")

    # -- signing in and out -----------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        if self._session(request) is not None:
            return _redirect("/")
        return self._login_form(request)

    async def login(self, request: Request) -> Response:
        form = await self._form(request)
        expected = request.cookies.get(LOGIN_COOKIE)
        if not expected or not same_token(form.get("login_csrf"), expected):
            raise RequestForged("the sign-in form carries no valid CSRF token")
        address = request.client.host if request.client is not None else "unknown"
        try:
            self.limiter.check(address)
        except LoginLimited as limited:
            log.warning("inbox: sign-in from %s refused: %s", address, limited)
            return self._login_form(request, error=str(limited), status_code=429)
        credential = form.get("credential")
        try:
            reviewer = self._authenticate(credential)
        except AuthenticationFailed as failed:
            self.limiter.failed(address)
            log.warning("inbox: sign-in from %s refused: %s", address, failed)
            return self._login_form(
                request, error="Sign-in failed: that credential names no one.", status_code=401
            )
        self.limiter.succeeded(address)
        session_id, _session = self.sessions.open(reviewer)
        log.info("inbox: %s signed in (%s)", reviewer.id, reviewer.authenticated_by)
        response = _redirect("/")
        self._set_cookie(response, SESSION_COOKIE, session_id)
        response.delete_cookie(LOGIN_COOKIE, path=INBOX_PATH)
        return response

    async def logout(self, request: Request) -> Response:
        session = self._session(request)
        if session is not None:
            form = await self._form(request)
            if not same_token(form.get("csrf"), session.csrf):
                raise RequestForged("the form carries no valid CSRF token; still signed in")
            self.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = _redirect("/login")
        response.delete_cookie(SESSION_COOKIE, path=INBOX_PATH)
        return response

    def _authenticate(self, credential: object) -> Reviewer:
        if not isinstance(credential, str) or not credential.strip():
            raise AuthenticationFailed("no credential given")
        credential = credential.strip()
        if len(credential) > MAX_CREDENTIAL:
            raise AuthenticationFailed("the credential is too long")
        try:
            return self.people.by_token(credential)
        except AuthenticationFailed:
            # Not a person's bearer token: an ID token, when an issuer is configured.
            if self.people.config.oidc is None or credential.count(".") != 2:
                raise
        return self.people.by_id_token(credential)

    def _login_form(
        self, request: Request, *, error: str | None = None, status_code: int = 200
    ) -> Response:
        token = request.cookies.get(LOGIN_COOKIE) or new_token()
        response = self._render(
            "login.html",
            status_code=status_code,
            login_csrf=token,
            error=error,
            oidc=self.people.config.oidc is not None,
        )
        self._set_cookie(response, LOGIN_COOKIE, token, max_age=3600)
        return response

    # -- static files -----------------------------------------------------------------------

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self._static:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(self._static[name], media_type=_STATIC[name])

    # -- helpers ----------------------------------------------------------------------------

    def _session(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(SESSION_COOKIE))

    async def _form(self, request: Request) -> FormData:
        length = request.headers.get("content-length")
        if length is None or not length.isdigit() or int(length) > MAX_BODY:
            raise InvalidInput(f"the form must say its length and be at most {MAX_BODY} bytes")
        return await request.form(max_files=0, max_fields=10, max_part_size=MAX_BODY)

    def _set_cookie(
        self, response: Response, name: str, value: str, *, max_age: int | None = None
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=INBOX_PATH,
            httponly=True,
            samesite="strict",
            secure=self.settings.secure_cookies,
        )

    def _no_such_proposal(self, session: Session) -> Response:
        """The one page for an id of another tenant and for an id that exists nowhere."""
        session.flash = None
        return self._page(
            "message.html",
            session,
            status_code=404,
            title="No such proposal",
            message="There is no proposal of that id in your tenant.",
        )

    def _page(
        self, template: str, session: Session, *, status_code: int = 200, **values: Any
    ) -> Response:
        flash, session.flash = session.flash, None
        return self._render(
            template,
            status_code=status_code,
            reviewer=session.reviewer,
            csrf=session.csrf,
            flash=flash,
            interval_ms=int(self.settings.live_update_seconds * 1000),
            **values,
        )

    def _render(self, template: str, *, status_code: int = 200, **values: Any) -> Response:
        html = self._templates.get_template(template).render(base=INBOX_PATH, **values)
        return HTMLResponse(html, status_code=status_code)

    def _refused(self, error: CapgateError, status_code: int) -> Response:
        log.warning("inbox: refused a request: %s (%s)", error, error.code)
        return self._render(
            "message.html",
            status_code=status_code,
            reviewer=None,
            title="Request refused",
            message=f"{error} ({error.code})",
        )


class _Guard:
    """Host and origin checks before the inbox, and security headers on every answer."""

    def __init__(
        self,
        app: ASGIApp,
        hosts: frozenset[str],
        origins: frozenset[str],
        refused: Callable[[CapgateError, int], Response],
    ) -> None:
        self._app = app
        self._hosts = hosts
        self._origins = origins
        self._refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in _HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *_HEADERS]}
            await send(message)

        headers = _headers(scope)
        refusal = self._check(scope["method"], headers)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        await self._app(scope, receive, send_with_headers)

    def _check(self, method: str, headers: Mapping[str, str]) -> Response | None:
        if headers.get("host", "").lower() not in self._hosts:
            return self._refused(RequestForged("the inbox does not serve this host name"), 421)
        if method in ("GET", "HEAD"):
            return None
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in self._origins:
            return self._refused(RequestForged("the request comes from another origin"), 403)
        site = headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            return self._refused(RequestForged("the request comes from another site"), 403)
        return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _blocking(work: Callable[[], Any]) -> Any:
    """Run the desk's blocking work (the store, OPA) off the event loop."""
    return await anyio.to_thread.run_sync(work)


def _redirect(path: str) -> Response:
    return RedirectResponse(f"{INBOX_PATH}{path}", status_code=303)


def _read_static(name: str) -> bytes:
    from importlib.resources import files

    return (files("capgate.adapters.fronts.inbox") / "static" / name).read_bytes()


# -- what the templates show ------------------------------------------------------------------


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _row(p: ProposalRecord) -> dict[str, Any]:
    proposer = p.proposer
    return {
        "id": p.id,
        "tool": p.tool,
        "version": p.contract_version,
        "status": p.status.value,
        "pending": p.status is ProposalStatus.PENDING,
        "proposer": proposer.agent,
        "proposer_role": proposer.role,
        "acts_for": proposer.acts_for,
        "task_id": p.task_id,
        "environment": p.environment,
        "digest": p.params_digest,
        "decision_id": p.decision_id,
        "reason_codes": list(p.reason_codes),
        "created_at": _when(p.created_at),
        "updated_at": _when(p.updated_at),
        "recipient": _recipient(p.params),
        "twins": list(p.unsettled_twins),
    }


def _fields(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each parameter as the reviewer reads it: a string as its own text (an email's
    body with its lines), anything else as JSON."""
    return [
        (name, value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False))
        for name, value in sorted(params.items())
    ]


def _recipient(params: Mapping[str, Any]) -> str | None:
    """The parameter a reviewer most needs to see apart: who it goes to."""
    for name in ("recipient", "to", "email", "payee", "account"):
        value = params.get(name)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
    return None


def _review(review: ReviewRecord) -> dict[str, Any]:
    who = review.reviewer
    return {
        "verdict": review.verdict.value,
        "reviewer": who.id,
        "display_name": who.display_name,
        "kind": who.kind,
        "authenticated_by": who.authenticated_by,
        "at": _when(review.created_at),
        "expires_at": _when(review.expires_at),
        "used": review.consumed_at is not None,
        "comment": review.comment,
    }


def _connection(view: ProposalView) -> dict[str, Any] | None:
    if view.connection_alias is None:
        return None
    record = view.connection
    return {
        "alias": view.connection_alias,
        "status": record.status.value if record is not None else "missing",
        "active": record is not None and record.status is ConnectionStatus.ACTIVE,
        "account": record.account if record is not None else None,
    }


def _version(proposals: list[ProposalRecord], *, reviews: int = 0) -> str:
    """A short digest of what a page shows: it changes when any proposal on it does."""
    seen = sorted((p.id, p.status.value, p.updated_at.isoformat()) for p in proposals)
    body = json.dumps([seen, reviews], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]
