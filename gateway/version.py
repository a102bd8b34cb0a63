"""capgate's version, read from the installed distribution's metadata.

One source of truth: ``pyproject.toml``. A source tree that was never installed
(``PYTHONPATH`` use) has no metadata and reports ``0+unknown``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__: str = version("capgate")
except PackageNotFoundError:  # pragma: no cover - only outside any installation
    __version__ = "0+unknown"
