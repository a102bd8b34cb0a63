"""The declarations Python reads are the ones OPA reads.

Rego reads each check's declaration with ``rego.metadata.rule()``; the gateway's
reader (:mod:`capgate.gateway.opa.declarations`), from which the reason-code tests
and the table of ``docs/reason-codes.md`` come, parses the same ``# METADATA``
comments as YAML itself. Here OPA's own parse (``opa inspect --annotations``) of the
policies as shipped is compared with the reader's, check by check, so a comment the
two would read differently (a YAML subtlety, a block the reader misses) fails.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from capgate.gateway.opa.binary import find_opa_binary
from capgate.gateway.opa.declarations import declared_checks, declared_obligations
from capgate.gateway.opa.policies import default_policies_dir

pytestmark = pytest.mark.integration


def _annotations(policies: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(find_opa_binary()), "inspect", "--annotations", "--format", "json", str(policies)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,  # a bound on a hang, not on speed
    )
    return list(json.loads(done.stdout).get("annotations") or [])


def _package(entry: dict[str, Any]) -> str:
    # path is data.<package>.<rule>, as terms; the package is what lies between.
    parts = [str(term["value"]) for term in entry["path"]]
    assert parts[0] == "data"
    return ".".join(parts[1:-1])


def test_every_declared_check_reads_the_same_in_opa_and_in_python():
    policies = default_policies_dir() / "capgate"
    from_opa: list[tuple[str, dict[str, Any]]] = []
    obligations: dict[str, str] = {}
    for entry in _annotations(policies):
        if entry["location"]["file"].endswith("_test.rego"):
            continue
        custom = entry["annotations"].get("custom") or {}
        from_opa += [(_package(entry), spec) for spec in custom.get("checks") or []]
        obligations |= {
            code: spec["title"] for code, spec in (custom.get("obligations") or {}).items()
        }

    def as_declared(check: Any) -> dict[str, Any]:
        codes: dict[str, Any] = {}
        for code in check.codes:
            declared: dict[str, Any] = {"title": code.title}
            if code.message is not None:
                declared["message"] = code.message
            else:
                declared["messages"] = dict(code.messages)
            if code.each is not None:
                declared["each"] = code.each
            if code.fields:
                declared["fields"] = list(code.fields)
            codes[code.code] = declared
        return {
            "check": check.check,
            "title": check.title,
            "description": check.description,
            "facts": list(check.facts),
            "codes": codes,
        }

    from_python = [(check.package, as_declared(check)) for check in declared_checks()]
    key = lambda pair: (pair[0], pair[1]["check"])  # noqa: E731
    assert sorted(from_python, key=key) == sorted(from_opa, key=key)
    assert (
        len(from_python) == 28
    )  # the review policy's "authenticated" and the link checks among them
    assert (
        declared_obligations()
        == obligations
        == {"pass_idempotency_key": "Pass the idempotency key"}
    )
