"""Names a request gives that the catalogue does not declare, with a did-you-mean.

A role, task type or environment the catalogue does not know is not an error: the
policy composes an empty tool list and denies every call, which is the right
decision. But a typo (``salse`` for ``sales``) then looks like a policy that grants
nothing, with no word about why. :func:`undeclared_names` is the one check of a
request's three names against the catalogue; every surface words its warning from
it (``capgate serve`` for each binding, ``capgate eval`` and ``capgate explain``,
and the library through :class:`UndeclaredWatch`). None of them changes a decision.

What is declared: the roles of ``roles.yaml``, the task types of
``task_types.yaml``, and every environment some tool lists (environments have no
file of their own).

:class:`UndeclaredWatch` is for the hot path: one set lookup per name while the
names are declared; a name that is not is logged once (logger
``capgate.catalogue``, WARNING), and at most :data:`MAX_REMEMBERED` such names are
remembered, so a caller inventing names cannot grow the memory or flood the log.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from capgate.gateway.errors import quote
from capgate.gateway.model.contracts import Catalogue

__all__ = [
    "MAX_REMEMBERED",
    "NameField",
    "Undeclared",
    "UndeclaredWatch",
    "declared_names",
    "undeclared_names",
]

log = logging.getLogger("capgate.catalogue")

NameField = Literal["role", "task type", "environment"]
#: Declared values a warning lists; the rest are counted.
_SHOWN: Final = 5
#: Undeclared (field, value) pairs an :class:`UndeclaredWatch` remembers having warned
#: about; past that it stops warning (and says so once).
MAX_REMEMBERED: Final = 256
#: How alike a declared name must be to be suggested (difflib's ratio).
_CUTOFF: Final = 0.6


@dataclass(frozen=True, slots=True)
class Undeclared:
    """One name the catalogue does not declare: which field, the value, what is."""

    field: NameField
    value: str
    #: Every declared value of the field, sorted.
    declared: tuple[str, ...]
    #: The declared value the given one most likely meant, if any is close.
    suggestion: str | None

    def message(self) -> str:
        """``role 'salse' is not declared in the catalogue; did you mean 'sales'? ...``"""
        text = f"{self.field} {quote(self.value)} is not declared in the catalogue"
        if self.suggestion is not None:
            text += f"; did you mean {quote(self.suggestion)}?"
        shown = ", ".join(quote(name) for name in self.declared[:_SHOWN])
        more = len(self.declared) - _SHOWN
        if more > 0:
            shown += f" and {more} more"
        return f"{text} (declared: {shown or 'none'})"


def declared_names(catalogue: Catalogue) -> Mapping[NameField, frozenset[str]]:
    """The roles, task types and environments the catalogue declares."""
    return {
        "role": frozenset(catalogue.roles),
        "task type": frozenset(catalogue.task_types),
        "environment": frozenset(
            environment for tool in catalogue.tools.values() for environment in tool.environments
        ),
    }


def _suggestion(value: str, declared: frozenset[str]) -> str | None:
    folded = {name.casefold(): name for name in sorted(declared)}
    if value.casefold() in folded:
        return folded[value.casefold()]
    close = difflib.get_close_matches(value.casefold(), list(folded), n=1, cutoff=_CUTOFF)
    return folded[close[0]] if close else None


def undeclared_names(
    catalogue: Catalogue | Mapping[NameField, frozenset[str]],
    role: str,
    task_type: str,
    environment: str,
) -> list[Undeclared]:
    """Which of a request's role, task type and environment ``catalogue`` does not
    declare (none: an empty list), each with the declared values and a suggestion.

    ``catalogue`` may also be its :func:`declared_names`, computed once.
    """
    declared = declared_names(catalogue) if isinstance(catalogue, Catalogue) else catalogue
    given: tuple[tuple[NameField, str], ...] = (
        ("role", role),
        ("task type", task_type),
        ("environment", environment),
    )
    return [
        Undeclared(
            field, value, tuple(sorted(declared[field])), _suggestion(value, declared[field])
        )
        for field, value in given
        if value not in declared[field]
    ]


class UndeclaredWatch:
    """Log each undeclared name a request gives, once, for the gateway's hot path.

    :meth:`check` costs three set lookups while the names are declared. Thread-safe:
    the remembered names change under a lock, taken only for a name not declared.
    """

    def __init__(self, catalogue: Catalogue, *, remember: int = MAX_REMEMBERED) -> None:
        self._declared = declared_names(catalogue)
        self._roles = self._declared["role"]
        self._task_types = self._declared["task type"]
        self._environments = self._declared["environment"]
        self._remember = remember
        self._warned: set[tuple[NameField, str]] = set()
        self._full = False
        self._lock = threading.Lock()

    def check(self, role: str, task_type: str, environment: str) -> None:
        """Warn (once per name) about those of the three the catalogue lacks."""
        if (
            role in self._roles
            and task_type in self._task_types
            and environment in self._environments
        ):
            return
        if self._full:
            return
        given: tuple[tuple[NameField, str, frozenset[str]], ...] = (
            ("role", role, self._roles),
            ("task type", task_type, self._task_types),
            ("environment", environment, self._environments),
        )
        if all(value in names or (field, value) in self._warned for field, value, names in given):
            return  # warned about already: no suggestion worked out again
        new = [
            problem
            for problem in undeclared_names(self._declared, role, task_type, environment)
            if (problem.field, problem.value) not in self._warned
        ]
        with self._lock:
            for problem in new:
                key = (problem.field, problem.value)
                if key in self._warned or self._full:
                    continue
                if len(self._warned) >= self._remember:
                    self._full = True
                    log.warning(
                        "more undeclared names than the %d warned about; no more are logged",
                        self._remember,
                    )
                    continue
                self._warned.add(key)
                log.warning(
                    "a request names what the catalogue lacks (it sees no tool and may "
                    "call none): %s",
                    problem.message(),
                )
