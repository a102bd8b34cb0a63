"""The package layout's rules, checked on the source itself.

- Every module imports first and alone, in a fresh interpreter: no hidden cycle
  (``import adapters.in_process`` as a program's first line once failed).
- Imports run one way: ``capgate`` (the application) -> ``adapters`` (transports)
  -> ``gateway`` (the core). The core never imports a transport or the app, not
  even inside a function.
- One logger family: every logger is ``capgate.<room>...``.
"""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "adapters", "capgate")
#: Which of our top-level packages each package may import.
ALLOWED = {
    "gateway": {"gateway"},
    "adapters": {"gateway", "adapters"},
    "capgate": {"gateway", "adapters", "capgate"},
}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


MODULES = _modules()


def test_the_layout_has_the_expected_rooms():
    names = {name for name, _ in MODULES}
    rooms = ("gateway.model", "gateway.catalogue", "gateway.opa", "gateway.dispatch")
    for room in (*rooms, "gateway.state", "gateway.service"):
        assert room in names
    flat = sorted(p.name for p in (REPO / "gateway").glob("*.py") if p.name != "__init__.py")
    assert len(flat) <= 4, f"gateway's top level is filling up again: {flat}"


def test_every_module_imports_first_and_alone():
    def first_import(name: str) -> tuple[str, int, str]:
        done = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,  # a bound on a hang: a fresh interpreter on a loaded machine
            check=False,
        )
        return name, done.returncode, done.stderr.strip().splitlines()[-1:]  # type: ignore[return-value]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(first_import, [name for name, _ in MODULES]))
    failures = {name: err for name, code, err in results if code != 0}
    assert failures == {}
    assert len(results) == len(MODULES) >= 30


def _imported_packages(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module.split(".")[0], node.lineno))
    return {(top, line) for top, line in found if top in PACKAGES}


@pytest.mark.parametrize(("name", "path"), MODULES, ids=[n for n, _ in MODULES])
def test_imports_run_one_way(name: str, path: Path):
    package = name.split(".")[0]
    wrong = sorted(
        f"line {line}: imports {top}"
        for top, line in _imported_packages(path)
        if top not in ALLOWED[package]
    )
    assert wrong == []


#: The core's rooms, each above the ones it may import: the stateful service on top,
#: then the stateless dispatcher, the store, the OPA side and the catalogue, all
#: over the models.
CORE_BELOW = {
    "gateway.service": {"gateway.dispatch", "gateway.state", "gateway.model", "gateway.opa",
                        "gateway.catalogue"},
    "gateway.dispatch": {"gateway.model"},
    "gateway.state": {"gateway.model"},
    "gateway.opa": {"gateway.model", "gateway.catalogue"},
    "gateway.catalogue": {"gateway.model"},
    "gateway.model": set(),
}  # fmt: skip


def _core_room(module: str) -> str | None:
    return next(
        (room for room in CORE_BELOW if module == room or module.startswith(room + ".")), None
    )


@pytest.mark.parametrize(
    ("name", "path"),
    [(n, p) for n, p in MODULES if _core_room(n)],
    ids=[n for n, _ in MODULES if _core_room(n)],
)
def test_the_cores_rooms_import_downwards_only(name: str, path: Path):
    room = _core_room(name)
    assert room is not None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    wrong = sorted(
        module
        for module in imported
        if (other := _core_room(module)) is not None
        and other != room
        and other not in CORE_BELOW[room]
    )
    assert wrong == []


def test_every_logger_is_in_the_capgate_family():
    for name, _ in MODULES:
        import_module(name)
    ours = [
        logger
        for logger in logging.root.manager.loggerDict
        if logger.split(".")[0] in {*PACKAGES, "capgate"}
    ]
    strays = [name for name in ours if name != "capgate" and not name.startswith("capgate.")]
    assert strays == []
    literal_names = []
    for _, path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "getLogger"
                and node.args
            ):
                arg = node.args[0]
                assert isinstance(arg, ast.Constant), f"{path}: logger name must be a literal"
                literal_names.append(arg.value)
    assert literal_names
    assert all(str(n).startswith("capgate.") for n in literal_names), literal_names
