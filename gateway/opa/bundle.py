"""Write an OPA bundle: the capgate policies plus the compiled catalogue.

Policies and data travel together in one bundle, so OPA can never serve the rules
of one release with the catalogue of another. The compiled data carries the
catalogue digest (``data.capgate.catalogue.meta.digest``), which every decision
repeats, so the client can check that each answer was made under the catalogue this
process loaded.

The manifest's ``revision`` identifies the whole bundle: a SHA-256 over the
catalogue digest and every bundled policy file (path and bytes). A change of policy
alone therefore changes the revision too, and OPA reports the revision with every
answer (``provenance.bundles``), so a gateway that wrote the bundle can pin it
(:func:`bundle_revision` says what it will be) and every trace shows what answered.

The bundle is built in a temporary sibling directory and renamed into place, so a
failure part-way leaves either the previous bundle or nothing, never half of one.

The policies folder may also hold ``system/``: the deployment's own policies for OPA
(``system.authz``, ``system.log``). They are not capgate's decisions and are never
part of this bundle; :mod:`capgate.gateway.opa.deploy` adds them, with their own roots, to
the signed bundle a deployed OPA loads (``extra`` and ``extra_roots`` below).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from capgate.gateway.catalogue.compile import compile_catalogue
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.policies import default_policies_dir

__all__ = ["BUNDLE_ROOT", "DATA_PATH", "bundle_revision", "write_bundle"]

#: The only root the bundle claims: OPA rejects policies or data outside it.
BUNDLE_ROOT = "capgate"
#: Where the compiled catalogue sits in the bundle, i.e. ``data.capgate.catalogue``.
DATA_PATH = Path(BUNDLE_ROOT, "catalogue", "data.json")
#: The folder of the policies folder that holds the deployment's system policies.
SYSTEM_DIR = "system"


def _rego_files(folder: Path) -> list[Path]:
    """Every ``*.rego`` under ``folder`` but tests, sorted."""
    return sorted(
        path
        for path in folder.rglob("*.rego")
        if path.is_file() and not path.name.endswith("_test.rego")
    )


def _policy_files(policies_dir: Path) -> list[Path]:
    if not policies_dir.is_dir():
        raise FileNotFoundError(f"policies directory not found: {policies_dir}")
    system = policies_dir / SYSTEM_DIR
    files = [path for path in _rego_files(policies_dir) if system not in path.parents]
    if not files:
        raise FileNotFoundError(
            f"no policy files (*.rego, tests excluded) under {policies_dir}; "
            "a bundle without policies would answer every question with 'undefined'"
        )
    return files


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace anything but an earlier bundle or an empty directory.

    ``out_dir`` is replaced as a whole, so a mistaken path such as the home
    directory must fail here instead of being deleted.
    """
    if not os.path.lexists(out_dir):
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        raise FileExistsError(f"refusing to replace {out_dir}: it is not a directory")
    if any(out_dir.iterdir()) and not (out_dir / ".manifest").is_file():
        raise FileExistsError(
            f"refusing to replace {out_dir}: it is not empty and has no .manifest, "
            "so it is not a bundle written here"
        )


def _write_json(path: Path, value: Any, *, compact: bool = False) -> None:
    # The catalogue is written compact: json's C encoder serves only indent=None, and
    # the pure-Python one takes about half a second for 10,000 tools.
    path.parent.mkdir(parents=True, exist_ok=True)
    if compact:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    else:
        text = json.dumps(value, indent=2, sort_keys=True)
    path.write_text(text + "\n", encoding="utf-8")


def _move_into_place(staging: Path, out_dir: Path) -> None:
    if not os.path.lexists(out_dir):
        os.replace(staging, out_dir)
        return
    # A directory cannot be renamed over a non-empty one: set the old bundle aside,
    # move the new one in, and put the old one back if that fails.
    previous = staging.with_name(staging.name + ".old")
    os.replace(out_dir, previous)
    try:
        os.replace(staging, out_dir)
    except BaseException:
        os.replace(previous, out_dir)
        raise
    shutil.rmtree(previous, ignore_errors=True)


