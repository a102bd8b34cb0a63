"""How a webhook notice is signed, and how its receiver checks it.

A notice is one HTTP POST whose body is the event's JSON. The gateway signs it with
the tenant's secret; the receiver, holding the same secret, checks that the body and
the time it was signed are exactly what the gateway sent, recently::

    capgate-signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>
    capgate-event-id:  <the event's id, also in the body>

The signed bytes are the ASCII digits of ``t``, one ``.``, then the body's bytes
exactly as received (no re-serialising: a receiver that parses and dumps the JSON
again would sign other bytes). The timestamp is signed with the body, so an old
notice cannot be made to look new, and a receiver refuses one signed further from
its clock than the replay window (five minutes by default). Inside the window, a
receiver that remembers the event ids it has seen (for as long as the window) refuses
a second copy; the gateway delivers at least once and sends the same id again when
it could not record a delivery, so a receiver answers a notice it has already
handled with 2xx (``NoticeReplayed`` says which it is).

The ``v1`` comparison is constant-time (:func:`hmac.compare_digest`). A header may
carry several ``v1`` entries (a receiver rotating its secret accepts either);
unknown keys are ignored, so a later scheme can be added beside this one.

This module needs nothing but the standard library and capgate's error tree:
receivers written in Python use :func:`verify_notice`; ``docs/notices.md`` has the
scheme for other languages.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping, MutableSet
from typing import Any, Final

from capgate.gateway.errors import (
    NoticeOutsideWindow,
    NoticeReplayed,
    NoticeSignatureInvalid,
    quote,
)

__all__ = [
    "DEFAULT_WINDOW_SECONDS",
    "EVENT_ID_HEADER",
    "EVENT_TYPE_HEADER",
    "SIGNATURE_HEADER",
    "sign_notice",
    "signature_header",
    "verify_notice",
]

#: The header carrying the timestamp and the signature.
SIGNATURE_HEADER: Final = "capgate-signature"
#: The header repeating the event's id (the body's ``id`` is the signed one).
EVENT_ID_HEADER: Final = "capgate-event-id"
#: The header repeating the event's type, for routing without parsing the body.
EVENT_TYPE_HEADER: Final = "capgate-event"
#: How far from the receiver's clock a signature's time may be, by default.
DEFAULT_WINDOW_SECONDS: Final = 300.0
#: The longest header a receiver reads: a few signatures, never a document.
_MAX_HEADER: Final = 4096
#: Digits of a timestamp: unix seconds stay below 12 digits for 30,000 years.
_MAX_DIGITS: Final = 12


def _key(secret: str | bytes) -> bytes:
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("a notice secret is not empty")
    return key


def sign_notice(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``b"<timestamp>." + body`` under ``secret``."""
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError("a notice's timestamp is a whole number of unix seconds")
    signed = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(_key(secret), signed, hashlib.sha256).hexdigest()


def signature_header(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """The ``capgate-signature`` value for ``body`` signed at ``timestamp``."""
    return f"t={timestamp},v1={sign_notice(secret, timestamp, body)}"


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value whatever its case (HTTP names are case-insensitive)."""
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def _parse(value: str) -> tuple[int, list[str]]:
    """``t`` and every ``v1`` of a signature header; NoticeSignatureInvalid if malformed."""
    if len(value) > _MAX_HEADER:
        raise NoticeSignatureInvalid(f"{SIGNATURE_HEADER}: longer than {_MAX_HEADER} characters")
    timestamp: int | None = None
    signatures: list[str] = []
    for part in value.split(","):
        key, sep, item = part.strip().partition("=")
        if not sep:
            raise NoticeSignatureInvalid(f"{SIGNATURE_HEADER}: {quote(part)} is not key=value")
        if key == "t":
            if timestamp is not None:
                raise NoticeSignatureInvalid(f"{SIGNATURE_HEADER}: t is given twice")
            if not (item.isascii() and item.isdigit() and len(item) <= _MAX_DIGITS):
                raise NoticeSignatureInvalid(f"{SIGNATURE_HEADER}: t is not unix seconds")
            timestamp = int(item)
        elif key == "v1":
            signatures.append(item)
    if timestamp is None:
        raise NoticeSignatureInvalid(f"{SIGNATURE_HEADER}: no t= (the time it was signed)")
    if not signatures:
        raise NoticeSignatureInvalid(f"{SIGNATURE_HEADER}: no v1= signature")
    return timestamp, signatures


def verify_notice(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    window_seconds: float = DEFAULT_WINDOW_SECONDS,
    seen: MutableSet[str] | None = None,
) -> dict[str, Any]:
    """Check a received notice and return its event (the body's JSON object).

    ``headers`` are the request's (any case), ``body`` its bytes as received, ``now``
    the receiver's unix time (default: the clock). Raises, each a
    :class:`~capgate.gateway.errors.NoticeRejected`:

    - ``NoticeSignatureInvalid``: no or a malformed ``capgate-signature``, no ``v1``
      that is the HMAC of ``t`` and these bytes under ``secret`` (the body or the
      timestamp changed, another secret), a body that is not a JSON object with an
      ``id``, or a ``capgate-event-id`` header other than that id;
    - ``NoticeOutsideWindow``: signed more than ``window_seconds`` before or after ``now``;
    - ``NoticeReplayed``: with ``seen`` given, an id already in it. A notice that
      passes every check has its id added to ``seen``, so keep the ids for at least
      the window (an older copy fails the window check anyway).

    The signature is checked before anything else is read, so an unsigned request
    never reaches the JSON parser or ``seen``.
    """
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError("verify_notice checks the body's bytes as received, not a parsed value")
    body = bytes(body)
    key = _key(secret)
    value = _header(headers, SIGNATURE_HEADER)
    if value is None:
        raise NoticeSignatureInvalid(f"no {SIGNATURE_HEADER} header: not a signed notice")
    timestamp, signatures = _parse(value)
    expected = hmac.new(
        key, str(timestamp).encode("ascii") + b"." + body, hashlib.sha256
    ).hexdigest()
    # Every candidate is compared (no early exit), each in constant time.
    matches = [hmac.compare_digest(expected, given.strip().lower()) for given in signatures]
    if not any(matches):
        raise NoticeSignatureInvalid(
            f"{SIGNATURE_HEADER}: no v1 signature matches this body and timestamp under "
            "this secret (changed in transit, or signed with another secret)"
        )
    clock = time.time() if now is None else float(now)
    if abs(clock - timestamp) > window_seconds:
        raise NoticeOutsideWindow(
            f"signed {clock - timestamp:.0f} s from this receiver's clock, outside the "
            f"{window_seconds:.0f} s window: an old notice replayed, or a clock that is wrong"
        )
    try:
        event = json.loads(body)
    except ValueError:
        raise NoticeSignatureInvalid("the signed body is not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("id"), str):
        raise NoticeSignatureInvalid("the signed body is not an event (a JSON object with an id)")
    event_id: str = event["id"]
    named = _header(headers, EVENT_ID_HEADER)
    if named is not None and named != event_id:
        raise NoticeSignatureInvalid(
            f"{EVENT_ID_HEADER} is not the signed body's id (the header was changed)"
        )
    if seen is not None:
        if event_id in seen:
            raise NoticeReplayed(f"event {quote(event_id)} was received already")
        seen.add(event_id)
    return event
