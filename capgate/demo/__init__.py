"""Demo catalogues shipped with capgate as package data.

``oracle-grove`` is the smallest useful catalogue (one pure tool and a role that
may not use it); ``sales`` shows connections, subjects, evidence, approvals and a
payment tool that only the finance role may see.
"""

from __future__ import annotations

from pathlib import Path

from capgate.gateway.errors import quote

__all__ = ["demo_catalogue_dir", "demo_catalogue_names"]

_CATALOGUES = Path(__file__).resolve().parent / "catalogues"


def demo_catalogue_names() -> list[str]:
    """The names of the shipped demo catalogues, sorted."""
    return sorted(p.name for p in _CATALOGUES.iterdir() if p.is_dir())


def demo_catalogue_dir(name: str) -> Path:
    """The directory of demo catalogue ``name``, ready for ``load_catalogue``.

    Only shipped names are accepted (no paths), so ``name`` cannot point elsewhere.
    """
    names = demo_catalogue_names()
    if name not in names:
        raise ValueError(f"unknown demo catalogue {quote(name)}; choose one of: {', '.join(names)}")
    return _CATALOGUES / name
