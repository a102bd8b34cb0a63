"""The ``format`` values capgate checks, each strictly and by its own code.

jsonschema's stock checks are lenient where it matters to a gateway: its ``email``
check is ``"@" in value``, so ``"buyer@example.test\\nBcc: attacker@evil.test"``
passes, and other formats are skipped unless optional packages are installed. A
format capgate cannot check strictly is refused when the catalogue loads (see
:mod:`capgate.gateway.schema.validator`), so no ``format`` in a catalogue is ever silently
unchecked. Every check here reads the text exactly: whole-string matches only
(Python's ``$`` would accept a final newline), ASCII digits only (``\\d`` and
``int()`` accept other scripts' digits).

=============  =====================================================================
format         accepted
=============  =====================================================================
``email``      RFC 5321/5322 ``addr-spec`` as a mailbox: a dot-atom local part of at
               most 64 characters, ``@``, a DNS domain of at least two labels whose
               last label is not all digits; at most 254 characters; ASCII only. No
               quoted local parts, comments, display names, address literals,
               whitespace or control characters.
``hostname``   RFC 1123: dot-separated labels of letters, digits and inner hyphens,
               1 to 63 characters each, at most 253 in all, no trailing dot; a label
               with ``--`` in positions 3-4 must be a valid ``xn--`` A-label.
``ipv4``       dotted quad, each part 0-255 without leading zeros.
``ipv6``       RFC 4291 text form (``::`` and an embedded IPv4 allowed), no zone id.
``uri``        RFC 3986 absolute ``URI`` (scheme required), ASCII only, with
               percent-escapes well formed and IP literals checked.
``uuid``       RFC 4122 ``8-4-4-4-12`` hex digits, any version, either case.
``date``       RFC 3339 ``full-date``, a real calendar date.
``time``       RFC 3339 ``full-time``: ``HH:MM:SS[.frac]`` with ``Z`` or ``±HH:MM``.
``date-time``  RFC 3339 ``date-time`` with ``T`` (or ``t``); a leap second only at
               23:59:60 UTC.
``regex``      an ECMA-262 regular expression (``u`` flag), as ``pattern`` uses.
=============  =====================================================================

A format applies to strings only; any other type passes it, as JSON Schema says.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Final

import regress

__all__ = ["FORMATS", "compile_ecma_regex"]


def compile_ecma_regex(pattern: str) -> regress.Regex:
    """Compile ``pattern`` as ECMA-262 with the ``u`` flag (raises on a bad pattern).

    ``u`` gives code-point semantics (what a JSON string holds) and refuses escapes
    that other dialects accept silently: ``\\Z`` or ``\\A`` would otherwise mean a
    literal letter.
    """
    return regress.Regex(pattern, "u")


# ------------------------------------------------------------------ names


_LABEL: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _label_ok(label: str) -> bool:
    if not _LABEL.fullmatch(label):
        return False
    if label[2:4] != "--":
        return True
    # RFC 5891 5.4: "??--" labels are reserved; only a decodable A-label may use it.
    if label[:4].lower() != "xn--" or len(label) == 4:
        return False
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
    except UnicodeError:
        return False
    return not decoded.isascii()


def is_hostname(value: str, *, min_labels: int = 1) -> bool:
    if not value.isascii() or len(value) > 253:
        return False
    labels = value.split(".")
    return len(labels) >= min_labels and all(_label_ok(label) for label in labels)


_ATEXT: Final = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_DOT_ATOM: Final = re.compile(rf"{_ATEXT}+(?:\.{_ATEXT}+)*")


def is_email(value: str) -> bool:
    if not value.isascii() or len(value) > 254:
        return False
    local, at, domain = value.rpartition("@")
    if not at or not local or len(local) > 64 or not _DOT_ATOM.fullmatch(local):
        return False
    if not is_hostname(domain, min_labels=2):
        return False
    return not domain.rsplit(".", 1)[-1].isdigit()


# -------------------------------------------------------------- addresses


_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_IPV4: Final = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def is_ipv4(value: str) -> bool:
    return _IPV4.fullmatch(value) is not None


def is_ipv6(value: str) -> bool:
    if not value.isascii() or "%" in value or not 2 <= len(value) <= 45:
        return False
    if not re.fullmatch(r"[0-9A-Fa-f:.]+", value):
        return False
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


def is_uuid(value: str) -> bool:
    return _UUID.fullmatch(value) is not None


_UUID: Final = re.compile(
    r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
)

# RFC 3986, appendix A.
_UNRESERVED: Final = r"A-Za-z0-9\-._~"
_SUB_DELIMS: Final = r"!$&'()*+,;="
_PCT: Final = r"%[0-9A-Fa-f]{2}"
_PCHAR: Final = rf"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_SEGMENT: Final = rf"{_PCHAR}*"
_SEGMENT_NZ: Final = rf"{_PCHAR}+"
_URI: Final = re.compile(
    rf"""
    (?P<scheme>[A-Za-z][A-Za-z0-9+\-.]*):
    (?:
        //(?P<authority>
            (?:(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*@)?
            (?P<host>\[[^\]/?#@]*\]|(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*)
            (?::[0-9]*)?
        )
        (?:/{_SEGMENT})*
      | /(?:{_SEGMENT_NZ}(?:/{_SEGMENT})*)?
      | {_SEGMENT_NZ}(?:/{_SEGMENT})*
      |
    )
    (?:\?(?:{_PCHAR}|[/?])*)?
    (?:\#(?:{_PCHAR}|[/?])*)?
    """,
    re.VERBOSE,
)
_IPVFUTURE: Final = re.compile(rf"v[0-9A-Fa-f]+\.[{_UNRESERVED}{_SUB_DELIMS}:]+")


def is_uri(value: str) -> bool:
    if not value.isascii():
        return False
    match = _URI.fullmatch(value)
    if match is None:
        return False
    host = match.group("host")
    if host and host.startswith("["):
        inner = host[1:-1]
        return is_ipv6(inner) or _IPVFUTURE.fullmatch(inner) is not None
    return True


# ------------------------------------------------------------------ times


_DATE: Final = r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
_TIME: Final = (
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?:\.[0-9]+)?"
    r"(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))"
)
_DATE_RE: Final = re.compile(_DATE)
_TIME_RE: Final = re.compile(_TIME)
_DATE_TIME_RE: Final = re.compile(rf"{_DATE}[Tt]{_TIME}")
_DAYS: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _date_ok(match: re.Match[str]) -> bool:
    year, month, day = int(match["year"]), int(match["month"]), int(match["day"])
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 1 <= day <= _DAYS[month - 1] + (1 if month == 2 and leap else 0)


def _time_ok(match: re.Match[str]) -> bool:
    hour, minute, second = int(match["hour"]), int(match["minute"]), int(match["second"])
    offset = 0
    if match["z"] is None:
        off_hour, off_minute = int(match["off_hour"]), int(match["off_minute"])
        if off_hour > 23 or off_minute > 59:
            return False
        offset = (off_hour * 60 + off_minute) * (1 if match["sign"] == "+" else -1)
    if hour > 23 or minute > 59 or second > 60:
        return False
    # A leap second is inserted at the end of a UTC day, whatever the local offset.
    return second < 60 or (hour * 60 + minute - offset) % 1440 == 23 * 60 + 59


def is_date(value: str) -> bool:
    match = _DATE_RE.fullmatch(value)
    return match is not None and _date_ok(match)


def is_time(value: str) -> bool:
    match = _TIME_RE.fullmatch(value)
    return match is not None and _time_ok(match)


def is_date_time(value: str) -> bool:
    match = _DATE_TIME_RE.fullmatch(value)
    return match is not None and _date_ok(match) and _time_ok(match)


def is_regex(value: str) -> bool:
    try:
        compile_ecma_regex(value)
    except Exception:  # regress.RegressError, or UnicodeError for a lone surrogate
        return False
    return True


#: Every format capgate accepts in a catalogue schema, with its strict check.
FORMATS: Final[dict[str, Callable[[str], bool]]] = {
    "date": is_date,
    "date-time": is_date_time,
    "email": is_email,
    "hostname": is_hostname,
    "ipv4": is_ipv4,
    "ipv6": is_ipv6,
    "regex": is_regex,
    "time": is_time,
    "uri": is_uri,
    "uuid": is_uuid,
}
