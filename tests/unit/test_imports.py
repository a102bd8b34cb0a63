"""The package layout's rules, checked on the source itself.

- One import name: every module is ``capgate.<...>``; the card's folders ``gateway/``
  and ``adapters/`` are ``capgate.gateway`` and ``capgate.adapters``.
- Every module imports first and alone, in a fresh interpreter: no hidden cycle
  (``import capgate.adapters.tools.in_process`` as a program's first line once failed).
- Imports run one way: the application (``capgate``'s own modules: the command
  line, the MCP server, the demo) -> ``capgate.adapters`` (transports) ->
  ``capgate.gateway`` (the core). The core never imports a transport, the
  application or ``capgate`` itself (the public surface above it), not even inside a
  function.
- No import circle between modules, counting what runs when a module loads
  (``TYPE_CHECKING`` blocks and function bodies aside).
- The core's rooms import downwards only (``CORE_BELOW``), and tools never reach the
  fronts.
- The MCP tool package's modules import downwards only (``MCP_TOOLS_BELOW``); those
  that load without the ``mcp`` extra import no SDK, and outside the package only
  its adapter of the modules that need the SDK is imported.
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

from tests.hang import HANG_SECONDS

REPO = Path(__file__).resolve().parents[2]
#: The folders of the repository and the packages they are.
FOLDERS = {"capgate": "capgate", "gateway": "capgate.gateway", "adapters": "capgate.adapters"}
#: The areas, and which areas each may import.
ALLOWED = {
    "core": {"core"},
    "adapters": {"core", "adapters"},
    "app": {"core", "adapters", "app"},
}


def _area(module: str) -> str | None:
    """The area of a module name of ours (None: not ours)."""
    if module == "capgate.gateway" or module.startswith("capgate.gateway."):
        return "core"
    if module == "capgate.adapters" or module.startswith("capgate.adapters."):
        return "adapters"
    if module == "capgate" or module.startswith("capgate."):
        return "app"
    return None


def _modules() -> list[tuple[str, Path]]:
    found = []
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO / folder)
            if folder == "capgate" and relative.parts[0] in ("gateway", "adapters"):
                continue  # the links to the other two folders, seen through them
            parts = [package, *relative.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


MODULES = _modules()


def test_the_folders_are_one_package_through_links() -> None:
    for folder in ("gateway", "adapters"):
        link = REPO / "capgate" / folder
        assert link.is_symlink(), f"capgate/{folder} should be a link to ../{folder}"
        assert link.resolve() == (REPO / folder).resolve()
    assert not (REPO / "gateway" / "py.typed").exists()  # one marker, capgate's


def test_the_layout_has_the_expected_rooms():
    names = {name for name, _ in MODULES}
    rooms = (
        "capgate.gateway.model",
        "capgate.gateway.catalogue",
        "capgate.gateway.opa",
        "capgate.gateway.enforce",
    )
    for room in (*rooms, "capgate.gateway.state", "capgate.gateway.service"):
        assert room in names
    for room in ("capgate.gateway.enforce", "capgate.gateway.tools", "capgate.gateway.policy",
                 "capgate.gateway.schema", "capgate.adapters.fronts", "capgate.adapters.tools",
                 "capgate.cli", "capgate.cli.commands.diff",
                 "capgate.adapters.tools.mcp"):  # fmt: skip
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
            timeout=HANG_SECONDS,  # a bound on a hang: a fresh interpreter on a loaded machine
            check=False,
        )
        return name, done.returncode, done.stderr.strip().splitlines()[-1:]  # type: ignore[return-value]

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(first_import, [name for name, _ in MODULES]))
    failures = {name: err for name, code, err in results if code != 0}
    assert failures == {}
    assert len(results) == len(MODULES) >= 30


def _imported_areas(path: Path) -> set[tuple[str, str, int]]:
    """(area, module, line) of every import of ours in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(alias.name, node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module, node.lineno))
    return {(area, module, line) for module, line in found if (area := _area(module))}


@pytest.mark.parametrize(("name", "path"), MODULES, ids=[n for n, _ in MODULES])
def test_imports_run_one_way(name: str, path: Path):
    area = _area(name)
    assert area is not None
    wrong = sorted(
        f"line {line}: imports {module}"
        for other, module, line in _imported_areas(path)
        if other not in ALLOWED[area]
    )
    assert wrong == []


