"""What the store commands share: exit codes, the store option, names, safe output.

**The store** is named by ``--store URL`` or ``$CAPGATE_STORE``: a SQLite file path
(or ``sqlite:///...``) or a ``postgresql://`` URL (:func:`capgate.gateway.state.open_store`).
Only ``capgate tenants add`` creates a SQLite file; every other command refuses a
path where there is none (:class:`StoreNotFound`), so a mistyped path is an error,
not a new empty store. Messages name a store by :attr:`~capgate.gateway.state.Store.location`
(never a password), and an address that is refused is shown with its password cut
out (:func:`redact_url`).

**Output** is for people unless ``--json`` is given. Whatever the store holds that
an agent or a provider wrote (a proposal's parameters, a ledger row's detail) goes
through :func:`shown` or :func:`safe` before it reaches a terminal: control and
format characters (an ANSI escape sequence, a right-to-left override) are printed
as ``\\u`` escapes, so a proposal cannot hide or reorder its own content on the
screen of the person reviewing it. ``--json`` output is ASCII JSON for the same
reason.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import math
import os
import re
import sys
import textwrap
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeAlias, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from capgate.gateway.catalogue.names import undeclared_names
from capgate.gateway.errors import (
    InvalidInput,
    StoreBusy,
    StoreError,
    StoreNotFound,
    StoreURLError,
    UnknownTenant,
    quote,
)
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import Identifier
from capgate.gateway.policy.address import AddressOrigin, OPAAddress
from capgate.gateway.policy.timeouts import DEFAULT_TIMEOUT, PER_TOOL_TIMEOUT
from capgate.gateway.state import open_store, parse_store_url
from capgate.gateway.state.records import MAX_AMOUNT, TenantRecord
from capgate.gateway.state.store import Store, Tx
from capgate.gateway.state.times import to_text

__all__ = [
    "EXIT_BROKEN",
    "EXIT_DEMO_FAILED",
    "EXIT_DENIED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "MAX_TIMEOUT",
    "STORE_ENV",
    "STORE_EXITS",
    "Actions",
    "ExitRows",
    "add_action",
    "add_by",
    "add_group",
    "add_json",
    "add_timeout",
    "amount",
    "exit_codes",
    "identifier",
    "opa_option",
    "opened_store",
    "operator",
    "print_json",
    "read_input",
    "redact_url",
    "require_tenant",
    "safe",
    "seconds",
    "shown",
    "table",
    "ttl",
    "warn_undeclared",
    "when",
]

EXIT_OK, EXIT_DEMO_FAILED, EXIT_ERROR, EXIT_DENIED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: ``capgate ledger verify``: the hash chain is broken.
EXIT_BROKEN: Final = 1

#: The environment variable naming the store when ``--store`` is not given.
STORE_ENV: Final = "CAPGATE_STORE"

ExitRows = Sequence[tuple[int, str]]
#: A group's subparsers (``capgate GROUP ACTION``).
Actions: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]

#: The usual exit codes of a store command.
STORE_EXITS: Final[ExitRows] = (
    (EXIT_OK, "success"),
    (EXIT_ERROR, "error: bad input, unknown tenant, proposal or connection, store unusable"),
)


# -- exit codes and parsers ----------------------------------------------------------------


def exit_codes(rows: ExitRows, heading: str = "exit status:") -> str:
    """The ``--help`` epilog listing exit codes (Ctrl-C's 130 added)."""
    listed = sorted({*rows, (EXIT_INTERRUPTED, "interrupted (Ctrl-C)")})
    return heading + "\n" + "\n".join(f"  {code:<4} {text}" for code, text in listed)


_FORMATTER = argparse.RawDescriptionHelpFormatter


def _paragraphs(text: str) -> str:
    """Wrapped for the raw formatter (which keeps the epilog's exit-code table as is)."""
    return "\n\n".join(textwrap.fill(part, 79) for part in text.split("\n\n"))


def add_group(
    sub: Actions,
    name: str,
    help: str,
    description: str,
    exits: ExitRows,
) -> Actions:
    """``capgate NAME ACTION ...``: a group whose help lists every exit code of its
    actions (the first text given for each code)."""
    first: dict[int, str] = {}
    for code, text in exits:
        first.setdefault(code, text)
    parser = sub.add_parser(
        name,
        help=help,
        description=_paragraphs(description),
        epilog=exit_codes(
            sorted(first.items()), "exit status (of its actions; each one's --help lists its own):"
        ),
        formatter_class=_FORMATTER,
    )
    return parser.add_subparsers(dest="action", required=True, metavar="ACTION")


def add_action(
    actions: Actions,
    name: str,
    help: str,
    run: Handler,
    *,
    exits: ExitRows = STORE_EXITS,
    description: str | None = None,
    store: bool = True,
) -> argparse.ArgumentParser:
    """One action of a group, taking ``--store`` unless ``store`` is False."""
    parser = actions.add_parser(
        name,
        help=help,
        description=_paragraphs(description or help),
        epilog=exit_codes(exits),
        formatter_class=_FORMATTER,
    )
    if store:
        parser.add_argument(
            "--store",
            metavar="URL",
            help="the gateway's store: a SQLite file path or postgresql://... "
            f"(default: ${STORE_ENV})",
        )
    parser.set_defaults(run=run)
    return parser


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


#: The longest ``--timeout`` accepted: a question that takes longer is better not waited for.
MAX_TIMEOUT: Final = 3600.0


def seconds(text: str) -> float:
    """``--timeout``'s value: seconds, more than 0 and at most :data:`MAX_TIMEOUT`."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT:  # NaN and infinity fail this too
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number of seconds above 0 and at most {MAX_TIMEOUT:g}"
        )
    return value


def add_timeout(parser: argparse.ArgumentParser) -> None:
    """``--timeout SECONDS``: how long OPA may take to answer (the client's timeout).

    The default is :data:`~capgate.gateway.policy.timeouts.DEFAULT_TIMEOUT`; a question about
    every tool of the catalogue adds its allowance a tool to whichever is used
    (:func:`~capgate.gateway.policy.timeouts.whole_catalogue_timeout`).
    """
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=f"seconds OPA may take for each read of an answer (default {DEFAULT_TIMEOUT:g}); "
        f"a question about the whole catalogue adds {PER_TOOL_TIMEOUT * 1000:g} ms for each "
        "of its tools, and the whole answer may take twice that",
    )


def add_by(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--by",
        metavar="WHO",
        required=required,
        help="who makes the change, for the ledger"
        + ("" if required else " (default: your login name)"),
    )


# -- the store ----------------------------------------------------------------------------

_PASSWORD_PARAMETER: Final = re.compile(r"(?i)(\b(?:ssl)?password=)[^&#\s]*")
_SCHEME: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def opa_option(args: argparse.Namespace) -> OPAAddress | None:
    """``--opa`` as an address that says it was given there; None when not given (then
    ``$CAPGATE_OPA_URL``, else the embedded OPA)."""
    value: str | None = args.opa
    return OPAAddress(value, AddressOrigin.OPTION) if value else None


def warn_undeclared(
    catalogue: Catalogue, role: str, task_type: str, environment: str, *, where: str = ""
) -> None:
    """A warning on stderr for each of the three names ``catalogue`` does not declare,
    with a did-you-mean (:func:`~capgate.gateway.catalogue.names.undeclared_names`);
    ``where`` names the request (``binding 'stdio': ``). Nothing else changes."""
    for problem in undeclared_names(catalogue, role, task_type, environment):
        print(
            f"capgate: warning: {where}{problem.message()}; no tool is visible or allowed",
            file=sys.stderr,
        )


def redact_url(url: str) -> str:
    """``url`` with any password cut out: of ``user:password@`` and ``password=``.

    Applied to addresses that were refused, whose messages quote them as given.
    """
    text = _PASSWORD_PARAMETER.sub(r"\1***", url)
    at = text.rfind("@")
    if at < 0:
        return text
    start = text.find("//")
    if 0 <= start < at:
        start += 2
    else:
        scheme = _SCHEME.match(text)
        start = scheme.end() if scheme else 0
    colon = text.find(":", start, at)
    return text if colon < 0 else f"{text[: colon + 1]}***{text[at:]}"


def _redacted(message: str, url: str) -> str:
    hidden = redact_url(url)
    return message.replace(quote(url), quote(hidden)).replace(url, hidden)


def store_url(args: argparse.Namespace) -> str:
    url: str = getattr(args, "store", None) or os.environ.get(STORE_ENV, "")
    if not url.strip():
        raise InvalidInput(
            f"no store given: pass --store URL or set ${STORE_ENV} "
            "(a SQLite file path, or postgresql://...)"
        )
    return url


@contextlib.contextmanager
def opened_store(args: argparse.Namespace, *, create: bool = False) -> Iterator[Store]:
    """The store ``--store`` (or ``$CAPGATE_STORE``) names, closed afterwards.

    Without ``create``, a SQLite path where there is no file is refused.
    """
    url = store_url(args)
    try:
        address = parse_store_url(url)
    except StoreURLError as exc:
        raise StoreURLError(_redacted(str(exc), url)) from None
    if address.kind == "sqlite" and not create and not Path(address.target).exists():
        raise StoreNotFound(
            f"no store at {redact_url(address.location)}: check --store or ${STORE_ENV} "
            "(`capgate tenants add` creates a new one)"
        )
    try:
        store = open_store(url)
    except (StoreURLError, StoreBusy) as exc:
        raise type(exc)(_redacted(str(exc), url)) from None
    except StoreError as exc:
        if type(exc) is StoreError:
            raise StoreError(_redacted(str(exc), url)) from None
        raise
    try:
        yield store
    finally:
        store.close()


# -- names, amounts, durations ---------------------------------------------------------------

_IDENTIFIER: Final = TypeAdapter(Identifier)
_NAME_RULE: Final = "1 to 128 letters, digits and _ . : / -, starting with a letter or digit"


def identifier(value: str, what: str) -> str:
    """``value`` if it is a capgate name (tenant, alias, id, role...), else InvalidInput."""
    try:
        return _IDENTIFIER.validate_python(value)
    except ValidationError:
        raise InvalidInput(f"{what}: {quote(value)} is not a valid name ({_NAME_RULE})") from None


def amount(text: str, what: str) -> int:
    """A budget amount in cost units: a whole number from 0 to 2**62."""
    if not re.fullmatch(r"[0-9]{1,19}", text) or int(text) > MAX_AMOUNT:
        raise InvalidInput(
            f"{what}: {quote(text)} is not a whole number of cost units from 0 to 2**62"
        )
    return int(text)


_DURATION: Final = re.compile(r"(?:(\d{1,4})d)?(?:(\d{1,6})h)?(?:(\d{1,8})m)?(?:(\d{1,9})s)?")
#: The longest time to live ``--ttl`` accepts: an approval is for one dispatch soon.
MAX_TTL: Final = timedelta(days=30)


def ttl(text: str, what: str = "--ttl") -> timedelta:
    """``1h``, ``30m``, ``2d``, ``1h30m``, ``90s``: from one second to 30 days."""
    found = _DURATION.fullmatch(text)
    if not text or found is None:
        raise InvalidInput(
            f"{what}: {quote(text)} is not a duration such as 30m, 1h, 1h30m or 2d "
            "(d, h, m, s: days, hours, minutes, seconds)"
        )
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    value = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if not timedelta(seconds=1) <= value <= MAX_TTL:
        raise InvalidInput(f"{what}: {quote(text)} is not between 1s and 30d")
    return value


def operator(value: str | None, what: str = "--by") -> str:
    """Who makes a change, for the ledger: given, or the login name."""
    if value is None:
        with contextlib.suppress(Exception):  # no login name in some containers
            value = getpass.getuser()
        if not value or not _is_printable(value) or len(value) > 128:
            value = "operator"
    if not value or len(value) > 128 or not _is_printable(value) or value != value.strip():
        raise InvalidInput(
            f"{what}: {quote(value)} is not a name (1 to 128 printable characters, "
            "no leading or trailing space)"
        )
    return value


# -- output -------------------------------------------------------------------------------

#: Characters never printed as themselves: controls (ANSI escapes, C1), format
#: characters (bidirectional overrides, zero-width), separators, private use,
#: surrogates and unassigned code points.
_UNSAFE: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _is_printable(text: str) -> bool:
    return all(unicodedata.category(ch) not in _UNSAFE for ch in text)


def safe(text: object) -> str:
    """``text`` with every character a terminal could act on shown as an escape."""
    value = str(text)
    if _is_printable(value):
        return value
    return "".join(
        json.dumps(ch)[1:-1] if unicodedata.category(ch) in _UNSAFE else ch for ch in value
    )


def shown(value: Any) -> str:
    """``value`` as JSON text, exactly, and safe for a terminal (see :func:`safe`)."""
    return safe(json.dumps(value, ensure_ascii=False, sort_keys=True))


def when(value: datetime, *, seconds: bool = False) -> str:
    """A stored time as the store writes it (UTC, ``Z``), optionally to the second."""
    text = to_text(value)
    return f"{text[:19]}Z" if seconds else text


def print_json(value: Any) -> None:
    """``--json`` output: indented ASCII JSON (escapes, never raw control characters)."""
    print(json.dumps(value, indent=2, ensure_ascii=True))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns padded to their widest cell; the last column is not padded."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    for line in (headers, *rows):
        cells = [str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)]
        cells[-1] = str(line[-1])
        print("  ".join(cells).rstrip())


_Input = TypeVar("_Input", bound=BaseModel)


def read_input(model: type[_Input], path: Path) -> _Input:
    """An input document for ``eval`` and ``explain``: JSON by its suffix, else YAML,
    the bare input or OPA's ``{"input": ...}`` envelope, validated as ``model``.

    Every problem is an InvalidInput naming the file (and the field), never a
    traceback: an unreadable file, a parse error, nesting too deep for the parsers.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except RecursionError:
        # Both parsers recurse once per level; the models never nest this deep.
        raise InvalidInput(f"{path}: nested too deeply to be an input document") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidInput(
            f"{path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}"
        ) from None
    if isinstance(data, dict) and set(data) == {"input"}:
        data = data["input"]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput.from_validation(exc, str(path)) from None


def require_tenant(tx: Tx, tenant: str) -> TenantRecord:
    """The tenant's record, or ``UnknownTenant``: every command naming a tenant asks
    this first, so a typo is an error that names it, not an empty answer."""
    record = tx.get_tenant(tenant)
    if record is None:
        raise UnknownTenant(tenant)
    return record
