"""Who is signed in to the inbox, and how often someone failed to sign in.

Sessions are kept in this process, server-side: the browser holds a random session
id in an ``HttpOnly`` ``SameSite=Strict`` cookie and nothing else. The table is keyed
by the id's SHA-256, so the ids themselves are held only by the browsers. A session
carries the authenticated :class:`~capgate.gateway.model.facts.Reviewer` (never a
name the browser sends), its CSRF token and when it ends: after ``idle`` without a
request, or ``lifetime`` after sign-in, whichever comes first. Signing in always opens
a new session (a session id planted before sign-in is never promoted), and signing out
forgets it. A restart of the process signs everyone out; two processes behind one
address do not share sessions (put the inbox of one process behind the proxy).

:class:`LoginLimiter` counts failed sign-ins per client address and in all, within a
sliding window; past either limit a sign-in is refused before its credential is
checked. Its clock is a parameter, so its tests never wait.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from capgate.gateway.errors import LoginLimited
from capgate.gateway.model.facts import Reviewer

__all__ = ["LoginLimiter", "Session", "Sessions", "new_token", "same_token"]

#: Random bytes in a session id and a CSRF token (256 bits).
_TOKEN_BYTES: Final = 32
#: Sessions kept at most; the least recently used goes first past this.
MAX_SESSIONS: Final = 10_000


def new_token() -> str:
    return secrets.token_urlsafe(_TOKEN_BYTES)


def same_token(given: object, expected: str) -> bool:
    """``given`` is ``expected``, compared in constant time (False for a non-string)."""
    return isinstance(given, str) and hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8")
    )


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Session:
    """One signed-in reviewer."""

    reviewer: Reviewer
    csrf: str
    started: float
    seen: float
    #: A message for the next page shown (what the last decision did), then dropped.
    flash: tuple[str, str] | None = field(default=None)


class Sessions:
    """The signed-in reviewers of one inbox."""

    def __init__(
        self, *, idle_seconds: float, lifetime_seconds: float, now: Callable[[], float] = time.time
    ) -> None:
        self._idle = idle_seconds
        self._lifetime = lifetime_seconds
        self._now = now
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def open(self, reviewer: Reviewer) -> tuple[str, Session]:
        """A new session for ``reviewer``: its id (for the cookie) and the session."""
        session_id = new_token()
        now = self._now()
        session = Session(reviewer=reviewer, csrf=new_token(), started=now, seen=now)
        with self._lock:
            self._sessions[_key(session_id)] = session
            if len(self._sessions) > MAX_SESSIONS:
                oldest = min(self._sessions, key=lambda k: self._sessions[k].seen)
                del self._sessions[oldest]
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of this id (and it is seen now), or None."""
        if not session_id:
            return None
        key = _key(session_id)
        now = self._now()
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return None
            if now - session.seen > self._idle or now - session.started > self._lifetime:
                del self._sessions[key]
                return None
            session.seen = now
            return session

    def close(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._sessions.pop(_key(session_id), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)


class LoginLimiter:
    """Failed sign-ins per address and in all, within a sliding window."""

    def __init__(
        self,
        *,
        per_address: int,
        in_all: int,
        window_seconds: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_address = per_address
        self._in_all = in_all
        self._window = window_seconds
        self._now = now
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()

    def check(self, address: str) -> None:
        """LoginLimited when ``address`` (or everyone) failed too often lately."""
        now = self._now()
        with self._lock:
            self._expire(now)
            mine = self._failures.get(address, deque())
            full = [
                q
                for q, limit in ((mine, self._per_address), (self._all, self._in_all))
                if len(q) >= limit
            ]
            if full:
                wait = max(q[0] for q in full) + self._window - now
                raise LoginLimited(max(1, int(wait + 0.999)))

    def failed(self, address: str) -> None:
        now = self._now()
        with self._lock:
            self._failures.setdefault(address, deque()).append(now)
            self._all.append(now)

    def succeeded(self, address: str) -> None:
        """A sign-in from ``address`` worked: its own failures are forgotten."""
        with self._lock:
            self._failures.pop(address, None)

    def _expire(self, now: float) -> None:
        horizon = now - self._window
        while self._all and self._all[0] <= horizon:
            self._all.popleft()
        for address in list(self._failures):
            queue = self._failures[address]
            while queue and queue[0] <= horizon:
                queue.popleft()
            if not queue:
                del self._failures[address]
