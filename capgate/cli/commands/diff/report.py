"""The report of ``capgate diff``: the flips as text, as Markdown or as JSON.

Flips are grouped by tool and role with counts, as text (the default), as Markdown
for a pull-request comment (``--markdown``) or as JSON (``--json``, every flip). The
three are views of one :class:`Report`, so they say the same: the text and the
Markdown list at most ``--show`` flips a tool and role, and their counts are complete.
``--html`` draws the same report as grids (:mod:`.grid`, :mod:`.page`), from
these flips and the answers the sides hold.

A module of its own so that the formats change without touching what is compared.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capgate.cli.commands.common import safe
from capgate.cli.commands.diff.calls import Ask
from capgate.cli.commands.diff.compare import (
    CALL_NARROW,
    CALL_WIDEN,
    KINDS,
    NARROW,
    REASONS,
    WIDEN,
    WIDENING,
    Flip,
)
from capgate.cli.commands.diff.fixtures import FixtureRow
from capgate.cli.commands.diff.matrix import Matrix, Scenario
from capgate.cli.commands.diff.sides import Side

__all__ = ["Report", "change_text"]


def _groups(flips: Sequence[Flip]) -> dict[tuple[str, str], list[Flip]]:
    grouped: dict[tuple[str, str], list[Flip]] = defaultdict(list)
    for flip in flips:
        grouped[(flip.tool, flip.scenario.role)].append(flip)
    return dict(sorted(grouped.items()))


def _counts(flips: Sequence[Flip]) -> str:
    counted = Counter(flip.kind for flip in flips)
    return ", ".join(f"{kind} {counted[kind]}" for kind in KINDS if counted[kind])


def change_text(flip: Flip) -> str:
    """A flip's before and after, as ``base reasons => head reasons``."""

    def shown(codes: tuple[str, ...]) -> str:
        if codes:
            return ", ".join(codes)
        return "visible" if flip.call is None else "allowed"

    return f"{shown(flip.before)} => {shown(flip.after)}"


