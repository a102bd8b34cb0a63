"""Times in the store: one fixed-width ISO-8601 UTC text form, both backends.

Every time is stored as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``: always UTC, always
microseconds, always the same width. So comparing the text compares the times
(``lease_until < now`` is a plain string comparison, under PostgreSQL's ``"C"``
collation), both backends hold byte-identical values, and the ledger's hash covers
exactly the text that is stored. Reading one back gives an aware UTC datetime.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from capgate.gateway.errors import InvalidInput, StoreError, quote

__all__ = ["Clock", "from_text", "read_clock", "system_clock", "to_text"]

#: A store clock: returns the current time as a timezone-aware datetime.
Clock = Callable[[], datetime]

_FORM: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", re.ASCII)


def system_clock() -> datetime:
    """The default clock: the system's time in UTC."""
    return datetime.now(UTC)


def read_clock(clock: Clock) -> datetime:
    """Read ``clock`` once, in UTC; a naive or non-datetime reading is a StoreError.

    A naive datetime has no zone, so comparing it with stored UTC times would be off
    by the host's offset; refusing it is the only safe reading.
    """
    now = clock()
    if not isinstance(now, datetime) or now.tzinfo is None or now.utcoffset() is None:
        raise StoreError(
            f"the store's clock returned {type(now).__name__} without a timezone; "
            "it must return timezone-aware datetimes"
        )
    return now.astimezone(UTC)


def to_text(value: datetime, what: str = "time") -> str:
    """``value`` in the stored form; a naive datetime is InvalidInput naming ``what``."""
    if not isinstance(value, datetime):
        raise InvalidInput(f"{what}: must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(f"{what}: must be timezone-aware")
    # isoformat pads the year to four digits (strftime's %Y may not) and always
    # writes the microseconds with timespec="microseconds".
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def from_text(text: str) -> datetime:
    """Parse the stored form strictly; anything else is a StoreError (a damaged row)."""
    if not isinstance(text, str) or not _FORM.fullmatch(text):
        raise StoreError(f"stored time {quote(text, 40)} is not in the store's form")
    try:
        return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)
    except ValueError:  # the right shape, but e.g. month 13
        raise StoreError(f"stored time {quote(text, 40)} is not a valid time") from None
