"""The two sides of ``capgate diff``: a git revision, or the working tree, as a bundle.

BASE and HEAD are git revisions of the repository ``--repo`` (default: the current
folder); without HEAD the other side is the working tree. Each revision's
``--policies`` folder and ``--catalogue`` folder are extracted with ``git archive``
into a private temporary folder, the catalogue is loaded and the bundle written as
``capgate bundle`` writes it (:func:`capgate.gateway.opa.bundle.write_bundle`).

A module of its own as the only one that runs git; a :class:`Side` then carries what
OPA answered for that side (:mod:`capgate.cli.commands.diff.evaluate`).
"""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from capgate.cli.commands.common import safe
from capgate.cli.commands.diff.queries import EXCLUDED
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.errors import InvalidInput
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.bundle import write_bundle
from capgate.gateway.policy.timeouts import DEFAULT_TIMEOUT

__all__ = ["Side", "prepare", "relative", "repository"]


@dataclass
class Side:
    """A revision (or the working tree), its catalogue and its bundle."""

    name: str  # "base" or "head"
    label: str  # the revision as given and its commit, or "working tree"
    catalogue: Catalogue
    bundle: Path
    #: --no-reasons: reasons are not asked for
    reasons: bool = True
    #: --timeout: the seconds each question may take, before the allowance a tool of a
    #: question about the whole catalogue (:func:`.evaluate.eval_seconds`)
    timeout: float = DEFAULT_TIMEOUT
    #: the entrypoint the reasons were read from (:data:`.queries.REASON_SOURCES`,
    #: :data:`.queries.EXCLUDED`)
    reasons_source: str = EXCLUDED
    #: per scenario: visible names, and reason codes per hidden tool
    results: list[tuple[frozenset[str], dict[str, frozenset[str]]]] = field(default_factory=list)
    #: per call asked (see :func:`.calls.calls_to_ask`): allowed, and the deny's codes
    calls: list[tuple[bool, frozenset[str]]] = field(default_factory=list)

    @property
    def reasons_from(self) -> str:
        if not self.reasons:
            return "nowhere (--no-reasons)"
        return self.reasons_source


def _git(repo: Path, *args: str) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except OSError as exc:
        raise InvalidInput(f"cannot run git: {exc.strerror}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InvalidInput(f"git {args[0]} failed: {safe(message[-1] if message else '?')}")
    return done.stdout


def repository(folder: Path) -> Path:
    """The top folder of the git repository ``folder`` is in."""
    return Path(_git(folder, "rev-parse", "--show-toplevel").decode().strip())


def _commit(repo: Path, revision: str) -> str:
    if not revision or revision.startswith("-"):
        raise InvalidInput(f"{safe(revision)!r} is not a git revision")
    try:
        found = _git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    except InvalidInput:
        raise InvalidInput(f"no commit {safe(revision)!r} in {repo}") from None
    return found.decode().strip()


def relative(path: Path, what: str) -> str:
    """``path`` (the option ``what``) as git names it, if it is inside the repository."""
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise InvalidInput(
            f"{what} {path}: give a path inside the repository, relative to its root"
        )
    return path.as_posix()


def _extract(repo: Path, commit: str, paths: Sequence[str], into: Path) -> None:
    archive = into / "revision.tar"
    archive.write_bytes(_git(repo, "archive", "--format=tar", commit, "--", *paths))
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    archive.unlink()


def prepare(
    name: str,
    revision: str | None,
    repo: Path,
    policies: str,
    catalogue: str,
    work: Path,
) -> Side:
    """The side ``name``: ``revision`` (None: the working tree) of ``repo``, with its
    policies and catalogue extracted under ``work``, the catalogue loaded, the bundle
    written."""
    folder = work / name
    folder.mkdir()
    if revision is None:
        tree, label = repo, "working tree"
    else:
        commit = _commit(repo, revision)
        _extract(repo, commit, [policies, catalogue], folder)
        tree, label = folder / "tree", f"{revision} ({commit[:12]})"
    loaded = load_catalogue(tree / catalogue)
    bundle = write_bundle(loaded, folder / "bundle", tree / policies)
    return Side(name, label, loaded, bundle)