@dataclass
class Report:
    base: Side
    head: Side
    matrix: Matrix
    scenarios: list[Scenario]
    flips: list[Flip]
    show: int
    #: calls asked of each side, and how many there were before sampling
    calls: tuple[int, int] = (0, 0)
    #: the calls asked, in the order of each side's ``calls`` answers
    asks: Sequence[Ask] = ()
    #: the catalogues' own representative calls, as both sides decide them
    fixtures: Sequence[FixtureRow] = ()

    @property
    def fixtures_failing(self) -> list[FixtureRow]:
        """The fixtures the head does not decide as they expect."""
        return [row for row in self.fixtures if not row.holds]

    def describe_fixtures(self) -> str:
        if not self.fixtures:
            return "none (the catalogue has no fixtures.yaml)"
        changed = sum(1 for row in self.fixtures if row.changed)
        failing = len(self.fixtures_failing)
        return (
            f"{len(self.fixtures)}: {len(self.fixtures) - failing} decided at head as they "
            f"expect, {failing} not; {changed} decided otherwise than at base"
        )

    @property
    def widened(self) -> int:
        return sum(1 for flip in self.flips if flip.kind in WIDENING)

    def describe_calls(self) -> str:
        asked, total = self.calls
        what = "the call variants of every tool visible at both sides, all connections active"
        if asked < total:
            return f"{what}: {total} calls; sampled {asked} of them with seed {self.matrix.seed}"
        return f"{what}: {asked} calls, all evaluated"

    def summary(self) -> str:
        if not self.flips:
            return "no decision flips"
        tools = len({flip.tool for flip in self.flips})
        return f"{len(self.flips)} decisions flip in {tools} tool(s): {_counts(self.flips)}"

    def text(self) -> str:
        lines = [
            f"capgate diff: base {self.base.label} -> head {self.head.label}",
            f"matrix: {self.matrix.describe()}",
            f"reasons: base from {self.base.reasons_from}, head from {self.head.reasons_from}",
            f"calls: {self.describe_calls()}",
            f"fixtures: {self.describe_fixtures()}",
            self.summary(),
        ]
        for row in self.fixtures:
            if row.changed or not row.holds:
                expect, before, after = row.texts()
                mark = "FIXTURE FAILS" if not row.holds else "fixture changed"
                lines.append(
                    f"  {mark}: {safe(row.fixture.name)} ({safe(row.fixture.tool)}): "
                    f"{safe(before)} => {safe(after)}; expects {safe(expect)}"
                )
        if self.widened:
            lines.append(
                f"WIDENED: {self.widened} decision(s) hidden or denied at base are visible "
                "or allowed at head"
            )
        by_tool = Counter(flip.tool for flip in self.flips)
        current = None
        for (tool, role), flips in _groups(self.flips).items():
            if tool != current:
                current = tool
                lines += ["", f"{safe(tool)}: {by_tool[tool]} flip(s)"]
            lines.append(f"  role {safe(role)}: {len(flips)} ({_counts(flips)})")
            for flip in flips[: self.show]:
                lines.append(f"    {flip.kind:<22}  {flip.label()}: {change_text(flip)}")
            if len(flips) > self.show:
                lines.append(f"    ... and {len(flips) - self.show} more (--show N)")
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [
            "### capgate diff",
            "",
            f"Base `{self.base.label}`, head `{self.head.label}`.",
            "",
            f"Matrix: {self.matrix.describe()}.",
            f"Reasons: base from `{self.base.reasons_from}`, head from `{self.head.reasons_from}`.",
            f"Calls: {self.describe_calls()}.",
            f"Fixtures: {self.describe_fixtures()}.",
            "",
            f"**{self.summary()}**",
        ]
        if self.fixtures:
            lines += ["", "| fixture | tool | expects | base | head | holds |",
                      "|---|---|---|---|---|---|"]  # fmt: skip
            for row in self.fixtures:
                expect, before, after = row.texts()
                lines.append(
                    f"| {_md(row.fixture.name)} | `{_md(row.fixture.tool)}` | {_md(expect)} "
                    f"| {_md(before)} | {_md(after)} | {'yes' if row.holds else '**no**'} |"
                )
        if self.widened:
            lines += [
                "",
                f"> **Widens:** {self.widened} decision(s) hidden or denied at base are visible "
                "or allowed at head.",
            ]
        if not self.flips:
            return "\n".join(lines)
        lines += [
            "",
            "| tool | role | hidden → visible | visible → hidden | reasons changed "
            "| call denied → allowed | call allowed → denied |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        groups = _groups(self.flips)
        for (tool, role), flips in groups.items():
            counted = Counter(flip.kind for flip in flips)
            lines.append(
                f"| `{_md(tool)}` | `{_md(role)}` | {counted[WIDEN]} | {counted[NARROW]} "
                f"| {counted[REASONS]} | {counted[CALL_WIDEN]} | {counted[CALL_NARROW]} |"
            )
        lines += ["", "<details><summary>Flipped decisions</summary>", ""]
        for (tool, role), flips in groups.items():
            lines.append(f"- `{_md(tool)}`, role `{_md(role)}`:")
            for flip in flips[: self.show]:
                lines.append(f"  - {flip.kind}: {_md(flip.label())}: {_md(change_text(flip))}")
            if len(flips) > self.show:
                lines.append(f"  - ... and {len(flips) - self.show} more")
        lines += ["", "</details>"]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "base": {"revision": self.base.label, "reasons_from": self.base.reasons_from},
            "head": {"revision": self.head.label, "reasons_from": self.head.reasons_from},
            "matrix": {
                "size": self.matrix.size,
                "evaluated": len(self.scenarios),
                "sampled": self.matrix.sampled,
                "seed": self.matrix.seed if self.matrix.sampled else None,
                "roles": list(self.matrix.roles),
                "task_types": list(self.matrix.task_types),
                "environments": list(self.matrix.environments),
                "budget_classes": list(self.matrix.budget_classes),
                "connection_states": list(self.matrix.connection_states),
            },
            "calls": {"evaluated": self.calls[0], "total": self.calls[1]},
            "counts": {kind: sum(1 for f in self.flips if f.kind == kind) for kind in KINDS},
            "widened": self.widened > 0,
            "flips": [flip.as_dict() for flip in self.flips],
            "fixtures": [row.as_dict() for row in self.fixtures],
        }


def _md(text: str) -> str:
    return safe(text).replace("|", "\\|").replace("`", "'").replace("<", "&lt;")
