"""Load a YAML catalogue folder, whole or not at all.

A catalogue is a directory of four files (``tools.yaml``, ``roles.yaml``,
``task_types.yaml``, ``budget_classes.yaml``; see ``docs/catalogue.md``), and a fifth
when a contract converts amounts (``currencies.yaml``).
:func:`load_catalogue` checks all of them and reports every problem in one
:class:`~capgate.gateway.errors.CatalogueError`, each naming the file, the entry and the
field, so one run shows everything to fix. It returns a whole catalogue or nothing.

Compiling it for OPA is :mod:`capgate.gateway.catalogue.compile`'s job.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from capgate.gateway.errors import CatalogueError, cut, quote
from capgate.gateway.model.contracts import (
    BudgetClassSpec,
    Catalogue,
    CatalogueProblems,
    CurrencyTable,
    RoleSpec,
    TaskTypeSpec,
    ToolContract,
)
from capgate.gateway.model.facts import Identifier
from capgate.gateway.model.fixtures import Fixture

__all__ = ["CATALOGUE_FILES", "OPTIONAL_FILES", "load_catalogue"]

#: The files a catalogue directory must hold, each with its single top-level key.
CATALOGUE_FILES: Mapping[str, str] = {
    "tools.yaml": "tools",
    "roles.yaml": "roles",
    "task_types.yaml": "task_types",
    "budget_classes.yaml": "budget_classes",
}

#: The files a catalogue directory may hold, each with its single top-level key:
#: the currency table only the catalogues with ``derive: converted`` values need,
#: and the earlier versions of reviewed tools kept for the proposals made under them.
OPTIONAL_FILES: Mapping[str, str] = {
    "currencies.yaml": "currencies",
    "retained.yaml": "retained",
    "fixtures.yaml": "fixtures",
}

_IDENTIFIER: TypeAdapter[str] = TypeAdapter(Identifier)
_Spec = TypeVar("_Spec", bound=BaseModel)


# --------------------------------------------------------------------------- YAML


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, except that a key repeated in one mapping is an error.

    Plain YAML keeps the last of two equal keys without a word, so a tool written
    with ``mode: read`` and, further down, ``mode: write`` would silently become a
    write tool. Merge keys (``<<: *defaults``) may still be overridden on purpose.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        first_line: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                continue  # the base class reports unhashable keys
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {quote(key)} (first given on line {first_line[key]})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(text: str) -> Any:
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        detail = exc.problem or str(exc)
        if exc.context:
            detail = f"{detail} ({exc.context})"
        return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {detail}"
    return f"invalid YAML: {exc}"


def _kind(value: object) -> str:
    """Name a YAML value's type the way a catalogue author would."""
    if value is None:
        return "nothing (null)"
    for python_type, name in (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "a list"),
        (dict, "a mapping"),
    ):
        if isinstance(value, python_type):
            return name
    return type(value).__name__


def _read_section(directory: Path, filename: str, problems: list[str]) -> object | None:
    """The value under the file's one top-level key, or ``None`` after a problem (or
    when an optional file is absent)."""
    key = CATALOGUE_FILES.get(filename) or OPTIONAL_FILES[filename]
    path = directory / filename
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if filename not in OPTIONAL_FILES:
            problems.append(f"{filename}: file not found in {directory}")
        return None
    except UnicodeDecodeError as exc:
        problems.append(f"{filename}: not UTF-8 text ({exc.reason} at byte {exc.start})")
        return None
    except OSError as exc:
        problems.append(f"{filename}: cannot read the file: {exc.strerror or exc}")
        return None
    try:
        document = _parse_yaml(text)
    except yaml.YAMLError as exc:
        problems.append(f"{filename}: {_yaml_problem(exc)}")
        return None
    except RecursionError:
        # PyYAML builds nested values recursively; no catalogue nests this deep.
        problems.append(f"{filename}: invalid YAML: nested too deeply to read")
        return None
    expected = f"expected a mapping with the single key '{key}'"
    if document is None:
        problems.append(f"{filename}: the file is empty; {expected}")
        return None
    if not isinstance(document, dict):
        problems.append(f"{filename}: top level: {expected}, got {_kind(document)}")
        return None
    unknown = [k for k in document if k != key]
    problems.extend(
        f"{filename}: top level: unknown key {quote(k)}; only '{key}' is allowed" for k in unknown
    )
    if key not in document:
        problems.append(f"{filename}: top level: missing key '{key}'")
        return None
    section: object = document[key]
    return section


# ------------------------------------------------------------------ error wording


def _field_path(loc: tuple[int | str, ...]) -> str:
    """``roles[1]``, ``input_schema``; cut short, as a misspelt field name may be long."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return cut(path, 120)


def _error_message(error: ErrorDetails, model: type[BaseModel]) -> str:
    if error["type"] == "extra_forbidden":
        return f"unknown field; the allowed fields are {', '.join(model.model_fields)}"
    if error["type"] == "value_error" and "error" in error.get("ctx", {}):
        return str(error["ctx"]["error"])  # drop pydantic's "Value error, " prefix
    return error["msg"]


def _validate(model: type[_Spec], raw: object, where: str, problems: list[str]) -> _Spec | None:
    """Validate one entry; on failure add one problem per bad field and return ``None``."""
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping of fields, got {_kind(raw)}")
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            field = _field_path(error["loc"])
            message = _error_message(error, model)
            problems.append(
                f"{where}: field '{field}': {message}" if field else f"{where}: {message}"
            )
        return None


def _is_identifier(value: object) -> bool:
    """Whether ``value`` is a well-formed name (a malformed one is reported as such)."""
    try:
        _IDENTIFIER.validate_python(value)
    except ValidationError:
        return False
    return True


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _known(names: set[str]) -> str:
    return ", ".join(sorted(names)) if names else "none"


# ----------------------------------------------------------------------- sections


def _load_tools(
    section: object, role_names: set[str] | None, problems: list[str]
) -> tuple[dict[str, ToolContract], set[str] | None]:
    """Validate ``tools.yaml``; return the valid tools and every name given.

    ``role_names`` is ``None`` when ``roles.yaml`` could not be read; role
    references are then not checked rather than all reported as unknown.
    """
    file = "tools.yaml"
    if section is None:
        return {}, None
    if not isinstance(section, list):
        problems.append(f"{file}: 'tools': expected a list of tool contracts, got {_kind(section)}")
        return {}, None

    indexes: dict[str, list[int]] = {}
    for index, raw in enumerate(section):
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str) and name:
            indexes.setdefault(name, []).append(index)
    for name, found_at in indexes.items():
        if len(found_at) > 1:
            where = _join([f"tools[{i}]" for i in found_at])
            problems.append(
                f"{file}: tool {quote(name)}: the name is defined more than once, at {where}"
            )

    tools: dict[str, ToolContract] = {}
    for index, raw in enumerate(section):
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str) and name:
            where = f"{file}: tool {quote(name)}"
            if len(indexes[name]) > 1:
                where += f" (tools[{index}])"
        else:
            where = f"{file}: tools[{index}]"
        tool = _validate(ToolContract, raw, where, problems)
        if tool is not None and len(indexes[tool.name]) == 1:
            tools[tool.name] = tool
        roles = raw.get("roles") if isinstance(raw, dict) else None
        if role_names is not None and isinstance(roles, list):
            for position, role in enumerate(roles):
                if _is_identifier(role) and role not in role_names:
                    problems.append(
                        f"{where}: field 'roles[{position}]': unknown role {quote(role)} "
                        f"(roles.yaml defines: {_known(role_names)})"
                    )
    return tools, set(indexes)


def _load_retained(section: object, problems: list[str]) -> dict[str, dict[int, ToolContract]]:
    """Validate ``retained.yaml``: a list of contracts as in tools.yaml, each an
    earlier version of one of its tools (the catalogue checks which)."""
    file = "retained.yaml"
    if section is None:
        return {}
    if not isinstance(section, list):
        problems.append(
            f"{file}: 'retained': expected a list of tool contracts, got {_kind(section)}"
        )
        return {}
    retained: dict[str, dict[int, ToolContract]] = {}
    for index, raw in enumerate(section):
        name = raw.get("name") if isinstance(raw, dict) else None
        version = raw.get("version") if isinstance(raw, dict) else None
        where = f"{file}: retained[{index}]"
        if isinstance(name, str) and name:
            where += f" (tool {quote(name)}, version {quote(version)})"
        kept = _validate(ToolContract, raw, where, problems)
        if kept is None:
            continue
        versions = retained.setdefault(kept.name, {})
        if kept.version in versions:
            problems.append(f"{where}: version {kept.version} of {quote(kept.name)} is kept "
                            "twice")  # fmt: skip
        versions[kept.version] = kept
    return retained


def _load_fixtures(section: object, problems: list[str]) -> list[Fixture]:
    """Validate ``fixtures.yaml``: a list of sample calls with their decisions."""
    if section is None:
        return []
    if not isinstance(section, list):
        problems.append(
            f"fixtures.yaml: 'fixtures': expected a list of fixtures, got {_kind(section)}"
        )
        return []
    fixtures = []
    for index, raw in enumerate(section):
        name = raw.get("name") if isinstance(raw, dict) else None
        where = f"fixtures.yaml: fixtures[{index}]"
        if isinstance(name, str) and name:
            where = f"fixtures.yaml: fixture {quote(name, 80)} (fixtures[{index}])"
        fixture = _validate(Fixture, raw, where, problems)
        if fixture is not None:
            fixtures.append(fixture)
    names = [f.name for f in fixtures]
    problems += [
        f"fixtures.yaml: fixture {quote(name, 80)}: the name is given to more than one fixture"
        for name in sorted({n for n in names if names.count(n) > 1})
    ]
    return fixtures


def _file_of(problem: str) -> str:
    """The file a cross-check's problem is about."""
    if problem.startswith("retained "):
        return "retained.yaml"
    return "fixtures.yaml" if problem.startswith("fixture ") else "tools.yaml"


def _load_named(
    file: str,
    label: str,
    section: object,
    model: type[_Spec],
    problems: list[str],
) -> tuple[dict[str, _Spec], dict[str, object], set[str] | None]:
    """Validate a ``name: {fields}`` file; return valid specs, raw entries, all names."""
    key = CATALOGUE_FILES[file]
    if section is None:
        return {}, {}, None
    if not isinstance(section, dict):
        problems.append(
            f"{file}: '{key}': expected a mapping of {label} name to its fields, "
            f"got {_kind(section)}"
        )
        return {}, {}, None
    specs: dict[str, _Spec] = {}
    raw_entries: dict[str, object] = {}
    for name, raw in section.items():
        where = f"{file}: {label} {quote(name)}"
        if not isinstance(name, str):
            problems.append(f"{where}: the name must be a string, got {_kind(name)}")
            continue
        raw_entries[name] = raw
        try:
            _IDENTIFIER.validate_python(name)
        except ValidationError as exc:
            problems.append(f"{where}: the name is malformed: {exc.errors()[0]['msg']}")
        spec = _validate(model, raw, where, problems)
        if spec is not None:
            specs[name] = spec
    return specs, raw_entries, set(raw_entries)


def _check_task_tools(
    raw_entries: Mapping[str, object], tool_names: set[str] | None, problems: list[str]
) -> None:
    if tool_names is None:
        return  # tools.yaml is unreadable: every reference would look unknown
    for name, raw in raw_entries.items():
        tools = raw.get("tools") if isinstance(raw, dict) else None
        if not isinstance(tools, list):
            continue
        for position, tool in enumerate(tools):
            if _is_identifier(tool) and tool not in tool_names:
                problems.append(
                    f"task_types.yaml: task type {quote(name)}: field 'tools[{position}]': "
                    f"unknown tool {quote(tool)} (not defined in tools.yaml)"
                )


def load_catalogue(directory: Path) -> Catalogue:
    """Load and cross-check the catalogue in ``directory``.

    Raises :class:`~capgate.gateway.errors.CatalogueError` listing every problem found in
    all four files; nothing is returned unless the whole catalogue is valid.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CatalogueError([f"{directory}: catalogue directory not found"])
    problems: list[str] = []
    sections = {
        file: _read_section(directory, file, problems)
        for file in (*CATALOGUE_FILES, *OPTIONAL_FILES)
    }

    roles, _, role_names = _load_named(
        "roles.yaml", "role", sections["roles.yaml"], RoleSpec, problems
    )
    tools, tool_names = _load_tools(sections["tools.yaml"], role_names, problems)
    task_types, raw_task_types, _ = _load_named(
        "task_types.yaml", "task type", sections["task_types.yaml"], TaskTypeSpec, problems
    )
    _check_task_tools(raw_task_types, tool_names, problems)
    budget_classes, _, _ = _load_named(
        "budget_classes.yaml",
        "budget class",
        sections["budget_classes.yaml"],
        BudgetClassSpec,
        problems,
    )
    currencies = None
    if sections["currencies.yaml"] is not None:
        currencies = _validate(
            CurrencyTable, sections["currencies.yaml"], "currencies.yaml: currencies", problems
        )
    retained = _load_retained(sections["retained.yaml"], problems)
    fixtures = _load_fixtures(sections["fixtures.yaml"], problems)
    if problems:
        raise CatalogueError(problems)
    try:
        catalogue = Catalogue(
            tools=tools,
            roles=roles,
            task_types=task_types,
            budget_classes=budget_classes,
            currencies=currencies,
            retained=retained,
            fixtures=fixtures,
        )
    except ValidationError as exc:
        # The cross-file checks (reviewers, evidence, execution actions) live on the
        # Catalogue model, so that catalogues built in code get them too.
        problems = []
        for error in exc.errors():
            cause = error.get("ctx", {}).get("error")
            found = cause.problems if isinstance(cause, CatalogueProblems) else [error["msg"]]
            problems += [f"{_file_of(problem)}: {problem}" for problem in found]
        raise CatalogueError(problems) from None
    return catalogue
