"""capgate installed from its wheel, in a fresh virtual environment outside the checkout.

A service installs capgate with pip; it has no checkout, no ``policies/`` folder and
no ``.tools``. This test builds the wheel from the project's files, installs it
offline (dependencies from the wheelhouse ``make setup-test`` fills), and then, from a
folder that is not the checkout, runs a compose and a call against a real OPA and
asks ``capgate doctor`` what it uses: the policies must come from the package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.hang import HANG_SECONDS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".tools" / "wheelhouse"
OPA = REPO / ".tools" / "bin" / "opa"


def _run(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(  # type: ignore[call-overload]
        args, capture_output=True, text=True, timeout=HANG_SECONDS, check=False, **kw
    )
    assert done.returncode == 0, f"{args[:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project's files (not the working folders)."""
    source = tmp_path_factory.mktemp("source")
    listed = _run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO
    ).stdout
    for name in filter(None, listed.split("\0")):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        # capgate/gateway and capgate/adapters are links (docs/architecture.md): copied
        # as links, as git checks them out, or the package would lack both.
        if (REPO / name).is_symlink():
            target.symlink_to(os.readlink(REPO / name))
        elif (REPO / name).is_file():
            shutil.copy2(REPO / name, target)
    return source


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from the copy."""
    out = tmp_path_factory.mktemp("dist")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            ".",
        ],
        cwd=source,
    )
    (built,) = out.glob("capgate-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert any(WHEELHOUSE.glob("*.whl")), (
        f"{WHEELHOUSE} holds no wheels: run `make setup-test`, which fills it with capgate's "
        "runtime dependencies so this test can install offline"
    )
    home = tmp_path_factory.mktemp("service")
    _run([sys.executable, "-m", "venv", str(home / "venv")])
    python = home / "venv" / "bin" / "python"
    _run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-index",
         "--find-links", str(WHEELHOUSE), str(wheel)],
    )  # fmt: skip
    return home


def _env(**extra: str) -> dict[str, str]:
    """A service's environment: no checkout on any path, no venv of ours active."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CAPGATE_", "PYTHON", "VIRTUAL_ENV"))
    }
    env["PATH"] = "/usr/bin:/bin"
    env.update(extra)
    return env


def test_the_wheel_carries_every_module_the_policies_and_the_demo(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    # One import name: the checkout's gateway/ and adapters/ are capgate.gateway and
    # capgate.adapters in the wheel (capgate/gateway and capgate/adapters are links).
    for folder, package in [
        ("capgate", "capgate"),
        ("gateway", "capgate/gateway"),
        ("adapters", "capgate/adapters"),
    ]:
        for path in (REPO / folder).rglob("*.py"):
            assert f"{package}/{path.relative_to(REPO / folder)}" in names
    assert "capgate/py.typed" in names
    policies = {
        f"capgate/gateway/_policies/{p.relative_to(REPO / 'policies')}"
        for p in (REPO / "policies").rglob("*.rego")
        if not p.name.endswith("_test.rego")
    }
    assert policies
    assert policies <= names
    assert not [n for n in names if n.endswith("_test.rego")]
    for catalogue in ("sales", "oracle-grove"):
        assert f"capgate/demo/catalogues/{catalogue}/tools.yaml" in names
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"capgate"}


