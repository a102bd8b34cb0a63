"""What a deployment says about notices: a webhook per tenant, and how to deliver.

``capgate serve`` and ``capgate worker`` read these from the ``notices`` section of
their configuration file; a library passes :class:`NoticeSettings` to the
:class:`~capgate.gateway.service.notices.notifier.Notifier`. The models are strict
(unknown keys refused), and every refusal names its field.

The secret is never in the file: a webhook names the environment variable that
holds it (``secret_env``), read when the notifier starts, so the file can be shown,
versioned and logged without giving away the key that makes notices believable.
"""

from __future__ import annotations

import os
import re
from typing import Final, Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from capgate.gateway.errors import ConfigError
from capgate.gateway.model.facts import Identifier

__all__ = [
    "EVENT_TYPES",
    "MIN_SECRET_BYTES",
    "EventType",
    "NoticeSettings",
    "TenantWebhook",
]

#: What a notice can be about, each a step of a proposal's life
#: (``docs/notices.md`` says which ledger row each comes from).
EventType = Literal[
    "proposal.created",
    "proposal.approved",
    "proposal.rejected",
    "proposal.dispatched",
    "proposal.outcome",
    "proposal.blocked",
    "proposal.given_up",
]
EVENT_TYPES: Final[tuple[EventType, ...]] = get_args(EventType)
#: The shortest secret accepted: 32 bytes, the size of the HMAC-SHA256 key it keys.
MIN_SECRET_BYTES: Final = 32
_ENV_NAME: Final = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


def _web_url(value: str, field: str) -> str:
    """``value`` if it is an absolute http(s) URL with a host and no credentials."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{field} must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"{field} must not carry a user or password: the webhook's secret is secret_env"
        )
    if parts.fragment:
        raise ValueError(f"{field} must not have a #fragment (it is never sent)")
    return value


class TenantWebhook(BaseModel):
    """One tenant's webhook: where its notices go, signed with which secret, which
    ones, and how hard to try."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Where notices are POSTed: http:// or https:// (https outside a test bench).
    url: str
    #: The environment variable holding the signing secret (at least 32 bytes).
    secret_env: str
    #: The events sent (default: all of them).
    events: list[EventType] = Field(default_factory=lambda: list(EVENT_TYPES), min_length=1)
    #: How long one delivery may take (connect, send, answer).
    timeout_seconds: float = Field(default=5.0, gt=0, le=120)
    #: Deliveries of one notice before it is recorded as failed for good.
    max_attempts: int = Field(default=8, ge=1, le=100)
    #: The wait before the second attempt, doubled for each one after it...
    first_backoff_seconds: float = Field(default=1.0, gt=0, le=86400)
    #: ... up to this (also the most a receiver's Retry-After can ask for).
    longest_backoff_seconds: float = Field(default=300.0, gt=0, le=86400)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _web_url(value, "url")

    @field_validator("secret_env")
    @classmethod
    def _secret_env(cls, value: str) -> str:
        if not _ENV_NAME.fullmatch(value):
            raise ValueError(
                "secret_env is the name of an environment variable (A-Z, 0-9 and _, "
                "not starting with a digit), not the secret itself"
            )
        return value

    @field_validator("events")
    @classmethod
    def _once_each(cls, value: list[EventType]) -> list[EventType]:
        if len(set(value)) != len(value):
            raise ValueError("events: an event is named twice")
        return value

    @model_validator(mode="after")
    def _backoff_grows(self) -> TenantWebhook:
        if self.longest_backoff_seconds < self.first_backoff_seconds:
            raise ValueError("longest_backoff_seconds is below first_backoff_seconds")
        return self

    def secret(self, tenant: str) -> bytes:
        """The signing secret from ``secret_env``; ConfigError naming the variable (never
        showing a value) when it is unset or too short."""
        value = os.environ.get(self.secret_env)
        if value is None:
            raise ConfigError(f"notices.tenants.{tenant}.secret_env: ${self.secret_env} is not set")
        key = value.encode("utf-8")
        if len(key) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"notices.tenants.{tenant}.secret_env: ${self.secret_env} holds fewer than "
                f"{MIN_SECRET_BYTES} bytes (make one with: openssl rand -hex 32)"
            )
        return key


class NoticeSettings(BaseModel):
    """The ``notices`` section: the inbox the notices link to, and each tenant's webhook."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The review inbox's base URL: a notice links to ``<inbox_url>/proposals/<id>``.
    inbox_url: str
    #: Each tenant's webhook, by tenant.
    tenants: dict[Identifier, TenantWebhook] = Field(min_length=1)
    #: How often to look for new ledger rows when no notice of a commit can reach
    #: the notifier (SQLite across processes, PostgreSQL while not listening).
    poll_seconds: float = Field(default=0.5, gt=0, le=3600)
    #: How long a notifier's hold on a tenant's notices lasts unless renewed: how soon
    #: another process takes over from one that died.
    claim_seconds: float = Field(default=60.0, gt=0, le=86400)

    @field_validator("inbox_url")
    @classmethod
    def _inbox(cls, value: str) -> str:
        return _web_url(value, "inbox_url").rstrip("/")

    def link(self, proposal_id: str) -> str:
        """The inbox's page of one proposal."""
        return f"{self.inbox_url}/proposals/{proposal_id}"

    def describe(self) -> str:
        """The tenants and hosts, for a start-up line (never a secret, never a path)."""
        return ", ".join(
            f"{tenant} -> {urlsplit(hook.url).hostname}" for tenant, hook in self.tenants.items()
        )
