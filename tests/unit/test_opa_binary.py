"""Which OPA binary runs, and the refusal of one capgate does not support.

The lookup is exercised with small shell scripts that answer ``version`` like OPA
does, so every branch (order, explicit choice, wrong version, not OPA at all) runs
without building anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capgate.gateway.errors import OPAProcessError
from capgate.gateway.opa import binary as binary_module
from capgate.gateway.opa import policies as policies_module
from capgate.gateway.opa.binary import OPA_BIN_ENV, PINNED_VERSION, find_opa, find_opa_binary

REPO = Path(__file__).resolve().parents[2]


def fake_opa(path: Path, version: str = PINNED_VERSION, *, status: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!/bin/sh\necho 'Version: {version}'\necho 'Build Commit: x'\nexit {status}\n"
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No $CAPGATE_OPA_BIN, an empty PATH, and a checkout root under tmp_path."""
    monkeypatch.delenv(OPA_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    repo = tmp_path / "repo"
    monkeypatch.setattr(binary_module, "checkout_root", lambda: repo)
    return tmp_path


def test_pinned_version_matches_the_tool_script():
    pins = dict(
        line.split("=", 1)
        for line in (REPO / "scripts" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert pins["OPA_VERSION"] == f"v{PINNED_VERSION}"


def test_lookup_order_argument_env_checkout_path(isolated: Path, monkeypatch):
    on_path = fake_opa(isolated / "path" / "opa")
    in_checkout = fake_opa(isolated / "repo" / ".tools" / "bin" / "opa")
    from_env = fake_opa(isolated / "env" / "opa")
    argument = fake_opa(isolated / "arg" / "opa")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv(OPA_BIN_ENV, str(from_env))
    assert find_opa(argument).source == "argument"
    assert find_opa_binary() == from_env
    monkeypatch.delenv(OPA_BIN_ENV)
    found = find_opa()
    assert (found.path, found.source) == (in_checkout, "checkout")
    in_checkout.unlink()
    found = find_opa()
    assert (found.path, found.source) == (on_path, "PATH")
    assert found.version_text == PINNED_VERSION
    assert f"v{PINNED_VERSION}" in found.describe()


def test_an_explicit_choice_that_is_not_executable_never_falls_back(isolated: Path, monkeypatch):
    fake_opa(isolated / "repo" / ".tools" / "bin" / "opa")
    monkeypatch.setenv(OPA_BIN_ENV, str(isolated / "no-opa"))
    with pytest.raises(OPAProcessError, match=OPA_BIN_ENV):
        find_opa()
    monkeypatch.delenv(OPA_BIN_ENV)
    with pytest.raises(OPAProcessError, match="not an executable"):
        find_opa(isolated / "no-opa")


def test_no_binary_anywhere_names_the_places_and_the_fix(isolated: Path):
    with pytest.raises(OPAProcessError) as caught:
        find_opa()
    message = str(caught.value)
    assert OPA_BIN_ENV in message
    assert str(isolated / "repo" / ".tools" / "bin" / "opa") in message
    assert "PATH" in message
    assert "make setup" in message
    assert f"go install github.com/open-policy-agent/opa@v{PINNED_VERSION}" in message


def test_an_installed_package_does_not_look_for_a_checkout(isolated: Path, monkeypatch):
    monkeypatch.setattr(binary_module, "checkout_root", lambda: None)
    with pytest.raises(OPAProcessError) as caught:
        find_opa()
    assert "looked at $CAPGATE_OPA_BIN (unset), PATH)" in str(caught.value)


@pytest.mark.parametrize("version", ["0.70.0", "1.21.9", "2.0.0"])
def test_unsupported_versions_are_refused_with_the_way_to_the_right_one(
    isolated: Path, version: str
):
    old = fake_opa(isolated / f"opa-{version}", version)
    with pytest.raises(OPAProcessError) as caught:
        find_opa(old)
    message = str(caught.value)
    assert f"v{version}" in message
    assert "1.22.0 or newer" in message
    assert f"v{PINNED_VERSION}" in message


@pytest.mark.parametrize("version", ["1.22.0", "1.22.4", "1.23.0", "1.30.2-dev"])
def test_supported_versions_are_accepted(isolated: Path, version: str):
    assert find_opa(fake_opa(isolated / f"opa-{version}", version)).version >= (1, 22, 0)


def test_something_that_is_not_opa_is_refused(isolated: Path):
    impostor = isolated / "impostor"
    impostor.write_text("#!/bin/sh\necho hello\n")
    impostor.chmod(0o755)
    with pytest.raises(OPAProcessError, match="does not look like OPA"):
        find_opa(impostor)
    failing = fake_opa(isolated / "failing", status=3)
    with pytest.raises(OPAProcessError, match="exited 3"):
        find_opa(failing)


def test_checkout_root_is_this_repository():
    assert policies_module.checkout_root() == REPO
