"""The compose questions ``capgate diff`` asks both sides: the decision matrix.

Every role x task type x environment x budget class, each with the connections of
every alias active, and then with each alias in turn revoked and in turn missing.
The values are the union of both revisions' catalogues (roles, task types and
budget classes they declare; environments and aliases their tools name), so a role
only one side knows is asked of both. When the product exceeds ``--limit``
scenarios, ``--limit`` of them are drawn with ``random.Random(--seed)`` and the
output says so (same seed, same sample).

A module of its own because every later step names a question by its
:class:`Scenario`: the calls, the evaluation, the comparison and the report.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.facts import ComposeInput

__all__ = ["Matrix", "Scenario"]


@dataclass(frozen=True, slots=True)
class Scenario:
    """One compose question: a role, a task type, an environment, a budget class and
    the state of the tenant's connections (``all active``, ``ALIAS revoked``, ``ALIAS
    missing``)."""

    role: str
    task_type: str
    environment: str
    budget_class: str
    connections: str

    def label(self) -> str:
        return (
            f"task {self.task_type}, env {self.environment}, budget {self.budget_class}, "
            f"connections {self.connections}"
        )

    def as_dict(self) -> dict[str, str]:
        return {
            "role": self.role,
            "task_type": self.task_type,
            "environment": self.environment,
            "budget_class": self.budget_class,
            "connections": self.connections,
        }


@dataclass(frozen=True)
class Matrix:
    """The dimensions of the decision matrix and the scenarios chosen from it."""

    roles: tuple[str, ...]
    task_types: tuple[str, ...]
    environments: tuple[str, ...]
    budget_classes: tuple[str, ...]
    aliases: tuple[str, ...]
    limit: int
    seed: int

    @classmethod
    def of(cls, catalogues: Sequence[Catalogue], limit: int, seed: int) -> Matrix:
        def union(values: Iterator[str]) -> tuple[str, ...]:
            return tuple(sorted(set(values)))

        tools = [tool for catalogue in catalogues for tool in catalogue.tools.values()]
        return cls(
            roles=union(name for c in catalogues for name in c.roles),
            task_types=union(name for c in catalogues for name in c.task_types),
            environments=union(env for tool in tools for env in tool.environments),
            budget_classes=union(name for c in catalogues for name in c.budget_classes),
            aliases=union(tool.connection_alias for tool in tools if tool.connection_alias),
            limit=limit,
            seed=seed,
        )

    @property
    def connection_states(self) -> tuple[str, ...]:
        states = ["all active"]
        for alias in self.aliases:
            states += [f"{alias} revoked", f"{alias} missing"]
        return tuple(states)

    @property
    def dimensions(self) -> tuple[tuple[str, ...], ...]:
        return (
            self.roles,
            self.task_types,
            self.environments,
            self.budget_classes,
            self.connection_states,
        )

    @property
    def size(self) -> int:
        total = 1
        for values in self.dimensions:
            total *= len(values)
        return total

    @property
    def sampled(self) -> bool:
        return self.size > self.limit

    def describe(self) -> str:
        shape = (
            f"{len(self.roles)} roles x {len(self.task_types)} task types x "
            f"{len(self.environments)} environments x {len(self.budget_classes)} budget "
            f"classes x {len(self.connection_states)} connection states = {self.size} scenarios"
        )
        if self.sampled:
            return f"{shape}; sampled {self.limit} of them with seed {self.seed} (--limit, --seed)"
        return f"{shape}, all evaluated"

    def scenarios(self) -> list[Scenario]:
        """Every scenario, or ``limit`` of them drawn with ``seed``, in matrix order."""
        dims = self.dimensions
        if not self.sampled:
            return [Scenario(*values) for values in itertools.product(*dims)]
        draw = random.Random(self.seed)  # noqa: S311 (a reproducible sample, not a secret)
        picked = sorted(draw.sample(range(self.size), self.limit))
        found = []
        for index in picked:
            values = []
            for values_of in reversed(dims):
                index, at = divmod(index, len(values_of))
                values.append(values_of[at])
            found.append(Scenario(*reversed(values)))
        return found

    def compose_input(self, scenario: Scenario) -> dict[str, Any]:
        """The compose input of a scenario, validated as the gateway would send it."""
        connections = dict.fromkeys(self.aliases, "active")
        alias, _, state = scenario.connections.rpartition(" ")
        if state == "revoked":
            connections[alias] = "revoked"
        elif state == "missing":
            del connections[alias]
        facts = ComposeInput.model_validate(
            {
                "principal": {"agent": "capgate-diff", "role": scenario.role, "tenant": "diff"},
                "task": {"type": scenario.task_type, "id": "capgate-diff"},
                "connections": connections,
                "environment": scenario.environment,
                "budget_class": scenario.budget_class,
            }
        )
        return facts.model_dump(mode="json")