#: The core's rooms, each above the ones it may import, along the path a call takes:
#: the stateful service drives enforcement (decide, then run), which reaches tools
#: through their contract and registry; asking OPA (policy) and running OPA (opa) sit
#: beside them; beneath all, the store, the catalogue, the models and the JSON Schema
#: dialect. The leaf modules (errors, digest, version) may be imported from anywhere.
CORE_BELOW = {
    "capgate.gateway.service": {"capgate.gateway.enforce", "capgate.gateway.tools",
                                "capgate.gateway.state", "capgate.gateway.model",
                                "capgate.gateway.schema", "capgate.gateway.catalogue"},
    "capgate.gateway.enforce": {"capgate.gateway.tools", "capgate.gateway.model",
                                "capgate.gateway.schema"},
    "capgate.gateway.tools": {"capgate.gateway.state", "capgate.gateway.model"},
    "capgate.gateway.opa": {"capgate.gateway.policy", "capgate.gateway.catalogue",
                            "capgate.gateway.model"},
    "capgate.gateway.policy": {"capgate.gateway.model"},
    "capgate.gateway.catalogue": {"capgate.gateway.model", "capgate.gateway.schema"},
    "capgate.gateway.state": {"capgate.gateway.model"},
    "capgate.gateway.model": {"capgate.gateway.schema"},
    "capgate.gateway.schema": set(),
}  # fmt: skip


def test_the_core_rooms_form_no_circle() -> None:
    seen: set[str] = set()

    def visit(room: str, path: tuple[str, ...]) -> None:
        assert room not in path, f"a circle of rooms: {' -> '.join((*path, room))}"
        if room not in seen:
            for below in CORE_BELOW[room]:
                visit(below, (*path, room))
            seen.add(room)

    for room in CORE_BELOW:
        visit(room, ())


#: ``capgate diff``'s steps in the order they run, each importing only the ones before it.
DIFF_STEPS = (
    "matrix", "queries", "sides", "calls", "evaluate", "fixtures", "compare", "report", "grid",
    "page",
    "command",
)  # fmt: skip


def test_the_diff_steps_import_earlier_steps_only() -> None:
    package = "capgate.cli.commands.diff"
    steps = {f"{package}.{step}": at for at, step in enumerate(DIFF_STEPS)}
    assert {name for name, _ in MODULES if name.startswith(f"{package}.")} == set(steps)
    wrong = sorted(
        f"{name}: imports {module}"
        for name, path in MODULES
        if name in steps
        for _, module, _ in _imported_areas(path)
        if module.startswith(package) and steps.get(module, len(steps)) >= steps[name]
    )
    assert wrong == []


def test_tools_never_reach_the_fronts() -> None:
    # How tools are reached sits below how agents and people reach the gateway.
    wrong = sorted(
        f"{name}: imports {module}"
        for name, path in MODULES
        if name.startswith("capgate.adapters.tools")
        for _, module, _ in _imported_areas(path)
        if module.startswith("capgate.adapters.fronts")
    )
    assert wrong == []


def _core_room(module: str) -> str | None:
    return next(
        (room for room in CORE_BELOW if module == room or module.startswith(room + ".")), None
    )


