"""The catalogue's own representative calls (``fixtures.yaml``), asked of both sides.

The matrix and the call variants are what the diff makes up; the fixtures are what
the catalogue's authors say matters, each with the decision it must get
(:mod:`capgate.gateway.service.fixtures`). Every fixture of either side is put to
both: its execute input built under that side's contracts (so a contract change is
tried as it means the call), asked of that side's bundle. A fixture the head
dropped is still shown, against the base's expectation. Each row says what each
side decided and whether the head's decision is the one the fixture expects.

A module of its own because the fixtures come from the catalogues, not from the
matrix, and are reported whatever flips.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from capgate.cli.commands.diff.evaluate import evaluate_inputs
from capgate.cli.commands.diff.sides import Side
from capgate.gateway.errors import CapgateError
from capgate.gateway.model.fixtures import Fixture, FixtureOutcome
from capgate.gateway.service.fixtures import FixtureCalls

__all__ = ["FixtureRow", "evaluate_fixtures"]


@dataclass(frozen=True)
class FixtureRow:
    """One fixture, as both sides decide it."""

    fixture: Fixture
    #: The side whose fixtures.yaml names it (head, unless the head dropped it).
    named_by: str
    #: Each side's decision, or why it is not a call there (a tool it lacks,
    #: parameters its contract does not take).
    base: FixtureOutcome | str
    head: FixtureOutcome | str

    @property
    def holds(self) -> bool:
        """Whether the head decides it as the fixture expects."""
        return isinstance(self.head, FixtureOutcome) and self.fixture.holds(self.head)

    @property
    def changed(self) -> bool:
        return _text(self.base) != _text(self.head)

    def texts(self) -> tuple[str, str, str]:
        return self.fixture.expected.text(), _text(self.base), _text(self.head)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.fixture.name,
            "tool": self.fixture.tool,
            "named_by": self.named_by,
            "expect": {
                "allow": self.fixture.expect == "allow",
                "reasons": sorted(self.fixture.reasons),
            },
            "base": _as_dict(self.base),
            "head": _as_dict(self.head),
            "holds": self.holds,
        }


def _text(outcome: FixtureOutcome | str) -> str:
    return outcome.text() if isinstance(outcome, FixtureOutcome) else f"not a call: {outcome}"


def _as_dict(outcome: FixtureOutcome | str) -> dict[str, Any]:
    if isinstance(outcome, FixtureOutcome):
        return {"allow": outcome.allow, "codes": list(outcome.codes)}
    return {"allow": None, "error": outcome}


def evaluate_fixtures(base: Side, head: Side, opa: Path, now: datetime) -> list[FixtureRow]:
    """Every fixture of either side, head's first, asked of both sides."""
    named = [(f, "head") for f in head.catalogue.fixtures]
    kept = {f.name for f, _ in named}
    named += [(f, "base") for f in base.catalogue.fixtures if f.name not in kept]
    answers = {side.name: _decide(side, opa, [f for f, _ in named], now) for side in (base, head)}
    return [
        FixtureRow(fixture, by, answers["base"][i], answers["head"][i])
        for i, (fixture, by) in enumerate(named)
    ]


def _decide(
    side: Side, opa: Path, fixtures: list[Fixture], now: datetime
) -> list[FixtureOutcome | str]:
    """Each fixture's decision at ``side``, or why it is no call there."""
    calls = FixtureCalls(side.catalogue)
    inputs: list[dict[str, Any]] = []
    where: list[int | str] = []
    for fixture in fixtures:
        if fixture.tool not in side.catalogue.tools:
            where.append(f"no tool {fixture.tool} at {side.name}")
            continue
        try:
            facts = calls.input(fixture, now)
        except CapgateError as bad:
            where.append(str(bad))
            continue
        where.append(len(inputs))
        inputs.append(facts.to_opa())
    decided = evaluate_inputs(side, opa, inputs) if inputs else []
    return [
        FixtureOutcome(allow=decided[w][0], codes=tuple(sorted(decided[w][1])))
        if isinstance(w, int)
        else w
        for w in where
    ]
