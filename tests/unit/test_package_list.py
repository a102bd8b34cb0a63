"""The wheel's package list names every package of the source tree.

pyproject.toml lists the packages (it cannot find them: the folders are mapped onto
``capgate``), so a new subpackage left out of the list installs in editable mode and
vanishes from the wheel. tests/integration/test_packaging.py builds the wheel; this
catches the omission in a second, before any image or wheel is built.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Where each folder of the card's top level goes in the one import name.
ROOTS = {"gateway": "capgate.gateway", "adapters": "capgate.adapters", "capgate": "capgate"}


def source_packages() -> set[str]:
    found = set()
    for folder, name in ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            if "__pycache__" in parts or (
                folder == "capgate" and parts[:1] in {("gateway",), ("adapters",)}
            ):
                continue  # capgate/gateway and capgate/adapters are the folders' links
            found.add(".".join((name, *parts)))
    return found


def test_every_source_package_is_in_the_wheel_list():
    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    assert source_packages() - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - source_packages() == {"capgate.gateway._policies"}