def _policy_sources(policies_dir: Path) -> dict[str, bytes]:
    """Each bundled policy file's bytes, by its path relative to ``policies_dir``.

    Read once: the bytes hashed into the revision are the bytes written.
    """
    return {
        source.relative_to(policies_dir).as_posix(): source.read_bytes()
        for source in _policy_files(policies_dir)
    }


def _revision(catalogue_digest: str, sources: dict[str, bytes]) -> str:
    """``sha256:<hex>`` over the catalogue digest and the sorted (path, bytes) pairs.

    Every part is length-prefixed, so no two different bundles can hash the same
    sequence of bytes by moving a boundary between a path and a file's content.
    """
    sha = hashlib.sha256()
    parts = [b"capgate-bundle-v1", catalogue_digest.encode()]
    for path, content in sorted(sources.items()):
        parts += [path.encode(), content]
    for part in parts:
        sha.update(len(part).to_bytes(8, "big"))
        sha.update(part)
    return "sha256:" + sha.hexdigest()


def _sources(policies_dir: Path, extra: Mapping[str, bytes] | None) -> dict[str, bytes]:
    sources = _policy_sources(policies_dir)
    for relative, content in (extra or {}).items():
        if relative in sources or relative == DATA_PATH.as_posix():
            raise ValueError(f"extra bundle file {relative} would replace a capgate file")
        parts = Path(relative).parts
        if not parts or Path(relative).is_absolute() or ".." in parts or parts[0] == BUNDLE_ROOT:
            raise ValueError(f"extra bundle file {relative}: give a relative path outside capgate/")
        sources[Path(relative).as_posix()] = bytes(content)
    return sources


def bundle_revision(
    catalogue: Catalogue,
    policies_dir: Path | None = None,
    *,
    extra: Mapping[str, bytes] | None = None,
) -> str:
    """The manifest ``revision`` that :func:`write_bundle` gives these inputs.

    Same arguments as :func:`write_bundle`; writes nothing. Changes with the
    catalogue's authority (its digest) and with any byte of any bundled policy file
    (or extra file).
    """
    policies = default_policies_dir() if policies_dir is None else Path(policies_dir)
    digest = compile_catalogue(catalogue)["meta"]["digest"]
    return _revision(digest, _sources(policies, extra))


def write_bundle(
    catalogue: Catalogue,
    out_dir: Path,
    policies_dir: Path | None = None,
    *,
    extra: Mapping[str, bytes] | None = None,
    extra_roots: Sequence[str] = (),
) -> Path:
    """Write the bundle directory ``out_dir`` and return it.

    It holds every ``*.rego`` under ``policies_dir`` (default: the folder that
    :func:`capgate.gateway.opa.policies.locate_policies` chooses) except ``*_test.rego`` and
    the ``system/`` folder, at the same relative paths; the compiled catalogue at
    ``capgate/catalogue/data.json``; and a ``.manifest`` with :func:`bundle_revision`
    as ``revision`` and ``capgate`` as the only root. An earlier bundle at
    ``out_dir`` is replaced; any other non-empty directory there is refused with
    ``FileExistsError``.

    ``extra`` adds files (relative path to bytes, outside ``capgate/``) and
    ``extra_roots`` the roots they claim; both count in the revision. The deployment
    bundle (:mod:`capgate.gateway.opa.deploy`) adds the system policies this way.
    """
    policies = default_policies_dir() if policies_dir is None else Path(policies_dir)
    sources = _sources(policies, extra)
    roots = [BUNDLE_ROOT, *extra_roots]
    if len(set(roots)) != len(roots) or not all(roots):
        raise ValueError(f"bundle roots must be distinct and non-empty: {roots}")
    out_dir = Path(out_dir)
    _check_replaceable(out_dir)
    document = compile_catalogue(catalogue)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; OPA may run as another user
        for relative, content in sources.items():
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        _write_json(staging / DATA_PATH, document, compact=True)
        revision = _revision(document["meta"]["digest"], sources)
        _write_json(staging / ".manifest", {"revision": revision, "roots": roots})
        _move_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir
