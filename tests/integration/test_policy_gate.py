"""The policy gate keeps builtins that reach the network or the host out of the policies.

``scripts/policy-gate.sh --only capabilities DIR`` runs ``opa check --strict`` with
the pinned OPA's capabilities minus ``http.send``, ``net.lookup_*`` and
``opa.runtime``. The real policies pass it; a copy of them with one more file that
calls any of those builtins fails it, naming the file and the builtin, although the
same copy passes the plain strict check: it is the capabilities that catch it.

``--only schema`` type-checks the policies against the JSON Schemas of their inputs,
generated from the gateway's models: a policy that reads an input field the gateway
never sends, or reads one as another type, fails it and passes the plain check.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

from tests.hang import HANG_SECONDS

pytestmark = pytest.mark.integration

ROOT: Final = Path(__file__).resolve().parents[2]
GATE: Final = ROOT / "scripts" / "policy-gate.sh"

#: One policy per forbidden builtin: strict-clean Rego, so only the capabilities object.
REACHING_OUT: Final = {
    "http.send": 'reply := http.send({"method": "GET", "url": "http://example.test/facts"})',
    "net.lookup_ip_addr": 'addresses := net.lookup_ip_addr("example.test")',
    "opa.runtime": "home := opa.runtime().env.HOME",
}


def gate(step: str, policies: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(GATE), "--only", step, str(policies)],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=False,
    )


def test_the_policies_use_no_builtin_that_reaches_out() -> None:
    done = gate("capabilities", ROOT / "policies")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "builtins removed: http.send, net.lookup_ip_addr, opa.runtime" in done.stdout


@pytest.mark.parametrize("builtin", sorted(REACHING_OUT))
def test_a_policy_that_reaches_out_fails_the_gate(builtin: str, tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", policies)
    leak = policies / "capgate" / "leak" / "leak.rego"
    leak.parent.mkdir()
    leak.write_text(f"package capgate.leak\n\n{REACHING_OUT[builtin]}\n")

    strict = gate("check", policies)
    assert strict.returncode == 0, f"the plain strict check should pass:\n{strict.stderr}"

    done = gate("capabilities", policies)
    assert done.returncode != 0, f"the gate let {builtin} through:\n{done.stdout}"
    assert f"undefined function {builtin}" in done.stderr
    assert "leak.rego" in done.stderr
    assert "not reach the network or the host" in done.stderr


def test_the_policies_read_only_what_the_gateways_models_send() -> None:
    done = gate("schema", ROOT / "policies")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "opa check --strict --schema" in done.stdout


#: Reads the models do not have, each in a package whose input schema the policies name.
MISREAD: Final = {
    "execute/checks.rego": ('_misread if input.call.tool_name == "x"', "input.call.tool_name"),
    "visibility/checks.rego": (
        "_misread if input.principal.role.name",
        "input.principal.role.name",
    ),
    "review/checks.rego": ('_misread if input.reviewer.roles[_] == "x"', "input.reviewer.roles"),
}


@pytest.mark.parametrize("where", sorted(MISREAD))
def test_a_policy_reading_what_no_model_sends_fails_the_gate(where: str, tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", policies)
    rule, ref = MISREAD[where]
    path = policies / "capgate" / where
    path.write_text(path.read_text(encoding="utf-8") + f"\n{rule}\n", encoding="utf-8")

    strict = gate("check", policies)
    assert strict.returncode == 0, f"the plain strict check should pass:\n{strict.stderr}"

    done = gate("schema", policies)
    assert done.returncode != 0, f"the gate let {ref} through:\n{done.stdout}"
    assert "rego_type_error: undefined ref: " + ref in done.stderr
