"""Asking one side's bundle: ``opa eval`` of batches of questions, each within a bound.

One ``opa eval`` per batch of scenarios or calls evaluates them against the side's
bundle (``data.capgate.compose.decision``, ``data.capgate.execute.decision``), so
nothing of a decision is computed here. Each ``opa eval`` is stopped, and the diff
fails, past :func:`eval_seconds`: what the policy client allows its questions (the
``--timeout``, and for a compose scenario an allowance a tool), summed over the
batch. The answers go to the :class:`~capgate.cli.commands.diff.sides.Side`, and a
progress line a batch to stderr.

A module of its own as the only one that runs OPA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from capgate.cli.commands.common import safe
from capgate.cli.commands.diff.calls import Ask, call_input
from capgate.cli.commands.diff.matrix import Matrix, Scenario
from capgate.cli.commands.diff.queries import (
    CALL_QUERY,
    CODES_QUERY,
    DECISION_QUERY,
    EXCLUDED,
    REASON_SOURCES,
    VISIBLE_QUERY,
)
from capgate.cli.commands.diff.sides import Side
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.policy.timeouts import whole_catalogue_timeout

__all__ = ["eval_seconds", "evaluate", "evaluate_calls", "evaluate_inputs"]

#: Scenarios per ``opa eval``: a progress line each.
_BATCH: Final = 100
#: Calls per ``opa eval``.
_CALL_BATCH: Final = 1000


def _opa_error(done: subprocess.CompletedProcess[bytes]) -> str:
    """OPA's own first line of complaint: ``--format json`` puts it on stdout."""
    text = done.stderr.decode("utf-8", "replace").strip()
    try:
        errors = json.loads(done.stdout).get("errors") or []
        text = str(errors[0].get("message", text)) if errors else text
    except (ValueError, AttributeError):
        pass
    lines = [line.strip() for line in text.splitlines() if line.strip()] or ["(no message)"]
    return safe(" ".join(lines[:3]))[:600]


def eval_seconds(side: Side, *, composes: int = 0, calls: int = 0) -> float:
    """How long one ``opa eval`` of ``side`` may take before it is stopped.

    Each compose scenario asks about every tool of the catalogue (the visible set and
    every hidden tool's codes), so it is allowed what the policy client allows such a
    question, :func:`~capgate.gateway.policy.timeouts.whole_catalogue_timeout`; each call is a
    question about one tool, allowed the plain timeout. Starting ``opa eval`` (reading
    and compiling the bundle, which grows with the catalogue) counts as one more
    whole-catalogue question, and the sum is doubled, as an exchange with OPA may
    take twice its timeout. A bound against a hung ``opa eval``, far above what a
    batch takes (docs/policy-authoring.md), that grows with the catalogue and the batch.
    """
    whole = whole_catalogue_timeout(side.timeout, len(side.catalogue.tools))
    return 2 * (whole * (1 + composes) + side.timeout * calls)


def _opa_eval(
    opa: Path,
    bundle: Path,
    query: str,
    scenarios: list[dict[str, Any]],
    label: str,
    seconds: float,
) -> Any:
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=bundle.parent) as file:
        json.dump({"scenarios": scenarios}, file)
        file.flush()
        command = [str(opa), "eval", "--format", "json", "--bundle", str(bundle)]
        try:
            done = subprocess.run(
                [*command, "--input", file.name, query],
                capture_output=True,
                check=False,
                timeout=seconds,
            )
        except subprocess.TimeoutExpired:  # run() has killed it and waited
            raise PolicyUnavailable(
                f"opa eval of {len(scenarios)} question(s) did not finish within {seconds:g}s "
                f"on the bundle of {label} (eval_seconds: the timeout, plus its allowance a "
                "tool for a question about the whole catalogue, twice over); if OPA is "
                "only slow, give a longer --timeout"
            ) from None
    if done.returncode != 0:
        raise PolicyUnavailable(f"opa eval failed on the bundle of {label}: {_opa_error(done)}")
    result = json.loads(done.stdout).get("result") or []
    if not result:
        return None
    return result[0]["expressions"][0]["value"]


