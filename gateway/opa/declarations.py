"""The checks the policies declare, read from the policies themselves.

Every check is declared once, in the ``# METADATA`` of one rule of the package that
makes it (``custom: checks:``): its name, title and description, the facts it reads,
and the reason codes it gives, each with its title and message template (one
``message``, or ``messages`` by case, with ``each`` naming a list fact it gives one
reason per element of). The obligations an allow may carry are declared the same way
(``custom: obligations:``). Rego reads each declaration with ``rego.metadata.rule()``
and renders execute's and review's messages from it; explain's compose answer
carries compose's templates to the gateway (:mod:`capgate.gateway.model.reasons`).
This module reads the same YAML from the files, for what has no OPA to ask: the
table of ``docs/reason-codes.md`` (:func:`markdown_table`, written by
``scripts/reason-codes.py``) and the tests that hold codes, docs and tests to the
declarations. ``tests/integration/test_declarations.py`` holds this reader to what
OPA itself reads (``opa inspect --annotations``).

A code is declared once across all packages; :func:`declared_codes` refuses a
second declaration (``ValueError``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capgate.gateway.opa.policies import default_policies_dir

__all__ = [
    "Code",
    "DeclaredCheck",
    "declared_checks",
    "declared_codes",
    "declared_obligations",
    "markdown_table",
    "metadata_blocks",
]

_PACKAGE = re.compile(r"^package\s+([A-Za-z0-9_.]+)\s*$", re.M)


@dataclass(frozen=True, slots=True)
class Code:
    """A reason code as its check declares it."""

    code: str
    title: str
    #: The one message template, or None when the code has several, by case.
    message: str | None
    messages: Mapping[str, str] = field(default_factory=dict)
    #: The list fact the code gives one reason per element of, if any.
    each: str | None = None
    #: The fields of each element of ``each`` (an object) a template may name too.
    fields: tuple[str, ...] = ()

    def templates(self) -> dict[str, str]:
        """Every template of the code, by case ("" for the one message)."""
        return {"": self.message} if self.message is not None else dict(self.messages)


@dataclass(frozen=True, slots=True)
class DeclaredCheck:
    """A check as its package declares it."""

    check: str
    title: str
    description: str
    facts: tuple[str, ...]
    codes: tuple[Code, ...]
    #: The Rego package that declares it, e.g. ``capgate.visibility``.
    package: str


def metadata_blocks(text: str) -> list[dict[str, Any]]:
    """Every ``# METADATA`` comment block of a Rego file, parsed as YAML, as OPA reads
    them: the comment lines that follow, each without its ``#`` and one space."""
    blocks: list[dict[str, Any]] = []
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if line.strip() != "# METADATA":
            continue
        body = []
        for following in lines[start + 1 :]:
            if not following.startswith("#"):
                break
            body.append(following[2:] if following.startswith("# ") else following[1:])
        parsed = yaml.safe_load("\n".join(body))
        if isinstance(parsed, dict):
            blocks.append(parsed)
    return blocks


def _policy_files(policies_dir: Path | None) -> list[Path]:
    root = (default_policies_dir() if policies_dir is None else Path(policies_dir)) / "capgate"
    return sorted(p for p in root.rglob("*.rego") if not p.name.endswith("_test.rego"))


def _code(code: str, spec: Mapping[str, Any]) -> Code:
    message = spec.get("message")
    messages = spec.get("messages") or {}
    if (message is None) == (not messages):
        raise ValueError(f"code {code} must declare exactly one of message and messages")
    return Code(
        code=code,
        title=str(spec["title"]),
        message=None if message is None else str(message),
        messages={str(k): str(v) for k, v in messages.items()},
        each=spec.get("each"),
        fields=tuple(str(name) for name in spec.get("fields") or ()),
    )


def declared_checks(policies_dir: Path | None = None) -> list[DeclaredCheck]:
    """Every check the policies under ``policies_dir`` declare (default: the policies
    capgate bundles, :func:`capgate.gateway.opa.policies.default_policies_dir`), in file
    order and, within a file, in declared order."""
    checks: list[DeclaredCheck] = []
    for path in _policy_files(policies_dir):
        text = path.read_text(encoding="utf-8")
        found = _PACKAGE.search(text)
        package = found.group(1) if found else ""
        for block in metadata_blocks(text):
            for spec in (block.get("custom") or {}).get("checks") or []:
                checks.append(
                    DeclaredCheck(
                        check=str(spec["check"]),
                        title=str(spec["title"]),
                        description=str(spec.get("description", "")),
                        facts=tuple(str(f) for f in spec.get("facts") or ()),
                        codes=tuple(_code(c, s) for c, s in (spec.get("codes") or {}).items()),
                        package=package,
                    )
                )
    return checks


def declared_codes(policies_dir: Path | None = None) -> dict[str, tuple[DeclaredCheck, Code]]:
    """Every declared reason code with the check that declares it; ValueError if a
    code is declared twice."""
    codes: dict[str, tuple[DeclaredCheck, Code]] = {}
    for check in declared_checks(policies_dir):
        for code in check.codes:
            if code.code in codes:
                raise ValueError(f"reason code {code.code} is declared twice")
            codes[code.code] = (check, code)
    return codes


def declared_obligations(policies_dir: Path | None = None) -> dict[str, str]:
    """Every obligation code the policies declare, with its title."""
    obligations: dict[str, str] = {}
    for path in _policy_files(policies_dir):
        for block in metadata_blocks(path.read_text(encoding="utf-8")):
            for code, spec in ((block.get("custom") or {}).get("obligations") or {}).items():
                obligations[str(code)] = str(spec["title"])
    return obligations


#: The order the table lists the packages' checks in: compose's, the tool check every
#: question about a tool makes, the call-time checks, the review checks, the link checks.
_TABLE_ORDER = (
    "capgate.visibility",
    "capgate.reasons",
    "capgate.execute",
    "capgate.review",
    "capgate.link",
)


def markdown_table(policies_dir: Path | None = None) -> str:
    """The table of every declared code, its check, title and message templates, as
    ``docs/reason-codes.md`` shows it (``scripts/reason-codes.py`` writes it there)."""
    checks = declared_checks(policies_dir)
    rank = {package: i for i, package in enumerate(_TABLE_ORDER)}
    checks.sort(key=lambda check: rank.get(check.package, len(rank)))
    rows = ["| code | check | title | message template |", "|---|---|---|---|"]
    for check in checks:
        for code in check.codes:
            for case, template in code.templates().items():
                each = code.each is not None and f"{{{code.each}}}" in template
                note = f" (one reason for each of `{code.each}`)" if each else ""
                label = f"{code.title}, *{case}*" if case else code.title
                rows.append(
                    f"| `{code.code}` | `{check.check}` ({check.package}) | {label} | "
                    f"`{template}`{note} |"
                )
    return "\n".join(rows) + "\n"