def _imported(path: Path) -> set[str]:
    """Every module name the file imports, anywhere in it (inside a function too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


@pytest.mark.parametrize(
    ("name", "path"),
    [(n, p) for n, p in MODULES if _core_room(n)],
    ids=[n for n, _ in MODULES if _core_room(n)],
)
def test_the_cores_rooms_import_downwards_only(name: str, path: Path):
    room = _core_room(name)
    assert room is not None
    wrong = sorted(
        module
        for module in _imported(path)
        if (other := _core_room(module)) is not None
        and other != room
        and other not in CORE_BELOW[room]
    )
    assert wrong == []


#: The MCP tool adapter's modules, each with those of its package it may import: the
#: adapter (client) over the sessions, which hold the listings, all of them over the
#: event loop and what a call's end means; beside them, what needs no SDK. The
#: sessions never reach back to the adapter, the listing never to the sessions.
MCP_TOOLS = "capgate.adapters.tools.mcp"
MCP_TOOLS_BELOW = {
    "client": {"config", "loop", "outcomes", "placement", "schemas", "sessions"},
    "sessions": {"config", "listing", "loop", "outcomes"},
    "listing": {"definitions", "pins"},
    "loop": {"outcomes"},
    "outcomes": {"schemas"},
    "placement": set(),
    "pins": {"definitions"},
    "definitions": set(),
    "schemas": set(),
    "config": set(),
}
#: Those that load without the mcp extra (tests/unit/test_mcp_imports.py runs them so).
MCP_TOOLS_WITHOUT_SDK = {"config", "definitions", "pins", "placement", "schemas"}


def test_the_mcp_tool_modules_are_all_mapped_and_form_no_circle() -> None:
    found = {n.removeprefix(MCP_TOOLS + ".") for n, _ in MODULES if n.startswith(MCP_TOOLS + ".")}
    assert found == set(MCP_TOOLS_BELOW)
    assert found >= MCP_TOOLS_WITHOUT_SDK

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"a circle of modules: {' -> '.join((*path, module))}"
        for below in MCP_TOOLS_BELOW[module]:
            visit(below, (*path, module))

    for module in MCP_TOOLS_BELOW:
        visit(module, ())


@pytest.mark.parametrize(
    ("name", "path"),
    [(n, p) for n, p in MODULES if n.startswith(MCP_TOOLS + ".")],
    ids=[n for n, _ in MODULES if n.startswith(MCP_TOOLS + ".")],
)
def test_the_mcp_tool_modules_import_downwards_only(name: str, path: Path) -> None:
    module = name.removeprefix(MCP_TOOLS + ".")
    imported = _imported(path)
    ours = {m.removeprefix(MCP_TOOLS + ".") for m in imported if m.startswith(MCP_TOOLS + ".")}
    assert sorted(ours - MCP_TOOLS_BELOW[module]) == []
    assert MCP_TOOLS not in imported  # the package, which imports its modules
    if module in MCP_TOOLS_WITHOUT_SDK:
        sdk = sorted(m for m in imported if m.split(".")[0] in ("mcp", "mcp_types"))
        assert sdk == [], f"{name} is to load without the mcp extra"


def test_outside_its_package_only_the_adapter_of_the_mcp_tool_modules_needs_the_sdk() -> None:
    wrong = sorted(
        f"{name}: imports {module}"
        for name, path in MODULES
        if not (name == MCP_TOOLS or name.startswith(MCP_TOOLS + "."))
        for module in _imported(path)
        if module.startswith(MCP_TOOLS + ".")
        and module.removeprefix(MCP_TOOLS + ".") not in MCP_TOOLS_WITHOUT_SDK | {"client"}
    )
    assert wrong == []


def test_every_logger_is_in_the_capgate_family():
    for name, _ in MODULES:
        import_module(name)
    ours = [
        logger
        for logger in logging.root.manager.loggerDict
        if logger.split(".")[0] in {"gateway", "adapters", "capgate"}
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


def _load_time_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that ``name`` imports when it loads: module-level
    imports, outside ``if TYPE_CHECKING:`` blocks (never run) and function bodies
    (run later, on a call). ``from a import b`` is module ``a.b`` when that is one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                test = node.test
                guarded = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                )
                if not guarded:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in known else node.module)

    visit(tree.body)
    return {module for module in found if module in known and module != name}


def test_no_import_circle_between_modules() -> None:
    # A circle that happens to import today breaks on the next reordering, and it
    # means two modules are one job cut in the wrong place.
    known = {name for name, _ in MODULES}
    edges = {name: _load_time_imports(name, path, known) for name, path in MODULES}
    # A package's __init__ importing its own submodules is how a package offers its
    # names; the submodule importing a sibling through the package is not a circle.
    for name in edges:
        edges[name] = {m for m in edges[name] if not name.startswith(m + ".")}
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for other in sorted(edges[module]):
            if state.get(other) == 1:
                circles.append(" -> ".join([*path[path.index(other) :], other]))
            elif other not in state:
                visit(other, [*path, other])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == []
