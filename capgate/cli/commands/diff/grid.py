"""The role x tool grids of ``capgate diff --html``, read off one :class:`Report`.

A reviewer of a policy change wants to see which role can now reach which tool. The
grid answers that per scenario group (a task type, an environment, a budget class and
a connection state: every dimension of the matrix but the role), one cell a role and
a tool, with the base's and the head's answer side by side, and once more over the
whole matrix (the overview: in how many of a role's scenarios each side shows the
tool, and allows its calls).

Nothing is decided here, nor compared again. A cell's answers are the ones the sides
hold (:func:`~capgate.cli.commands.diff.compare.state`, what the comparison read),
and its change is the kinds of the report's own flips in that cell
(:func:`change_of`), so the cells marked widened are exactly the widening flips of
``--json``. Only the tools that flip somewhere are columns, and only the groups with
a flip are drawn, each up to a bound (:data:`MOST_TOOLS`, :data:`MOST_GROUPS`; the
widening ones first), and what is left out is counted.

A module of its own so that the page (:mod:`capgate.cli.commands.diff.page`) only
renders, and what a cell says is decided in one place.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from capgate.cli.commands.diff.compare import (
    CALL_NARROW,
    NARROW,
    REASONS,
    WIDENING,
    Flip,
    state,
)
from capgate.cli.commands.diff.report import Report
from capgate.cli.commands.diff.sides import Side

__all__ = [
    "CHANGES",
    "MIXED",
    "MOST_GROUPS",
    "MOST_TOOLS",
    "NARROWED",
    "REASONS_CHANGED",
    "SAME",
    "WIDENED",
    "Cell",
    "Grid",
    "Group",
    "Look",
    "Total",
    "change_of",
]

#: A cell's change: more access at head, less, both (one call widens, another
#: narrows), only other reasons for a tool hidden at both, or none.
WIDENED, NARROWED, MIXED, REASONS_CHANGED, SAME = "widened", "narrowed", "mixed", "reasons", "same"
CHANGES: Final = (WIDENED, NARROWED, MIXED, REASONS_CHANGED, SAME)
#: Columns at most: the tools that flip, widening ones first.
MOST_TOOLS: Final = 40
#: Scenario groups drawn at most, widening ones first.
MOST_GROUPS: Final = 100

_NARROWING: Final = frozenset({NARROW, CALL_NARROW})

T = TypeVar("T")
GroupKey = tuple[str, str, str, str]  # task type, environment, budget class, connections


def change_of(kinds: Iterable[str]) -> str:
    """The change of a cell whose flips are of ``kinds``."""
    found = set(kinds)
    wider, narrower = bool(found & WIDENING), bool(found & _NARROWING)
    if wider and narrower:
        return MIXED
    if wider:
        return WIDENED
    if narrower:
        return NARROWED
    return REASONS_CHANGED if REASONS in found else SAME


@dataclass(frozen=True, slots=True)
class Look:
    """One side's answer in a cell: ``visible``, ``hidden`` or ``absent`` (the tool
    is not in that side's catalogue), the reason codes when not visible, and how many
    of the calls asked there it allowed."""

    shown: str
    reasons: tuple[str, ...]
    allowed: int
    asked: int


@dataclass(frozen=True, slots=True)
class Cell:
    """A role and a tool in one scenario group; ``base``/``head`` are None when the
    sample left the group's scenario of this role out."""

    role: str
    tool: str
    base: Look | None
    head: Look | None
    flips: tuple[Flip, ...]

    @property
    def change(self) -> str:
        return change_of(flip.kind for flip in self.flips)


@dataclass(frozen=True, slots=True)
class Total:
    """A role and a tool over all the role's scenarios evaluated: in how many each
    side shows the tool, and of the calls asked how many each allows."""

    role: str
    tool: str
    scenarios: int
    visible: tuple[int, int]  # base, head
    allowed: tuple[int, int]  # base, head
    asked: int
    flips: tuple[Flip, ...]

    @property
    def change(self) -> str:
        return change_of(flip.kind for flip in self.flips)


@dataclass(frozen=True, slots=True)
class Group:
    """A scenario group: every dimension but the role, and its cells, a row a role."""

    task_type: str
    environment: str
    budget_class: str
    connections: str
    rows: tuple[tuple[Cell, ...], ...]

    @property
    def flips(self) -> int:
        return sum(len(cell.flips) for row in self.rows for cell in row)


@dataclass(frozen=True)
class Grid:
    """What ``--html`` draws: the columns, the overview and the groups drawn, and how
    many tools and groups it leaves out."""

    report: Report
    roles: tuple[str, ...]
    tools: tuple[str, ...]
    overview: tuple[tuple[Total, ...], ...]
    groups: tuple[Group, ...]
    #: tools that flip but are not columns (past MOST_TOOLS)
    tools_left_out: tuple[str, ...]
    #: tools of either catalogue that flip nowhere
    tools_unchanged: tuple[str, ...]
    #: scenario groups evaluated, and those with a flip
    groups_evaluated: int
    groups_flipped: int

    @classmethod
    def of(cls, report: Report) -> Grid:
        flips_at: dict[tuple[GroupKey, str, str], list[Flip]] = defaultdict(list)
        flips_of: dict[tuple[str, str], list[Flip]] = defaultdict(list)
        for flip in report.flips:
            s = flip.scenario
            key = (s.task_type, s.environment, s.budget_class, s.connections)
            flips_at[(key, s.role, flip.tool)].append(flip)
            flips_of[(s.role, flip.tool)].append(flip)

        flipped = {flip.tool for flip in report.flips}
        tools = _first(sorted(flipped), report.flips, lambda f: f.tool, MOST_TOOLS)
        everything = set(report.base.catalogue.tools) | set(report.head.catalogue.tools)

        at: dict[GroupKey, dict[str, int]] = {}
        for index, s in enumerate(report.scenarios):
            key = (s.task_type, s.environment, s.budget_class, s.connections)
            at.setdefault(key, {})[s.role] = index
        flipped_groups = {key for key, _, _ in flips_at}
        with_flips = [key for key in at if key in flipped_groups]

        def group_of(flip: Flip) -> GroupKey:
            s = flip.scenario
            return (s.task_type, s.environment, s.budget_class, s.connections)

        drawn = _first(with_flips, report.flips, group_of, MOST_GROUPS)

        calls = _calls(report)
        roles = report.matrix.roles

        def look(side: Side, index: int, tool: str) -> Look:
            visible, codes = state(tool, side.catalogue, side.results[index])
            allowed, asked = calls.get((side.name, index, tool), (0, 0))
            shown = "visible" if visible else "hidden"
            if tool not in side.catalogue.tools:
                shown = "absent"
            return Look(shown, tuple(sorted(codes)), allowed, asked)

        def cell(key: GroupKey, role: str, tool: str) -> Cell:
            index = at[key].get(role)
            flips = tuple(flips_at.get((key, role, tool), ()))
            if index is None:
                return Cell(role, tool, None, None, flips)
            return Cell(
                role, tool, look(report.base, index, tool), look(report.head, index, tool), flips
            )

        groups = tuple(
            Group(*key, rows=tuple(tuple(cell(key, r, t) for t in tools) for r in roles))
            for key in drawn
        )
        overview = tuple(
            tuple(_total(report, calls, role, tool, flips_of[(role, tool)]) for tool in tools)
            for role in roles
        )
        return cls(
            report=report,
            roles=roles,
            tools=tuple(tools),
            overview=overview,
            groups=groups,
            tools_left_out=tuple(sorted(flipped - set(tools))),
            tools_unchanged=tuple(sorted(everything - flipped)),
            groups_evaluated=len(at),
            groups_flipped=len(with_flips),
        )


def _first(
    values: Sequence[T], flips: Sequence[Flip], of: Callable[[Flip], T], most: int
) -> list[T]:
    """``values`` in their order, at most ``most`` of them: those with a widening flip
    first, then those with a narrowing one, then the rest."""
    rank: dict[T, int] = {}
    for flip in flips:
        order = 0 if flip.kind in WIDENING else 1 if flip.kind in _NARROWING else 2
        key = of(flip)
        rank[key] = min(rank.get(key, 2), order)
    kept = sorted(values, key=lambda value: rank.get(value, 2))[:most]
    chosen = set(kept)
    return [value for value in values if value in chosen]


def _calls(report: Report) -> dict[tuple[str, int, str], tuple[int, int]]:
    """Per side, scenario and tool: of the calls asked, how many allowed, and how many."""
    counted: dict[tuple[str, int, str], tuple[int, int]] = {}
    for side in (report.base, report.head):
        for ask, (allowed, _) in zip(report.asks, side.calls, strict=True):
            key = (side.name, ask.scenario, ask.tool)
            yes, asked = counted.get(key, (0, 0))
            counted[key] = (yes + allowed, asked + 1)
    return counted


def _total(
    report: Report,
    calls: dict[tuple[str, int, str], tuple[int, int]],
    role: str,
    tool: str,
    flips: list[Flip],
) -> Total:
    scenarios = visible_base = visible_head = allowed_base = allowed_head = asked = 0
    for index, scenario in enumerate(report.scenarios):
        if scenario.role != role:
            continue
        scenarios += 1
        visible_base += state(tool, report.base.catalogue, report.base.results[index])[0]
        visible_head += state(tool, report.head.catalogue, report.head.results[index])[0]
        yes, n = calls.get((report.base.name, index, tool), (0, 0))
        allowed_base, asked = allowed_base + yes, asked + n
        allowed_head += calls.get((report.head.name, index, tool), (0, 0))[0]
    return Total(
        role,
        tool,
        scenarios,
        (visible_base, visible_head),
        (allowed_base, allowed_head),
        asked,
        tuple(flips),
    )
