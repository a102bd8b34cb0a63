"""Find the OPA binary to run, and refuse one of a version capgate was not built for.

The embedded OPA evaluates the security boundary, so which binary runs must be
predictable and visible. The first of these that is set or exists wins:

1. the ``opa_binary`` argument (``EmbeddedOPA(..., opa_binary=...)``);
2. ``$CAPGATE_OPA_BIN``;
3. the checkout's ``.tools/bin/opa`` (built by ``scripts/install-tools.sh``);
4. ``opa`` on ``PATH``.

An explicit choice (1 or 2) that is not an executable is an error, never a reason
to fall back to another OPA. The chosen binary must report a version in
:data:`SUPPORTED` (OPA 1.x from :data:`MIN_VERSION` on): the policies use OPA 1.0
syntax and builtins, and were tested with :data:`PINNED_VERSION`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from capgate.gateway.errors import OPAProcessError
from capgate.gateway.opa.policies import checkout_root

__all__ = [
    "MIN_VERSION",
    "OPA_BIN_ENV",
    "PINNED_VERSION",
    "SUPPORTED",
    "OPABinary",
    "find_opa",
    "find_opa_binary",
    "opa_version",
]

#: Environment variable naming the OPA binary to use, ahead of every other place.
OPA_BIN_ENV: Final = "CAPGATE_OPA_BIN"
#: The OPA release capgate is tested with; ``scripts/versions.env`` pins the same.
PINNED_VERSION: Final = "1.22.4"
#: The oldest OPA accepted.
MIN_VERSION: Final = (1, 22, 0)
#: What ``opa version`` must report, in words, for error messages and docs.
SUPPORTED: Final = "OPA 1.x, 1.22.0 or newer"

_VERSION_RE: Final = re.compile(r"^Version:\s*v?(\d+)\.(\d+)\.(\d+)\S*\s*$", re.MULTILINE)
_HOW_TO_GET: Final = (
    f"get OPA v{PINNED_VERSION}: in a capgate checkout run `make setup` (it builds "
    f"the pinned OPA into .tools/bin), or `CGO_ENABLED=0 go install "
    f"github.com/open-policy-agent/opa@v{PINNED_VERSION}`, or download the release "
    f"from openpolicyagent.org; then put it on PATH or set ${OPA_BIN_ENV}"
)
# `opa version` of a given file, so that each binary is asked once per process.
_versions: dict[tuple[str, int, int], tuple[int, int, int]] = {}


@dataclass(frozen=True, slots=True)
class OPABinary:
    """An OPA executable, the version it reports, and how it was found."""

    path: Path
    version: tuple[int, int, int]
    source: str  # "argument", "env", "checkout" or "PATH"

    @property
    def version_text(self) -> str:
        return ".".join(str(part) for part in self.version)

    def describe(self) -> str:
        how = {
            "argument": "given by the caller",
            "env": f"from ${OPA_BIN_ENV}",
            "checkout": "the checkout's .tools/bin",
            "PATH": "found on PATH",
        }[self.source]
        return f"{self.path} (v{self.version_text}, {how})"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _candidate(explicit: Path | None) -> tuple[Path, str]:
    if explicit is not None:
        if not _is_executable(Path(explicit)):
            raise OPAProcessError(f"OPA binary {explicit} is not an executable file")
        return Path(explicit), "argument"
    configured = os.environ.get(OPA_BIN_ENV)
    if configured:
        path = Path(configured)
        if _is_executable(path):
            return path, "env"
        raise OPAProcessError(
            f"${OPA_BIN_ENV} is set to {configured}, which is not an executable file; "
            f"unset it or point it at an OPA binary ({SUPPORTED})"
        )
    root = checkout_root()
    tried = [f"${OPA_BIN_ENV} (unset)"]
    if root is not None:
        built = root / ".tools" / "bin" / "opa"
        tried.append(str(built))
        if _is_executable(built):
            return built, "checkout"
    on_path = shutil.which("opa")
    if on_path is not None:
        return Path(on_path), "PATH"
    tried.append("PATH")
    raise OPAProcessError(f"no OPA binary found (looked at {', '.join(tried)}); {_HOW_TO_GET}")


def opa_version(path: Path) -> tuple[int, int, int]:
    """The version ``path version`` reports; OPAProcessError if it reports none."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key in _versions:
        return _versions[key]
    try:
        done = subprocess.run(
            [str(path), "version"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise OPAProcessError(f"could not run {path} version: {exc}") from None
    match = _VERSION_RE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise OPAProcessError(
            f"{path} does not look like OPA: `{path.name} version` exited "
            f"{done.returncode} without a 'Version: x.y.z' line; {_HOW_TO_GET}"
        )
    version = (int(match[1]), int(match[2]), int(match[3]))
    _versions[key] = version
    return version


def find_opa(explicit: Path | None = None) -> OPABinary:
    """The OPA to run, checked to be a supported version (see the module docstring)."""
    path, source = _candidate(explicit)
    version = opa_version(path)
    if version[0] != MIN_VERSION[0] or version < MIN_VERSION:
        shown = ".".join(map(str, version))
        raise OPAProcessError(
            f"{path} is OPA v{shown}, which capgate does not support (it needs "
            f"{SUPPORTED}); {_HOW_TO_GET}"
        )
    return OPABinary(path, version, source)


def find_opa_binary(explicit: Path | None = None) -> Path:
    """The path of :func:`find_opa`'s choice."""
    return find_opa(explicit).path
