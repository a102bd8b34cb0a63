"""Where the Rego policies capgate bundles come from, and which copy is in use.

The policies are the security boundary, so "which policies did this process
evaluate?" must always have one clear answer. They are looked for in this order,
and the first place that exists wins:

1. ``$CAPGATE_POLICIES``: an explicit folder (an error if it does not exist, never
   a silent fall-back to another copy);
2. the installed package: a wheel carries the policies as ``capgate/gateway/_policies``;
3. the checkout: ``policies/`` beside ``gateway/`` in a source tree (an editable
   install or ``PYTHONPATH`` use).

:func:`locate_policies` also says which of these it used; ``capgate doctor`` and
the demo print it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "POLICIES_ENV",
    "PoliciesLocation",
    "checkout_root",
    "default_policies_dir",
    "locate_policies",
]

#: Environment variable naming the folder of capgate's ``*.rego`` files.
POLICIES_ENV: Final = "CAPGATE_POLICIES"

_PACKAGE_DIR: Final = Path(__file__).resolve().parents[1]  # .../gateway
_PACKAGED: Final = _PACKAGE_DIR / "_policies"


@dataclass(frozen=True, slots=True)
class PoliciesLocation:
    """A policies folder and how it was chosen.

    ``source`` is ``env``, ``package`` or ``checkout`` (see :func:`locate_policies`),
    or ``argument`` when a caller named the folder itself.
    """

    path: Path
    source: str

    def describe(self) -> str:
        how = {
            "argument": "given by the caller",
            "env": f"from ${POLICIES_ENV}",
            "package": "shipped in the installed package",
            "checkout": "the source checkout's policies/",
        }[self.source]
        return f"{self.path} ({how})"


def checkout_root() -> Path | None:
    """The source checkout this ``gateway`` package runs from, or None when installed.

    A checkout is recognised by its ``pyproject.toml`` and ``policies/capgate``
    beside ``gateway/``; an installed package has neither next to it.
    """
    root = _PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file() and (root / "policies" / "capgate").is_dir():
        return root
    return None


def locate_policies() -> PoliciesLocation:
    """The policies folder to bundle (see the module docstring for the order).

    Raises ``FileNotFoundError`` when ``$CAPGATE_POLICIES`` names a missing folder or
    when neither the package nor a checkout holds the policies.
    """
    configured = os.environ.get(POLICIES_ENV)
    if configured:
        path = Path(configured).resolve()
        if not path.is_dir():
            raise FileNotFoundError(f"policies directory not found: {path} (from ${POLICIES_ENV})")
        return PoliciesLocation(path, "env")
    if (_PACKAGED / "capgate").is_dir():
        return PoliciesLocation(_PACKAGED, "package")
    root = checkout_root()
    if root is not None:
        return PoliciesLocation(root / "policies", "checkout")
    raise FileNotFoundError(
        f"no capgate policies found: ${POLICIES_ENV} is unset, {_PACKAGED} does not exist "
        "(this installation was built without them) and this is not a source checkout; "
        f"reinstall capgate from a wheel or set ${POLICIES_ENV} to the folder that holds "
        "the capgate *.rego files"
    )


def default_policies_dir() -> Path:
    """The folder :func:`locate_policies` chooses."""
    return locate_policies().path