def _batches(
    side: Side, opa: Path, query: str, inputs: list[dict[str, Any]], what: str, undefined: str
) -> Iterator[tuple[int, list[Any]]]:
    """Each batch of ``inputs`` (``what``: scenarios or calls) put to one ``opa eval`` of
    ``query``: where it starts, and one answer an input. A progress line follows each
    batch the caller has taken in; an answer missing for some input is ``undefined``."""
    size = _BATCH if what == "scenarios" else _CALL_BATCH
    for start in range(0, len(inputs), size):
        batch = inputs[start : start + size]
        if what == "scenarios":
            seconds = eval_seconds(side, composes=len(batch))
        else:
            seconds = eval_seconds(side, calls=len(batch))
        values = _opa_eval(opa, side.bundle, query, batch, side.label, seconds)
        if not isinstance(values, list) or len(values) != len(batch):
            raise PolicyUnavailable(f"{side.name} ({side.label}): {undefined}")
        yield start, values
        print(
            f"capgate diff: {side.name}: {min(start + size, len(inputs))}/{len(inputs)} "
            f"{what} evaluated",
            file=sys.stderr,
            flush=True,
        )


def evaluate(side: Side, opa: Path, matrix: Matrix, scenarios: list[Scenario]) -> None:
    """Ask ``side`` every scenario, a batch an ``opa eval``, into ``side.results``."""
    inputs = [matrix.compose_input(scenario) for scenario in scenarios]
    query = VISIBLE_QUERY
    if side.reasons:
        side.reasons_source, query = _reasons_query(side, opa, inputs[:1])
    undefined = (
        "the compose decision was undefined for some scenarios; does this revision define "
        "data.capgate.compose.decision?"
    )
    for start, values in _batches(side, opa, query, inputs, "scenarios", undefined):
        for scenario, value in zip(scenarios[start : start + _BATCH], values, strict=True):
            visible = frozenset(value["visible"])
            hidden = {name: frozenset(codes) for name, codes in value["hidden"].items()}
            if query == CODES_QUERY:
                _check_hidden(side, scenario, visible, hidden)
            side.results.append((visible, hidden))


def _reasons_query(side: Side, opa: Path, probe: list[dict[str, Any]]) -> tuple[str, str]:
    """The first source of reasons the revision defines, and the query that reads it."""
    for source, defined, query in REASON_SOURCES:
        if _opa_eval(opa, side.bundle, defined, probe, side.label, eval_seconds(side, composes=1)):
            return source, query
    return EXCLUDED, DECISION_QUERY


def _check_hidden(
    side: Side, scenario: Scenario, visible: frozenset[str], hidden: dict[str, frozenset[str]]
) -> None:
    """Refuse codes that disagree with the decision. ``compose_codes`` names the hidden
    tools itself (the other sources are read for the tools the decision hides), so a
    revision whose two answers differ is an error, not a diff."""
    if set(hidden) != set(side.catalogue.tools) - visible or not all(hidden.values()):
        raise PolicyUnavailable(
            f"{side.name} ({side.label}): {REASON_SOURCES[0][0]} does not hide exactly the "
            "tools compose's decision hides, each with a reason code, in the scenario "
            f"role {safe(scenario.role)}, {safe(scenario.label())}"
        )


def evaluate_calls(
    side: Side,
    opa: Path,
    matrix: Matrix,
    scenarios: Sequence[Scenario],
    asks: Sequence[Ask],
    now: datetime,
) -> None:
    """Ask ``side`` every call of ``asks``, a batch an ``opa eval``, into ``side.calls``."""
    inputs = [
        call_input(matrix, scenarios[a.scenario], side.catalogue.tools[a.tool], a.variant, now)
        for a in asks
    ]
    side.calls.extend(evaluate_inputs(side, opa, inputs))


def evaluate_inputs(
    side: Side, opa: Path, inputs: list[dict[str, Any]]
) -> list[tuple[bool, frozenset[str]]]:
    """Ask ``side`` each execute input, a batch an ``opa eval``: allowed, and the
    deny's codes, one an input (the calls, and the catalogue's fixtures)."""
    undefined = "the execute decision was undefined for some calls"
    answers: list[tuple[bool, frozenset[str]]] = []
    for _, values in _batches(side, opa, CALL_QUERY, inputs, "calls", undefined):
        answers.extend((bool(v["allow"]), frozenset(v["codes"])) for v in values)
    return answers
