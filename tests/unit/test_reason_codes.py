"""Reason codes are declared once, documented once, and each one is tested.

Codes are the stable part of a deny: callers, dashboards and the tests match on them.
Each is declared once, with its title and message templates, by the check that gives
it (the ``custom: checks:`` of one rule's ``# METADATA``, read by
:mod:`capgate.gateway.opa.declarations`; obligations under ``custom: obligations:``). Read
from the sources, no OPA needed (``tests/integration/test_declarations.py`` holds the
reader to OPA's own):

- **declared**: the codes the declarations give, each declared once;
- **emitted**: every code-shaped string literal (``snake_case`` with an underscore)
  a policy writes as a reason's or an obligation's ``"code": "..."`` or gives as a
  rule's value (``_call_code.stage := "review_required"``, ``else :=
  "stage_invalid"``), the ways a check picks among its codes;
- **documented**: the first column of the tables in ``docs/reason-codes.md``, split
  into reasons and obligations at the ``## Obligations`` heading;
- **tested**: a code quoted (``"code"`` or ``'code'``) in a Rego test
  (``*_test.rego``) or a Python test under ``tests/`` other than this file.

The rules: emitted is within declared; declared equals documented, for reasons
and for obligations; every documented code is tested; every message template names
only the tool and facts its check declares.
"""

from __future__ import annotations

import re
from pathlib import Path

from capgate.gateway.opa.declarations import (
    declared_checks,
    declared_codes,
    declared_obligations,
    metadata_blocks,
)

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
DOC = REPO / "docs" / "reason-codes.md"

_CODE = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+"
_WRITTEN = re.compile(rf'(?:"code":|:=)\s*"({_CODE})"')
_ROW = re.compile(rf"^\|\s*`({_CODE})`\s*\|", re.M)
_FIELD = re.compile(r"\{([a-z_]+)\}")


def _policies() -> list[Path]:
    root = POLICIES / "capgate"
    return sorted(p for p in root.rglob("*.rego") if not p.name.endswith("_test.rego"))


def declared() -> set[str]:
    return set(declared_codes(POLICIES))


def emitted() -> dict[str, set[str]]:
    """Code -> the policy files that write it."""
    found: dict[str, set[str]] = {}
    for path in _policies():
        for code in set(_WRITTEN.findall(path.read_text(encoding="utf-8"))):
            found.setdefault(code, set()).add(path.relative_to(REPO).as_posix())
    return found


def documented() -> tuple[set[str], set[str]]:
    """The codes of the page's hand-written tables (what each means, what to do; not
    the table of templates written from the declarations): (reasons, obligations)."""
    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition("<!-- table written by scripts/reason-codes.py")
    text = head + rest.partition("<!-- end of the table -->")[2]
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
    packages = {check.package for check in declared_checks(POLICIES)}
    assert packages == {
        "capgate.visibility",
        "capgate.execute",
        "capgate.review",
        "capgate.link",
        "capgate.reasons",
    }


def test_every_code_is_declared_once():
    # declared_codes refuses a second declaration of a code.
    assert len(declared()) == sum(len(c.codes) for c in declared_checks(POLICIES))
    names = [(c.package, c.check) for c in declared_checks(POLICIES)]
    assert len(names) == len(set(names)), "a check is declared twice in one package"


def test_no_hand_kept_lists_of_codes_remain():
    # The codes are declared with their checks, and nowhere else in METADATA.
    for path in _policies():
        for block in metadata_blocks(path.read_text(encoding="utf-8")):
            custom = block.get("custom") or {}
            assert "reason_codes" not in custom, path
            assert "obligation_codes" not in custom, path


def test_every_code_a_policy_writes_is_declared():
    written = emitted()
    undeclared = {
        code: sorted(files)
        for code, files in written.items()
        if code not in declared() | set(declared_obligations(POLICIES))
    }
    assert not undeclared, f"policies write codes no check declares: {undeclared}"
    # every way a check picks among its codes is found
    assert set(written) >= {"tool_not_enabled_for_tenant", "review_required", "unknown_tool"}


def test_every_declared_reason_code_is_documented_and_every_documented_one_declared():
    reasons, _ = documented()
    assert not declared() - reasons, (
        f"declared by a check but not in docs/reason-codes.md: {sorted(declared() - reasons)}"
    )
    assert not reasons - declared(), (
        f"in docs/reason-codes.md but declared by no check: {sorted(reasons - declared())}"
    )


def test_every_obligation_code_is_documented_both_ways():
    _, obligations = documented()
    assert set(declared_obligations(POLICIES)) == obligations


def test_every_documented_code_is_expected_by_some_test():
    reasons, obligations = documented()
    untested = (reasons | obligations) - expected_by_tests()
    assert not untested, f"no Rego or Python test expects: {sorted(untested)}"


def test_every_template_names_only_the_tool_and_its_checks_facts():
    for check in declared_checks(POLICIES):
        for code in check.codes:
            assert code.each is None or code.each in check.facts, (check.check, code.code)
            assert code.each is not None or not code.fields, (check.check, code.code)
            for case, template in code.templates().items():
                named = set(_FIELD.findall(template))
                unknown = named - {"tool", *check.facts, *code.fields}
                assert not unknown, f"{code.code} ({case or 'message'}) names {sorted(unknown)}"


def test_the_metadata_reader_reads_blocks_and_stops_at_code():
    text = (
        "# METADATA\n# title: T\n# custom:\n#   checks:\n#     - check: a\n"
        'rule := 1\n# not metadata\n# METADATA\n# custom:\n#   x: [c_d]\nx := "e_f"\n'
    )
    blocks = metadata_blocks(text)
    assert [block["custom"] for block in blocks] == [{"checks": [{"check": "a"}]}, {"x": ["c_d"]}]
