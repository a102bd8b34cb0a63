"""A reviewed call that waits for its decision within the request (MCP 2026-07-28).

A client that asks for it (``_meta["capgate/await_review"]: true`` on ``tools/call``)
is not answered "proposed" but ``input_required``: an ``InputRequiredResult`` whose
only content is a resume state. The client sends the same call again with that
state; the server waits a while for the proposal's decision and answers with the
outcome once the worker ran it, with the refusal once a reviewer rejected it or a
dispatch was blocked, or with ``input_required`` and a fresh state meanwhile::

    tools/call (await_review) ──▶ proposed ──▶ input_required {state 1}
    tools/call {state 1} ──▶ wait ≤ await_seconds ──▶ input_required {state 2} ...
    tools/call {state n} ──▶ dispatched, outcome ──▶ the tool's result

**The resume state is the server's word, and the client's only once.** It is
``base64url(payload).base64url(HMAC-SHA256(key, payload))`` with a key only this
process holds; the payload names the proposal, the caller's binding, the digest of
the call's arguments and an expiry, and a nonce this process remembers until the
state expires: a state that was forged or altered, is another caller's, comes back
with other arguments, has expired or was used already is refused
(``resume_state_invalid``), and nothing is proposed again. A state outlives neither
its expiry nor the process (another process's states are unknown to it: the caller
asks ``capgate.proposals.status``).

**A client that cannot wait** (a handshake-era connection has no input-required
results) and asks to gets ``no_approval_surface`` before anything is proposed: it
should call without ``capgate/await_review`` and follow the proposal with
``capgate.proposals.status`` or its resource.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from capgate.adapters.fronts.answers import Answer, outcome_answer, refused_proposal_answer
from capgate.adapters.fronts.desk import ReviewDesk
from capgate.gateway.digest import params_digest
from capgate.gateway.errors import ResumeStateInvalid
from capgate.gateway.model.facts import Principal
from capgate.gateway.model.outcomes import Outcome, OutcomeStatus
from capgate.gateway.state.records import ProposalStatus

__all__ = ["AWAIT_META_KEY", "DEFAULT_AWAIT_SECONDS", "ResumeStates", "call_digest", "decided"]

#: The ``tools/call`` ``_meta`` key a client sets to wait for a reviewed call's decision.
AWAIT_META_KEY: Final = "capgate/await_review"
#: How long one round waits for a decision before answering ``input_required`` again.
DEFAULT_AWAIT_SECONDS: Final = 20.0
#: How long a resume state is good for: a few rounds, not a day.
STATE_TTL_SECONDS: Final = 600.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ResumeStates:
    """Issues and redeems the resume states of calls awaiting review, for one process."""

    def __init__(
        self,
        *,
        key: bytes | None = None,
        ttl_seconds: float = STATE_TTL_SECONDS,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        self._ttl = ttl_seconds
        self._now = now
        self._lock = threading.Lock()
        #: nonce -> expiry, of the states issued and not yet redeemed.
        self._open: dict[str, float] = {}

    def issue(self, caller: str, proposal_id: str, digest: str) -> str:
        """A state for this caller's proposal, whose call's arguments hash to ``digest``."""
        nonce = secrets.token_urlsafe(16)
        expires = self._now() + self._ttl
        payload = json.dumps(
            {"v": 1, "p": proposal_id, "c": caller, "d": digest, "e": expires, "n": nonce},
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        with self._lock:
            self._purge()
            self._open[nonce] = expires
        return f"{_b64(payload)}.{_b64(self._mac(payload))}"

    def redeem(self, state: object, caller: str, digest: str) -> str:
        """The proposal id of a state this process issued to ``caller`` for arguments
        that hash to ``digest``, not expired, not used: used up by this call.
        ResumeStateInvalid otherwise (saying which check failed, never the state)."""
        if not isinstance(state, str) or len(state) > 4096 or state.count(".") != 1:
            raise ResumeStateInvalid("it is not a resume state this server issued")
        body, mac = state.split(".")
        try:
            payload = _unb64(body)
            given = _unb64(mac)
        except ValueError:
            raise ResumeStateInvalid("it is not a resume state this server issued") from None
        if not hmac.compare_digest(given, self._mac(payload)):
            raise ResumeStateInvalid("its signature does not verify (altered, or another server's)")
        fields: dict[str, Any] = json.loads(payload)
        if fields.get("c") != caller:
            raise ResumeStateInvalid("it was issued to another caller")
        if fields.get("d") != digest:
            raise ResumeStateInvalid("it was issued for a call with other arguments")
        with self._lock:
            self._purge()
            if float(fields.get("e", 0)) <= self._now():
                raise ResumeStateInvalid("it has expired")
            if self._open.pop(str(fields.get("n")), None) is None:
                raise ResumeStateInvalid("it was used already")
        return str(fields["p"])

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    def _purge(self) -> None:
        now = self._now()
        for nonce in [n for n, expires in self._open.items() if expires <= now]:
            del self._open[nonce]


def call_digest(tool: str, arguments: Mapping[str, Any]) -> str:
    """The digest a resume state binds: the tool and the arguments as the client sent
    them (the same canonical form as a call's parameters)."""
    return params_digest({"tool": tool, "arguments": dict(arguments)})


#: Outcomes an awaited call answers with; a retryable or unknown one is the worker's
#: to try again or look up, so the call goes on waiting.
_FINAL: Final = frozenset({OutcomeStatus.SUCCESS, OutcomeStatus.REFUSED})


def decided(desk: ReviewDesk, principal: Principal, proposal_id: str) -> Answer | None:
    """The answer of an awaited proposal once it is settled for good: the outcome of
    its run, or its rejection or block; None while it is pending, approved, or
    dispatched without a final outcome."""
    view = desk.own_one(principal, proposal_id)
    proposal = view.proposal
    if proposal.status in (ProposalStatus.REJECTED, ProposalStatus.BLOCKED):
        return refused_proposal_answer(proposal)
    if view.operation is not None and view.operation.outcome is not None:
        outcome = Outcome.model_validate(view.operation.outcome)
        if outcome.status in _FINAL:
            return outcome_answer(outcome)
    return None
