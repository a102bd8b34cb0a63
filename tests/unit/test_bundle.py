"""Writing the OPA bundle directory (no OPA needed)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa import bundle as bundle_module
from capgate.gateway.opa import policies as policies_module
from capgate.gateway.opa.bundle import bundle_revision, write_bundle
from capgate.gateway.opa.policies import default_policies_dir, locate_policies


@pytest.fixture
def catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    """A tiny stand-in for the policy tree, tests included."""
    root = tmp_path / "policies"
    for relative, package in [
        ("capgate/compose/compose.rego", "capgate.compose"),
        ("capgate/compose/compose_test.rego", "capgate.compose_test"),
        ("capgate/execute/execute.rego", "capgate.execute"),
        ("capgate/lib/util.rego", "capgate.lib"),
        ("capgate/lib/util_test.rego", "capgate.lib_test"),
    ]:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"package {package}\n", encoding="utf-8")
    (root / "README.md").write_text("not a policy\n", encoding="utf-8")
    return root


def files_under(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def siblings(out_dir: Path) -> set[str]:
    """Names next to ``out_dir``, to prove no temporary directory was left behind."""
    return {p.name for p in out_dir.parent.iterdir()} if out_dir.parent.exists() else set()


def test_public_surface_is_pinned() -> None:
    assert sorted(bundle_module.__all__) == [
        "BUNDLE_ROOT",
        "DATA_PATH",
        "bundle_revision",
        "write_bundle",
    ]


def test_bundle_holds_policies_data_and_manifest(
    tmp_path: Path, catalogue: Catalogue, policies: Path
) -> None:
    out_dir = tmp_path / "out" / "bundle"
    assert write_bundle(catalogue, out_dir, policies) == out_dir
    assert files_under(out_dir) == {
        ".manifest",
        "capgate/catalogue/data.json",
        "capgate/compose/compose.rego",
        "capgate/execute/execute.rego",
        "capgate/lib/util.rego",
    }
    assert (out_dir / "capgate/lib/util.rego").read_text(
        encoding="utf-8"
    ) == "package capgate.lib\n"
    document = compile_catalogue(catalogue)
    data = json.loads((out_dir / "capgate/catalogue/data.json").read_text(encoding="utf-8"))
    assert data == document
    manifest = json.loads((out_dir / ".manifest").read_text(encoding="utf-8"))
    assert manifest == {"revision": bundle_revision(catalogue, policies), "roots": ["capgate"]}
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", manifest["revision"])
    assert siblings(out_dir) == {"bundle"}


def revision_written(catalogue: Catalogue, out_dir: Path, policies: Path) -> str:
    write_bundle(catalogue, out_dir, policies)
    revision: str = json.loads((out_dir / ".manifest").read_text(encoding="utf-8"))["revision"]
    assert revision == bundle_revision(catalogue, policies)
    return revision


def test_a_policy_only_change_changes_the_revision(
    tmp_path: Path, catalogue: Catalogue, policies: Path
) -> None:
    """The regression: the revision was the catalogue digest, so a bundle with other
    policies and the same catalogue could not be told apart by its revision."""
    out_dir = tmp_path / "bundle"
    before = revision_written(catalogue, out_dir, policies)
    assert before != compile_catalogue(catalogue)["meta"]["digest"]
    execute = policies / "capgate/execute/execute.rego"
    execute.write_text("package capgate.execute\n\ndecision := {}\n", encoding="utf-8")
    changed = revision_written(catalogue, out_dir, policies)
    assert changed != before
    # A policy moved to another path, same bytes: another bundle, another revision.
    execute.rename(policies / "capgate/execute/moved.rego")
    assert revision_written(catalogue, out_dir, policies) not in {before, changed}


def test_the_revision_follows_catalogue_and_policies_only(
    tmp_path: Path, catalogue: Catalogue, policies: Path
) -> None:
    out_dir = tmp_path / "bundle"
    before = revision_written(catalogue, out_dir, policies)
    # Tests and other files are not bundled, so they do not count.
    (policies / "capgate/lib/util_test.rego").write_text("package x_test\n", encoding="utf-8")
    (policies / "README.md").write_text("changed\n", encoding="utf-8")
    assert revision_written(catalogue, out_dir, policies) == before
    oracle = load_catalogue(demo_catalogue_dir("oracle-grove"))
    assert revision_written(oracle, out_dir, policies) != before


def test_the_revision_cannot_be_matched_by_moving_bytes_between_path_and_content(
    tmp_path: Path, catalogue: Catalogue
) -> None:
    digest = compile_catalogue(catalogue)["meta"]["digest"]
    assert bundle_module._revision(digest, {"a.rego": b"bc"}) != bundle_module._revision(
        digest, {"a.regob": b"c"}
    )


def test_bundle_replaces_an_earlier_bundle(
    tmp_path: Path, catalogue: Catalogue, policies: Path
) -> None:
    out_dir = tmp_path / "bundle"
    write_bundle(load_catalogue(demo_catalogue_dir("oracle-grove")), out_dir, policies)
    (policies / "capgate/execute/execute.rego").unlink()
    write_bundle(catalogue, out_dir, policies)
    assert "capgate/execute/execute.rego" not in files_under(out_dir)
    manifest = json.loads((out_dir / ".manifest").read_text(encoding="utf-8"))
    assert manifest["revision"] == bundle_revision(catalogue, policies)
    assert siblings(out_dir) == {"bundle", "policies"}


def test_empty_directory_may_be_filled(
    tmp_path: Path, catalogue: Catalogue, policies: Path
) -> None:
    out_dir = tmp_path / "bundle"
    out_dir.mkdir()
    write_bundle(catalogue, out_dir, policies)
    assert (out_dir / ".manifest").is_file()


def test_a_foreign_directory_is_not_replaced(
    tmp_path: Path, catalogue: Catalogue, policies: Path
) -> None:
    out_dir = tmp_path / "precious"
    out_dir.mkdir()
    (out_dir / "thesis.txt").write_text("years of work", encoding="utf-8")
    with pytest.raises(FileExistsError, match="refusing to replace"):
        write_bundle(catalogue, out_dir, policies)
    assert files_under(out_dir) == {"thesis.txt"}


def test_missing_policies_dir_leaves_nothing(tmp_path: Path, catalogue: Catalogue) -> None:
    out_dir = tmp_path / "out" / "bundle"
    with pytest.raises(FileNotFoundError, match="policies directory not found"):
        write_bundle(catalogue, out_dir, tmp_path / "no-policies")
    assert not (tmp_path / "out").exists()


def test_policies_dir_without_policies_is_refused(tmp_path: Path, catalogue: Catalogue) -> None:
    only_tests = tmp_path / "policies"
    only_tests.mkdir()
    (only_tests / "x_test.rego").write_text("package x_test\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="no policy files"):
        write_bundle(catalogue, tmp_path / "bundle", only_tests)
    assert not (tmp_path / "bundle").exists()


def test_failure_while_writing_leaves_no_partial_bundle(
    tmp_path: Path, catalogue: Catalogue, policies: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real_write = Path.write_bytes

    def write_then_fail(path: Path, data: bytes) -> int:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", write_then_fail)
    out_dir = tmp_path / "out" / "bundle"
    with pytest.raises(OSError, match="No space left"):
        write_bundle(catalogue, out_dir, policies)
    assert len(calls) == 2
    assert not out_dir.exists()
    assert siblings(out_dir) == set()


def test_failure_keeps_the_earlier_bundle(
    tmp_path: Path, catalogue: Catalogue, policies: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out_dir = tmp_path / "bundle"
    write_bundle(catalogue, out_dir, policies)
    before = {name: (out_dir / name).read_bytes() for name in files_under(out_dir)}

    def unwritable(path: Path, value: object, **_: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(bundle_module, "_write_json", unwritable)
    with pytest.raises(PermissionError):
        write_bundle(load_catalogue(demo_catalogue_dir("oracle-grove")), out_dir, policies)
    assert {name: (out_dir / name).read_bytes() for name in files_under(out_dir)} == before
    assert siblings(out_dir) == {"bundle", "policies"}


def test_failed_swap_restores_the_earlier_bundle(
    tmp_path: Path, catalogue: Catalogue, policies: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out_dir = tmp_path / "bundle"
    write_bundle(catalogue, out_dir, policies)
    manifest = (out_dir / ".manifest").read_bytes()
    real_replace = os.replace

    def refuse_moving_in(src: Path, dst: Path) -> None:
        if Path(src).name.endswith(".tmp"):
            raise OSError(5, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr("capgate.gateway.opa.bundle.os.replace", refuse_moving_in)
    with pytest.raises(OSError, match="Input/output"):
        write_bundle(load_catalogue(demo_catalogue_dir("oracle-grove")), out_dir, policies)
    assert (out_dir / ".manifest").read_bytes() == manifest
    assert siblings(out_dir) == {"bundle", "policies"}


def test_default_policies_dir_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPGATE_POLICIES", str(tmp_path))
    assert default_policies_dir() == tmp_path
    monkeypatch.setenv("CAPGATE_POLICIES", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=r"from \$CAPGATE_POLICIES"):
        default_policies_dir()


def test_default_policies_dir_is_the_checkout_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAPGATE_POLICIES", raising=False)
    repo = Path(__file__).resolve().parents[2]
    located = locate_policies()
    assert located.path == repo / "policies"
    assert located.source == "checkout"
    assert "checkout" in located.describe()


def test_packaged_policies_come_before_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPGATE_POLICIES", raising=False)
    (tmp_path / "capgate").mkdir()
    monkeypatch.setattr(policies_module, "_PACKAGED", tmp_path)
    assert locate_policies().path == tmp_path
    assert locate_policies().source == "package"


def test_missing_default_policies_dir_says_how_to_fix_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CAPGATE_POLICIES", raising=False)
    monkeypatch.setattr(policies_module, "_PACKAGE_DIR", tmp_path / "gateway")
    monkeypatch.setattr(policies_module, "_PACKAGED", tmp_path / "gateway" / "_policies")
    with pytest.raises(FileNotFoundError, match=r"set \$CAPGATE_POLICIES"):
        default_policies_dir()
