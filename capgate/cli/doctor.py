"""``capgate doctor``: say exactly what this installation would use, and whether it works.

Every part of the answer to "which policies did that decision come from?" is here:
the capgate version and where it is installed, the OPA binary and its version, the
policies folder, the catalogue and its digest, the OPA token (where it comes from,
never its value) and the OPA address. The last check really asks that OPA: it starts
the embedded one (and stops it), or contacts the external one with the token, asks
whether it is ready (healthy, every bundle active) and compares the catalogue digest
it serves with the local one, and asks it the catalogue's fixtures, as serve and
worker do before they serve it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.errors import CapgateError, CatalogueError
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.binary import SUPPORTED, find_opa
from capgate.gateway.opa.policies import checkout_root, locate_policies
from capgate.gateway.opa.sidecar import (
    OPA_TOKEN_ENV,
    OPA_TOKEN_FILE_ENV,
    OPA_URL_ENV,
    PolicySidecar,
    configured_token,
    opa_address,
    token_file_problem,
)
from capgate.gateway.policy.address import AddressOrigin, OPAAddress
from capgate.gateway.service.fixtures import check_fixtures
from capgate.gateway.version import __version__

__all__ = ["Check", "run_doctor"]


@dataclass
class Check:
    """One line of the report: what was looked at, what was found, and whether it is fine."""

    name: str
    ok: bool
    detail: str
    facts: dict[str, Any] = field(default_factory=dict)


def _installation() -> Check:
    import capgate

    where = Path(capgate.__file__).resolve().parent.parent
    root = checkout_root()
    kind = f"source checkout {root}" if root is not None else f"installed in {where}"
    return Check(
        "capgate",
        True,
        f"{__version__} ({kind}; python {sys.version.split()[0]} at {sys.executable})",
        {"version": __version__, "location": str(where), "checkout": root is not None},
    )


def _opa_binary(explicit: Path | None) -> Check:
    try:
        binary = find_opa(explicit)
    except CapgateError as exc:
        return Check("opa binary", False, str(exc))
    return Check(
        "opa binary",
        True,
        f"{binary.describe()}; supported: {SUPPORTED}",
        {"path": str(binary.path), "version": binary.version_text, "source": binary.source},
    )


def _policies() -> Check:
    try:
        located = locate_policies()
    except FileNotFoundError as exc:
        return Check("policies", False, str(exc))
    system = located.path / "system"
    files = sorted(
        p
        for p in located.path.rglob("*.rego")
        if not p.name.endswith("_test.rego") and system not in p.parents
    )
    return Check(
        "policies",
        bool(files),
        f"{located.describe()}, {len(files)} policy file(s)",
        {"path": str(located.path), "source": located.source, "files": len(files)},
    )


def _token(external: bool) -> Check:
    """Where the OPA token comes from (never its value), and whether its file is private."""
    try:
        found = configured_token()
    except ValueError as exc:
        return Check("opa token", False, str(exc))
    if found is None:
        detail = (
            f"none (${OPA_TOKEN_FILE_ENV} and ${OPA_TOKEN_ENV} unset): an OPA locked down "
            "with --authentication=token refuses capgate"
            if external
            else "not needed: the embedded OPA listens on a private unix socket"
        )
        return Check("opa token", True, detail, {"configured": False})
    _, source = found
    if not external:
        return Check(
            "opa token",
            True,
            f"{source.describe()}; not used: the embedded OPA needs none",
            {"configured": True, "used": False},
        )
    problem = token_file_problem(source.path) if source.path is not None else None
    detail = source.describe() + (f"; {problem}" if problem else "")
    return Check(
        "opa token",
        problem is None,
        detail,
        {"configured": True, "used": True, "path": str(source.path) if source.path else None},
    )


def run_doctor(
    catalogue_dir: Path, *, opa_url: str | None, opa_binary: Path | None, catalogue_note: str = ""
) -> list[Check]:
    """Every check, in order; a failed check does not stop the others."""
    checks = [_installation(), _opa_binary(opa_binary), _policies()]
    try:
        catalogue = load_catalogue(catalogue_dir)
    except CapgateError as exc:
        checks.append(Check("catalogue", False, f"{catalogue_dir}: {exc}"))
        return checks
    meta = compile_catalogue(catalogue)["meta"]
    kept = sorted(
        f"{name} v{version}"
        for name, versions in catalogue.retained.items()
        for version in versions
    )
    checks.append(
        Check(
            "catalogue",
            True,
            f"{catalogue_dir}{catalogue_note}: {meta['tool_count']} tool(s), "
            f"digest {meta['digest']}" + (f"; keeps {', '.join(kept)}" if kept else ""),
            {
                "path": str(catalogue_dir),
                "digest": meta["digest"],
                "tools": meta["tool_count"],
                "kept_versions": kept,
                "fixtures": len(catalogue.fixtures),
            },
        )
    )
    external = opa_address(OPAAddress(opa_url, AddressOrigin.OPTION) if opa_url else None)
    checks.append(_token(external is not None))
    where = (
        f"external, {external.url}"
        + ("" if external.origin is AddressOrigin.OPTION else f" (from ${OPA_URL_ENV})")
        if external
        else "embedded: capgate starts its own OPA on a private unix socket"
    )
    fixtures: Check | None = None
    try:
        with PolicySidecar(catalogue, opa_url=external, opa_binary=opa_binary) as sidecar:
            address = sidecar.client.address
            healthy = sidecar.ready()
            if healthy:
                fixtures = _fixtures(catalogue, sidecar)
    except (CapgateError, ValueError, OSError) as exc:
        checks.append(Check("opa address", False, f"{where}; not usable: {exc}"))
        return checks
    checks.append(
        Check(
            "opa address",
            healthy,
            f"{where}; answered at {address}: "
            + (
                f"ready (healthy, every bundle active), serves catalogue {meta['digest']}"
                if healthy
                else "served the catalogue but is not ready: its bundles are not (all) active"
            ),
            {
                "address": address,
                "embedded": external is None,
                "healthy": healthy,
                "ready": healthy,
            },
        )
    )
    if fixtures is not None:
        checks.append(fixtures)
    return checks


def _fixtures(catalogue: Catalogue, sidecar: PolicySidecar) -> Check:
    """The catalogue's fixtures asked of the OPA, as serve and worker ask them before
    they serve it: a failing one would stop them."""
    count = len(catalogue.fixtures)
    try:
        check_fixtures(catalogue, sidecar.client, datetime.now(UTC))
    except CatalogueError as failed:
        problems = "; ".join(failed.problems[:3])
        more = f" and {len(failed.problems) - 3} more" if len(failed.problems) > 3 else ""
        detail = (
            f"{len(failed.problems)} of {count} fixture(s) do not get their decision, so "
            f"serve and worker refuse this catalogue: {problems}{more}"
        )
        return Check("fixtures", False, detail, {"fixtures": count, "failing": failed.problems})
    what = f"{count} fixture(s), each decided as it expects" if count else "none (no fixtures.yaml)"
    return Check("fixtures", True, what, {"fixtures": count, "failing": []})