def test_the_wheel_and_the_sdist_carry_the_licence(
    wheel: Path, source: Path, tmp_path: Path
) -> None:
    licence = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in licence
    with zipfile.ZipFile(wheel) as built:
        (info,) = {n.split("/")[0] for n in built.namelist() if ".dist-info/" in n}
        metadata = built.read(f"{info}/METADATA").decode()
        assert built.read(f"{info}/licenses/LICENSE").decode() == licence
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()
    assert "Classifier: Typing :: Typed" in metadata.splitlines()

    # The sdist, through the same backend pip used for the wheel, offline.
    sdist = _run(
        [
            sys.executable,
            "-c",
            "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=source,
    ).stdout.splitlines()[-1]
    with tarfile.open(tmp_path / sdist) as archive:
        top = sdist.removesuffix(".tar.gz")
        member = archive.extractfile(f"{top}/LICENSE")
        assert member is not None
        assert member.read().decode() == licence
        pkg_info = archive.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        assert "License-Expression: Apache-2.0" in pkg_info.read().decode().splitlines()


SERVICE = textwrap.dedent("""\
    import json
    from capgate.adapters.tools.in_process import InProcessTools
    from capgate.demo import demo_catalogue_dir
    from capgate import (AgentRequest, ConnectionStatus, Gateway, PolicySidecar,
                         StaticCredentials, ToolRegistry, load_catalogue, open_store)

    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    tools = InProcessTools()
    tools.register("contact.read", "Read one contact.",
                   lambda contact_id: {"contact_id": contact_id, "name": "Ada",
                                       "email": "ada@example.test"})
    store = open_store("state.db")
    with store.transaction() as tx:
        tx.put_tenant("acme", budget_class="standard", budget_limit=10)
        tx.put_connection("acme", "crm", status=ConnectionStatus.ACTIVE, account="acme@crm")
    request = AgentRequest.model_validate({
        "principal": {"agent": "a", "role": "sales", "tenant": "acme"},
        "task": {"type": "customer_quote", "id": "t-1",
                 "linked_resources": [{"type": "contact", "id": "c-1"}]},
        "environment": "production",
    })
    with PolicySidecar(catalogue) as sidecar:
        gateway = Gateway(catalogue, sidecar.client, ToolRegistry(tools), store,
                          credentials=StaticCredentials({("acme", "crm"): "token"}))
        visible = sorted(gateway.compose(request).visible)
        outcome = gateway.call(request, "contact.read", {"contact_id": "c-1"})
        print(json.dumps({"visible": visible, "status": outcome.status.value,
                          "result": outcome.result, "policies": str(sidecar.policies.path),
                          "source": sidecar.policies.source,
                          "ledger": [row.kind for row in store.ledger()],
                          "chain_ok": store.verify_ledger().ok}))
    store.close()
""")


def test_a_service_composes_and_calls_from_the_installed_wheel(venv: Path):
    (venv / "service.py").write_text(SERVICE)
    done = _run(
        [str(venv / "venv" / "bin" / "python"), "service.py"],
        cwd=venv,
        env=_env(CAPGATE_OPA_BIN=str(OPA)),
    )
    answer = json.loads(done.stdout)
    # Every sales tool that acts through the CRM only; the payment is finance's.
    assert answer["visible"] == ["consent.check", "contact.read", "contact.verify_email",
                                 "quote.propose"]  # fmt: skip
    assert answer["status"] == "success"
    assert answer["result"]["contact_id"] == "c-1"
    assert answer["source"] == "package"
    assert Path(answer["policies"]).is_relative_to(venv / "venv")
    # The gateway's store came with the wheel: the compose and the call are in its ledger.
    assert answer["ledger"][0] == "compose"
    assert "outcome" in answer["ledger"]
    assert answer["chain_ok"] is True
    assert (venv / "state.db").is_file()


def test_doctor_in_the_installed_package_shows_what_is_in_use(venv: Path):
    doctor = venv / "venv" / "bin" / "capgate"
    done = _run([str(doctor), "doctor", "--json"], cwd=venv, env=_env(CAPGATE_OPA_BIN=str(OPA)))
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert all(c["ok"] for c in checks.values()), checks
    assert checks["capgate"]["facts"]["checkout"] is False
    assert checks["policies"]["facts"]["source"] == "package"
    assert checks["opa binary"]["facts"]["source"] == "env"
    version = _run([str(doctor), "--version"], cwd=venv, env=_env()).stdout.strip()
    assert version.startswith("capgate ")


def test_without_any_opa_the_installed_package_says_how_to_get_one(venv: Path):
    doctor = venv / "venv" / "bin" / "capgate"
    done = subprocess.run(
        [str(doctor), "doctor"],
        cwd=venv,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert done.returncode == 2
    line = next(row for row in done.stdout.splitlines() if "opa binary" in row)
    assert line.startswith("FAIL")
    assert "go install github.com/open-policy-agent/opa@v1.22.4" in line
    assert ".tools" not in line.split("looked at")[1].split(")")[0]
