"""``capgate doctor``: say exactly what this installation would use, and whether it works.

Every part of the answer to "which policies did that decision come from?" is here:
the capgate version and where it is installed, the OPA binary and its version, the
policies folder, the catalogue and its digest, and the OPA address. The last check
really asks that OPA: it starts the embedded one (and stops it), or contacts the
external one, and compares the catalogue digest it serves with the local one.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.catalogue import compile_catalogue, load_catalogue
from gateway.errors import CapgateError
from gateway.opa.binary import SUPPORTED, find_opa
from gateway.opa.policies import checkout_root, locate_policies
from gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from gateway.version import __version__

__all__ = ["Check", "run_doctor"]


@dataclass
class Check:
    """One line of the report: what was looked at, what was found, and whether it is fine."""

    name: str
    ok: bool
    detail: str
    facts: dict[str, Any] = field(default_factory=dict)


def _installation() -> Check:
    import gateway

    where = Path(gateway.__file__).resolve().parent.parent
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
    files = sorted(p for p in located.path.rglob("*.rego") if not p.name.endswith("_test.rego"))
    return Check(
        "policies",
        bool(files),
        f"{located.describe()}, {len(files)} policy file(s)",
        {"path": str(located.path), "source": located.source, "files": len(files)},
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
    checks.append(
        Check(
            "catalogue",
            True,
            f"{catalogue_dir}{catalogue_note}: {meta['tool_count']} tool(s), "
            f"digest {meta['digest']}",
            {"path": str(catalogue_dir), "digest": meta["digest"], "tools": meta["tool_count"]},
        )
    )
    url = opa_url or os.environ.get(OPA_URL_ENV) or None
    where = (
        f"external, {url}" + ("" if opa_url else f" (from ${OPA_URL_ENV})")
        if url
        else "embedded: capgate starts its own OPA on a private unix socket"
    )
    try:
        with PolicySidecar(catalogue, opa_url=url, opa_binary=opa_binary) as sidecar:
            address = sidecar.client.address
            healthy = sidecar.client.health(bundles=True)
    except (CapgateError, ValueError, OSError) as exc:
        checks.append(Check("opa address", False, f"{where}; not usable: {exc}"))
        return checks
    checks.append(
        Check(
            "opa address",
            healthy,
            f"{where}; answered at {address}: "
            + (
                f"healthy, bundle active, serves catalogue {meta['digest']}"
                if healthy
                else "served the catalogue but reports its bundles not (all) active"
            ),
            {"address": address, "embedded": url is None, "healthy": healthy},
        )
    )
    return checks
