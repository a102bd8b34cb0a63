"""The ``inbox:`` section of ``capgate serve``'s configuration.

The inbox is served beside ``/mcp`` whenever the service runs over HTTP and its
configuration names people (``people:``): with no one to sign in, there is no page.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["InboxSettings"]


class InboxSettings(BaseModel):
    """How the review inbox signs people in and keeps them signed in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Serve the inbox (when there are people to sign in).
    enabled: bool = True
    #: A session ends after this long without a request ...
    idle_minutes: float = Field(default=30, gt=0, le=24 * 60)
    #: ... and this long after sign-in, whichever is first.
    session_hours: float = Field(default=8, gt=0, le=7 * 24)
    #: Failed sign-ins allowed per client address within the window, and in all.
    login_failures_per_address: int = Field(default=5, ge=1, le=1000)
    login_failures_in_all: int = Field(default=50, ge=1, le=100_000)
    login_window_seconds: float = Field(default=300, gt=0, le=86_400)
    #: The origin people reach the inbox at through a TLS proxy
    #: (``https://review.example.com``): accepted as ``Host`` and ``Origin`` besides
    #: the loopback ones, and its cookies are marked ``Secure``.
    public_origin: str | None = Field(default=None, max_length=300)
    #: How often an open page asks whether anything changed, in seconds.
    live_update_seconds: float = Field(default=3, ge=0.5, le=300)

    @field_validator("public_origin")
    @classmethod
    def _an_origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme != "https" or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError("give the origin only, over https, such as https://review.example.com")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("give the origin only, over https, such as https://review.example.com")
        return f"https://{parts.netloc}"

    @property
    def secure_cookies(self) -> bool:
        return self.public_origin is not None
