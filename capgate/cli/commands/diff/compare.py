"""The flips: each decision the two sides of ``capgate diff`` answer differently.

A tool in a scenario flips when it goes hidden -> visible, visible -> hidden, or
stays hidden with another set of reason codes; a call flips when it goes denied ->
allowed or allowed -> denied. A tool only one revision has counts as hidden there,
with the reason ``(not in catalogue)``.

A module of its own so that what counts as a flip is decided in one place, from the
answers the sides hold, and the report only renders the :class:`Flip` values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from capgate.cli.commands.diff.calls import Ask
from capgate.cli.commands.diff.matrix import Scenario
from capgate.cli.commands.diff.sides import Side
from capgate.gateway.model.contracts import Catalogue

__all__ = [
    "ABSENT",
    "CALL_NARROW",
    "CALL_WIDEN",
    "KINDS",
    "NARROW",
    "REASONS",
    "WIDEN",
    "WIDENING",
    "Flip",
    "compare",
    "compare_calls",
    "state",
]

#: The reason a tool has on the side whose catalogue lacks it.
ABSENT: Final = "(not in catalogue)"

WIDEN, NARROW, REASONS = "hidden -> visible", "visible -> hidden", "reasons changed"
CALL_WIDEN, CALL_NARROW = "call denied -> allowed", "call allowed -> denied"
KINDS: Final = (WIDEN, NARROW, REASONS, CALL_WIDEN, CALL_NARROW)
#: The kinds that widen what an agent may see or do.
WIDENING: Final = frozenset({WIDEN, CALL_WIDEN})


@dataclass(frozen=True, slots=True)
class Flip:
    """One decision that differs: a tool in a scenario, before and after."""

    tool: str
    scenario: Scenario
    kind: str
    before: tuple[str, ...]  # reason codes at base (empty when visible or allowed)
    after: tuple[str, ...]  # reason codes at head
    call: str | None = None  # the call variant, for a call's flip

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            **self.scenario.as_dict(),
            "kind": self.kind,
            "call": self.call,
            "base_reasons": list(self.before),
            "head_reasons": list(self.after),
        }

    def label(self) -> str:
        where = self.scenario.label()
        return where if self.call is None else f"{where}, call {self.call}"


def state(
    tool: str, catalogue: Catalogue, result: tuple[frozenset[str], dict[str, frozenset[str]]]
) -> tuple[bool, frozenset[str]]:
    """Whether ``tool`` is visible in one side's answer to a scenario (``result``), and
    its reason codes if hidden: what a flip is made of, and all the HTML grid shows."""
    visible, hidden = result
    if tool not in catalogue.tools:
        return False, frozenset({ABSENT})
    if tool in visible:
        return True, frozenset()
    return False, hidden.get(tool, frozenset())


def compare(base: Side, head: Side, scenarios: Sequence[Scenario]) -> list[Flip]:
    """Every decision that differs between the two sides, in matrix then tool order."""
    tools = sorted(set(base.catalogue.tools) | set(head.catalogue.tools))
    flips = []
    for scenario, before, after in zip(scenarios, base.results, head.results, strict=True):
        for tool in tools:
            was_visible, was = state(tool, base.catalogue, before)
            is_visible, now = state(tool, head.catalogue, after)
            if was_visible == is_visible and (was == now or not head.reasons):
                continue
            kind = REASONS if was_visible == is_visible else WIDEN if is_visible else NARROW
            flips.append(Flip(tool, scenario, kind, tuple(sorted(was)), tuple(sorted(now))))
    return flips


def compare_calls(
    base: Side, head: Side, scenarios: Sequence[Scenario], asks: Sequence[Ask]
) -> list[Flip]:
    """Every call allowed at one side and denied at the other."""
    flips = []
    for ask, (was, before), (now, after) in zip(asks, base.calls, head.calls, strict=True):
        if was != now:
            kind = CALL_WIDEN if now else CALL_NARROW
            flip = Flip(
                ask.tool,
                scenarios[ask.scenario],
                kind,
                tuple(sorted(before)),
                tuple(sorted(after)),
                ask.variant,
            )
            flips.append(flip)
    return flips
