"""Reason codes are declared once, documented once, and each one is tested.

Codes are the stable part of a deny: callers, dashboards and the tests match on them,
so a code the policies can give must be in ``docs/reason-codes.md``, and a code the
page lists must be one the policies give and some test expects. Read from the
sources, no OPA needed:

- **declared**: the codes under ``custom.reason_codes`` (and ``obligation_codes``) in
  the ``# METADATA`` blocks of the policies (``policies/capgate``, tests excluded);
- **emitted**: every code-shaped string literal (``snake_case`` with an underscore)
  a policy writes as a reason's or an obligation's ``"code": "..."`` or gives as a
  rule's value (``_code("role", _) := "role_not_granted"``, ``else :=
  "connection_missing"``), the two ways the policies pick a code;
- **documented**: the first column of the tables in ``docs/reason-codes.md``, split
  into reasons and obligations at the ``## Obligations`` heading;
- **tested**: a code quoted (``"code"`` or ``'code'``) in a Rego test
  (``*_test.rego``) or a Python test under ``tests/`` other than this file.

The rules: emitted is within declared; declared equals documented, for reasons
and for obligations; every documented code is tested.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies" / "capgate"
DOC = REPO / "docs" / "reason-codes.md"

_CODE = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+"
_WRITTEN = re.compile(rf'(?:"code":|:=)\s*"({_CODE})"')
_ROW = re.compile(rf"^\|\s*`({_CODE})`\s*\|", re.M)


def _policies() -> list[Path]:
    return sorted(p for p in POLICIES.rglob("*.rego") if not p.name.endswith("_test.rego"))


def _metadata_blocks(text: str) -> list[dict[str, Any]]:
    """Every ``# METADATA`` comment block of a Rego file, parsed as YAML."""
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


def declared(kind: str = "reason_codes") -> set[str]:
    codes: set[str] = set()
    for path in _policies():
        for block in _metadata_blocks(path.read_text(encoding="utf-8")):
            custom = block.get("custom") or {}
            codes.update(custom.get(kind) or [])
    return codes


def emitted() -> dict[str, set[str]]:
    """Code -> the policy files that write it."""
    found: dict[str, set[str]] = {}
    for path in _policies():
        for code in set(_WRITTEN.findall(path.read_text(encoding="utf-8"))):
            found.setdefault(code, set()).add(path.relative_to(REPO).as_posix())
    return found


def documented() -> tuple[set[str], set[str]]:
    """The codes of the page's tables: (reasons, obligations)."""
    text = DOC.read_text(encoding="utf-8")
    reasons, _, obligations = text.partition("\n## Obligations")
    return set(_ROW.findall(reasons)), set(_ROW.findall(obligations))


def expected_by_tests() -> set[str]:
    texts = [p.read_text(encoding="utf-8") for p in sorted(POLICIES.rglob("*_test.rego"))]
    texts += [
        p.read_text(encoding="utf-8")
        for p in sorted((REPO / "tests").rglob("*.py"))
        if p.resolve() != Path(__file__).resolve()
    ]
    joined = "\n".join(texts)
    return set(re.findall(rf"[\"']({_CODE})[\"']", joined))


def test_the_sources_are_found():
    assert len(_policies()) >= 4
    reasons, obligations = documented()
    assert {"role_not_granted", "unknown_tool", "self_review"} <= reasons
    assert obligations == {"pass_idempotency_key"}


def test_every_code_a_policy_writes_is_declared_in_its_metadata():
    written = emitted()
    undeclared = {
        code: sorted(files)
        for code, files in written.items()
        if code not in declared() | declared("obligation_codes")
    }
    assert not undeclared, (
        "policies write codes no METADATA custom.reason_codes (or obligation_codes) "
        f"declares: {undeclared}"
    )
    # every check's code is found, however the policy picks it
    assert set(written) >= {"connection_missing", "connection_revoked", "role_not_granted"}


def test_every_declared_reason_code_is_documented_and_every_documented_one_declared():
    reasons, _ = documented()
    assert not declared() - reasons, (
        f"declared in the policies' METADATA but not in docs/reason-codes.md: "
        f"{sorted(declared() - reasons)}"
    )
    assert not reasons - declared(), (
        f"in docs/reason-codes.md but declared by no policy: {sorted(reasons - declared())}"
    )


def test_every_obligation_code_is_documented_both_ways():
    _, obligations = documented()
    assert declared("obligation_codes") == obligations


def test_every_documented_code_is_expected_by_some_test():
    reasons, obligations = documented()
    untested = (reasons | obligations) - expected_by_tests()
    assert not untested, f"no Rego or Python test expects: {sorted(untested)}"


def test_the_metadata_reader_reads_blocks_and_stops_at_code():
    text = (
        "# METADATA\n# title: T\n# custom:\n#   reason_codes:\n#     - a_b\n"
        'rule := 1\n# not metadata\n# METADATA\n# custom:\n#   reason_codes: [c_d]\nx := "e_f"\n'
    )
    blocks = _metadata_blocks(text)
    assert [block["custom"]["reason_codes"] for block in blocks] == [["a_b"], ["c_d"]]
