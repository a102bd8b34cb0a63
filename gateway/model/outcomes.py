"""The normalised result of running a tool.

Only adapters read provider-specific responses; everything above them sees one of
four statuses. ``unknown`` is the honest answer when the external state cannot be
known (the tool crashed half-way through a write): it always carries the contract's
recovery procedure, so nobody retries a payment blindly.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["Outcome", "OutcomeStatus", "ToolRefused", "ToolRetryable", "ToolUnknown"]


class OutcomeStatus(StrEnum):
    SUCCESS = "success"
    REFUSED = "refused"  # permanent: the provider said no; retrying will not help
    RETRYABLE = "retryable"  # nothing happened, or repeating is safe
    UNKNOWN = "unknown"  # the external effect may or may not have happened


class Outcome(BaseModel):
    """What one authorised call produced. ``result`` is untrusted tool output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str
    version: int
    operation_id: str
    status: OutcomeStatus
    result: dict[str, Any] | None = None
    error: str | None = None
    recovery: str | None = None
    retry_after_seconds: float | None = None
    decision_id: str | None = None
    #: The provider's receipt (the contract's ``receipt_field``) of a success.
    provider_receipt: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is OutcomeStatus.SUCCESS


class ToolRefused(Exception):
    """Raised by a tool when the provider permanently refused the action."""


class ToolRetryable(Exception):
    """Raised by a tool when the action did not happen and may be tried again."""

    def __init__(self, message: str, *, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class ToolUnknown(Exception):
    """Raised by a tool when it cannot know whether the action happened.

    For example a request that left for the provider and got no answer: the payment
    may or may not exist. The outcome is ``unknown`` with the contract's recovery
    procedure, and a retry of the operation looks the action up before sending
    anything again. ``retry_after_seconds`` is how long to wait before that lookup,
    where the tool knows it (a provider that says when its records settle).
    """

    def __init__(self, message: str, *, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds
