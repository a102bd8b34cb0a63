"""How long a question to OPA may take before it fails closed.

Each read and write waits at most ``timeout`` seconds and the whole exchange at
most ``connect_timeout + 2 * timeout``; past either, the question fails closed. The
questions an agent's calls wait on (compose, execute, review) keep the short
default, so a wedged OPA fails a call in about a second. A question about every
tool of the catalogue at once (``capgate/explain/compose``, for people and audits)
costs OPA time in proportion to the catalogue, so its timeout grows with it:
:func:`whole_catalogue_timeout`, the one rule for such questions, which ``capgate
diff`` applies too. :class:`Limits` carries one kind of question's bounds to the
exchange, and says in a timeout's message what they were and how to give longer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Final

import httpx

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "PER_TOOL_TIMEOUT",
    "RAISE_HINT",
    "Limits",
    "whole_catalogue_timeout",
]

#: Seconds to wait for each of write, read and a pooled connection. An execute
#: decision over loopback takes about a millisecond, and compose a few set operations
#: over the catalogue's index: 10,000 tools in about 13 ms at p50 and under 80 ms at
#: worst on a busy 2-core machine (docs/benchmarks.md). Half a second is therefore
#: several times the largest catalogue's worst compose, yet short enough that an
#: agent's tool call fails fast, closed, instead of hanging on a wedged OPA. The
#: whole exchange must also end within connect timeout + 2 x timeout.
DEFAULT_TIMEOUT: Final = 0.5
#: Seconds to wait for a connection. A loopback connect either succeeds at once or is
#: refused at once; taking longer means the machine is in trouble.
DEFAULT_CONNECT_TIMEOUT: Final = 0.25
#: Seconds added to the timeout for each tool of the catalogue, for a question whose
#: work and answer grow with the whole catalogue (:func:`whole_catalogue_timeout`).
#: Explaining compose gives six checks, each with the facts it read, for every tool:
#: with both cores of a 2-core machine loaded, its slowest exchange took 0.9 s at
#: 1,000 tools and 5.5 s (a 6 MB answer) at 10,000, against 8 and 31 ms for compose
#: (docs/benchmarks.md). No fixed timeout fits both: half a second is short of the
#: 1,000-tool explanation there, and whatever fits 10,000 tools would let a wedged
#: OPA hold an agent's call for seconds. Two ms a tool gives the slowest of those
#: exchanges three to four times what it took, and the whole-answer deadline
#: doubles that again.
PER_TOOL_TIMEOUT: Final = 0.002

#: What a timeout message says to do about it, whoever built the client.
RAISE_HINT: Final = (
    "if OPA is only slow, give a longer timeout: --timeout of the capgate command, or "
    "timeout= of PolicySidecar or PolicyClient"
)


def whole_catalogue_timeout(timeout: float, tools: int) -> float:
    """The read and write timeout of a question about every tool of a catalogue.

    ``timeout`` plus :data:`PER_TOOL_TIMEOUT` for each of the catalogue's ``tools``:
    the one rule for every question whose work and answer grow with the catalogue
    (``capgate/explain/compose``, so ``compose(facts, reasons=True)``, ``capgate
    explain compose`` and ``capgate eval compose``; each question of ``capgate
    diff``'s matrix). The answer must still be complete within the connect timeout
    plus twice this. The questions an agent's calls wait on (compose, execute,
    review) keep ``timeout`` itself, so a wedged OPA still fails a call closed in a
    second or so; only a question asked for people and audits waits longer.
    """
    if tools < 0:
        raise ValueError("a catalogue has no fewer than 0 tools")
    return timeout + PER_TOOL_TIMEOUT * tools


@dataclass(frozen=True)
class Limits:
    """How long one kind of question may take: each read and write, and the whole
    exchange (connect, request, head and body), and what to say when it is past."""

    timeout: float
    connect_timeout: float
    #: How ``timeout`` was reached, for the message (empty for a plain timeout).
    basis: str = ""

    @property
    def whole(self) -> float:
        """The seconds the whole exchange may take: connect plus twice the timeout."""
        return self.connect_timeout + 2 * self.timeout

    @cached_property
    def timeouts(self) -> dict[str, float | None]:
        """httpx's timeout extension: connect, read, write and pool."""
        return httpx.Timeout(self.timeout, connect=self.connect_timeout).as_dict()

    def describe(self) -> str:
        return (
            f"read timeout {self.timeout:g}s{self.basis}, connect {self.connect_timeout:g}s, "
            f"whole answer {self.whole:g}s"
        )
