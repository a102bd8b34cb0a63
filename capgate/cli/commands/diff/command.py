"""``capgate diff BASE [HEAD]``: which decisions a policy or catalogue change flips.

    capgate diff BASE [HEAD] --catalogue PATH [--policies PATH] [--repo DIR]
                 [--limit N] [--seed S] [--call-limit N] [--show N]
                 [--markdown | --json] [--no-reasons] [--no-calls] [--fail-on-widen]
                 [--timeout SECONDS]

A reviewer of a policy pull request asks first what the change does to the whole
catalogue, not to the one example in its tests. This command answers by asking both
revisions the same questions:

**The matrix.** Every role x task type x environment x budget class, each with the
connections of every alias active, and then with each alias in turn revoked and in
turn missing. The values are the union of both revisions' catalogues (roles, task
types and budget classes they declare; environments and aliases their tools name),
so a role only one side knows is asked of both. When the product exceeds ``--limit``
scenarios, ``--limit`` of them are drawn with ``random.Random(--seed)`` and the
output says so (same seed, same sample).

**Calls.** In every scenario with all connections active, each tool visible at both
sides is called (:data:`CALL_VARIANTS`): once as a complete call (the stage its
review needs, a matching approval of an approved proposal, the evidence it
requires, a linked subject, budget to spare), then with one thing wrong (no
approval, a used one, one for other parameters, a pending proposal, no review,
evidence missing, an unlinked subject, too little budget, another version). A
variant that does not apply to one side's contract is that side's complete call, so
a requirement dropped from a contract shows as a call denied -> allowed. Over
``--call-limit`` calls, a sample is drawn with ``--seed``. ``--no-calls`` skips this.

**The two sides.** BASE and HEAD are git revisions of the repository ``--repo``
(default: the current folder); without HEAD the other side is the working tree.
Each revision's ``--policies`` folder and ``--catalogue`` folder are extracted with
``git archive`` into a private temporary folder, the catalogue is loaded and the
bundle written as ``capgate bundle`` writes it (:func:`capgate.gateway.opa.bundle.write_bundle`),
and one ``opa eval`` per batch of scenarios or calls evaluates them against that
bundle (``data.capgate.compose.decision``, ``data.capgate.execute.decision``), so
nothing of a decision is computed here. Each ``opa eval`` is stopped, and the diff
fails, past :func:`eval_seconds`: what the policy client allows its questions (the
``--timeout``, and for a compose scenario an allowance a tool), summed over the batch.

**Reasons.** The reasons of a hidden tool are the codes of its failing checks, from
the first of these entrypoints the revision defines (:data:`REASON_SOURCES`):
``data.capgate.explain.compose_codes`` (the codes alone, computed over the index at
about the cost of compose), ``data.capgate.explain.compose`` (every check of every
tool with its facts, several times the cost of the decision on a catalogue of
thousands of tools; the revisions before ``compose_codes``), else the codes of
``decision.excluded`` (the revisions before explain). All three give the same codes
for the same decision, so an old base still diffs against a new head. A call's
reasons are the codes of execute's reasons. ``--no-reasons`` compares visibility
without asking for reasons, which is all widening needs.

**Flips.** A tool in a scenario flips when it goes hidden -> visible, visible ->
hidden, or stays hidden with another set of reason codes; a call flips when it goes
denied -> allowed or allowed -> denied. A tool only one revision has counts as
hidden there, with the reason ``(not in catalogue)``. Flips are grouped by tool and
role with counts, as text, as Markdown for a pull-request comment (``--markdown``)
or as JSON (``--json``). ``--fail-on-widen`` exits 1 when anything went hidden ->
visible or denied -> allowed, for CI. Progress goes to stderr; only the report goes
to stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from capgate.cli.commands.common import EXIT_ERROR, EXIT_OK, Actions, add_timeout, exit_codes, safe
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.digest import digest_of
from capgate.gateway.errors import InvalidInput, PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.model.facts import ComposeInput, ExecuteInput
from capgate.gateway.opa.binary import find_opa_binary
from capgate.gateway.opa.bundle import write_bundle
from capgate.gateway.policy.timeouts import DEFAULT_TIMEOUT, whole_catalogue_timeout

__all__ = [
    "CALL_VARIANTS",
    "DEFAULT_CALL_LIMIT",
    "DEFAULT_LIMIT",
    "DEFAULT_SEED",
    "EXCLUDED",
    "EXIT_WIDENED",
    "REASON_SOURCES",
    "Flip",
    "Matrix",
    "Scenario",
    "eval_seconds",
    "register",
]

#: ``--fail-on-widen``: some decision went hidden -> visible.
EXIT_WIDENED: Final = 1
#: Scenarios evaluated at most before the matrix is sampled.
DEFAULT_LIMIT: Final = 2000
#: The seed of the sample when the matrix exceeds ``--limit``.
DEFAULT_SEED: Final = 11
#: Scenarios per ``opa eval``: a progress line each.
_BATCH: Final = 100
#: Calls evaluated at most before they are sampled.
DEFAULT_CALL_LIMIT: Final = 4000
#: Calls per ``opa eval``.
_CALL_BATCH: Final = 1000
#: The reason a tool has on the side whose catalogue lacks it.
ABSENT: Final = "(not in catalogue)"

_EXITS = (
    (EXIT_OK, "the report was printed (with --fail-on-widen: nothing was widened)"),
    (
        EXIT_WIDENED,
        "--fail-on-widen, and a tool went hidden -> visible or a call denied -> allowed",
    ),
    (EXIT_ERROR, "error: bad revision or path, a catalogue that does not load, OPA failed"),
)

# One query per batch: for every scenario, the visible names and, per hidden tool,
# the reason codes. The codes form reads them as they are; the explain form reads the
# failing checks' codes; the decision form, the codes of decision.excluded.
_CODES_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    "e := data.capgate.explain.compose_codes with input as s; "
    'r := {"visible": d.visible, "hidden": e.hidden}]'
)
_DECISION_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    'r := {"visible": d.visible, "hidden": {n: cs | some n, rs in d.excluded; '
    "cs := {x.code | some x in rs}}}]"
)
_EXPLAIN_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    "e := data.capgate.explain.compose with input as s; "
    'r := {"visible": d.visible, "hidden": {n: cs | some n, t in e.tools; '
    "not n in d.visible; "
    "cs := {c.code | some c in t.checks; c.pass == false}}}]"
)
_VISIBLE_QUERY: Final = (
    "[r | some s in input.scenarios; "
    "d := data.capgate.compose.decision with input as s; "
    'r := {"visible": d.visible, "hidden": {}}]'
)
_CALL_QUERY: Final = (
    "[r | some c in input.scenarios; "
    "d := data.capgate.execute.decision with input as c; "
    'r := {"allow": d.allow, "codes": {x.code | some x in d.reasons}}]'
)
#: The sources of reasons, newest first, each with the query that asks whether a
#: revision defines it (a non-empty answer) and the query that reads it. A revision
#: defining neither gives ``decision.excluded`` (:data:`EXCLUDED`).
REASON_SOURCES: Final = (
    (
        "data.capgate.explain.compose_codes",
        "[1 | e := data.capgate.explain.compose_codes with input as input.scenarios[0]; "
        "is_object(e.hidden)]",
        _CODES_QUERY,
    ),
    (
        "data.capgate.explain.compose",
        "[1 | e := data.capgate.explain.compose with input as input.scenarios[0]; "
        "is_object(e.tools)]",
        _EXPLAIN_QUERY,
    ),
)
#: Where the reasons come from for a revision that defines no explain entrypoint.
EXCLUDED: Final = "data.capgate.compose.decision.excluded"


# -- the matrix -------------------------------------------------------------------------------


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


# -- one side: a revision's bundle, evaluated --------------------------------------------------


@dataclass
class Side:
    """A revision (or the working tree), its catalogue and its bundle."""

    name: str  # "base" or "head"
    label: str  # the revision as given and its commit, or "working tree"
    catalogue: Catalogue
    bundle: Path
    #: --no-reasons: reasons are not asked for
    reasons: bool = True
    #: --timeout: the seconds each question may take, before the allowance a tool of a
    #: question about the whole catalogue (:func:`eval_seconds`)
    timeout: float = DEFAULT_TIMEOUT
    #: the entrypoint the reasons were read from (:data:`REASON_SOURCES`, :data:`EXCLUDED`)
    reasons_source: str = EXCLUDED
    #: per scenario: visible names, and reason codes per hidden tool
    results: list[tuple[frozenset[str], dict[str, frozenset[str]]]] = field(default_factory=list)
    #: per call asked (see :func:`calls_to_ask`): allowed, and the deny's codes
    calls: list[tuple[bool, frozenset[str]]] = field(default_factory=list)

    @property
    def reasons_from(self) -> str:
        if not self.reasons:
            return "nowhere (--no-reasons)"
        return self.reasons_source


def _git(repo: Path, *args: str) -> bytes:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    except OSError as exc:
        raise InvalidInput(f"cannot run git: {exc.strerror}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InvalidInput(f"git {args[0]} failed: {safe(message[-1] if message else '?')}")
    return done.stdout


def _commit(repo: Path, revision: str) -> str:
    if not revision or revision.startswith("-"):
        raise InvalidInput(f"{safe(revision)!r} is not a git revision")
    try:
        found = _git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    except InvalidInput:
        raise InvalidInput(f"no commit {safe(revision)!r} in {repo}") from None
    return found.decode().strip()


def _relative(path: Path, what: str) -> str:
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise InvalidInput(
            f"{what} {path}: give a path inside the repository, relative to its root"
        )
    return path.as_posix()


def _extract(repo: Path, commit: str, paths: Sequence[str], into: Path) -> None:
    archive = into / "revision.tar"
    archive.write_bytes(_git(repo, "archive", "--format=tar", commit, "--", *paths))
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    archive.unlink()


def _prepare(
    name: str,
    revision: str | None,
    repo: Path,
    policies: str,
    catalogue: str,
    work: Path,
) -> Side:
    folder = work / name
    folder.mkdir()
    if revision is None:
        tree, label = repo, "working tree"
    else:
        commit = _commit(repo, revision)
        _extract(repo, commit, [policies, catalogue], folder)
        tree, label = folder / "tree", f"{revision} ({commit[:12]})"
    loaded = load_catalogue(tree / catalogue)
    bundle = write_bundle(loaded, folder / "bundle", tree / policies)
    return Side(name, label, loaded, bundle)


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


def _evaluate(side: Side, opa: Path, matrix: Matrix, scenarios: list[Scenario]) -> None:
    inputs = [matrix.compose_input(scenario) for scenario in scenarios]
    query = _VISIBLE_QUERY
    if side.reasons:
        side.reasons_source, query = _reasons_query(side, opa, inputs[:1])
    for start in range(0, len(inputs), _BATCH):
        batch = inputs[start : start + _BATCH]
        seconds = eval_seconds(side, composes=len(batch))
        values = _opa_eval(opa, side.bundle, query, batch, side.label, seconds)
        if not isinstance(values, list) or len(values) != len(batch):
            raise PolicyUnavailable(
                f"{side.name} ({side.label}): the compose decision was undefined for some "
                "scenarios; does this revision define data.capgate.compose.decision?"
            )
        for scenario, value in zip(scenarios[start : start + _BATCH], values, strict=True):
            visible = frozenset(value["visible"])
            hidden = {name: frozenset(codes) for name, codes in value["hidden"].items()}
            if query == _CODES_QUERY:
                _check_hidden(side, scenario, visible, hidden)
            side.results.append((visible, hidden))
        done = min(start + _BATCH, len(inputs))
        print(
            f"capgate diff: {side.name}: {done}/{len(inputs)} scenarios evaluated",
            file=sys.stderr,
            flush=True,
        )


def _reasons_query(side: Side, opa: Path, probe: list[dict[str, Any]]) -> tuple[str, str]:
    """The first source of reasons the revision defines, and the query that reads it."""
    for source, defined, query in REASON_SOURCES:
        if _opa_eval(opa, side.bundle, defined, probe, side.label, eval_seconds(side, composes=1)):
            return source, query
    return EXCLUDED, _DECISION_QUERY


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


# -- calls: what execute says of the tools both sides show ------------------------------------

#: The calls asked of each tool visible at both sides, with every connection active:
#: a complete call (the stage its review needs, a matching unused approval of an
#: approved proposal, the evidence it requires, a subject linked to the task, budget
#: to spare, its version), then that call with one thing wrong. A variant that does
#: not apply to a side's contract (evidence missing, for a tool that requires none)
#: is the complete call there, so a requirement dropped shows as denied -> allowed.
CALL_VARIANTS: Final = (
    "complete",
    "no approval",
    "approval used",
    "approval of other parameters",
    "proposal pending",
    "called without review",
    "evidence missing",
    "subject not linked",
    "budget short",
    "other version",
)

_SUBJECT_ID: Final = "capgate-diff-subject"
_OPERATION: Final = "capgate-diff-operation"
_DIGEST: Final = digest_of(b"{}")


def _applies(contract: ToolContract, variant: str) -> bool:
    if variant in {
        "no approval",
        "approval used",
        "approval of other parameters",
        "proposal pending",
        "called without review",
    }:
        return contract.needs_review
    if variant == "evidence missing":
        return bool(contract.requires)
    if variant == "subject not linked":
        return contract.subject_type is not None
    if variant == "budget short":
        return contract.cost_units > 0
    return True


def call_input(
    matrix: Matrix, scenario: Scenario, contract: ToolContract, variant: str, now: datetime
) -> dict[str, Any]:
    """The execute input of ``variant`` of a call of ``contract`` in ``scenario``."""
    wrong = variant if _applies(contract, variant) else "complete"
    facts = matrix.compose_input(scenario)
    subject = None
    if contract.subject_type is not None:
        facts["task"]["linked_resources"] = [{"type": contract.subject_type, "id": _SUBJECT_ID}]
        subject = {
            "type": contract.subject_type,
            "id": "not-linked" if wrong == "subject not linked" else _SUBJECT_ID,
        }
    reviewed = contract.needs_review
    approval: dict[str, Any] | None = None
    if reviewed and wrong not in {"no approval", "called without review"}:
        approval = {
            "kind": contract.approval.value,
            "tool": contract.name,
            "operation_id": _OPERATION,
            "tenant": facts["principal"]["tenant"],
            "digest": digest_of(b"[]") if wrong == "approval of other parameters" else _DIGEST,
            "expires_at": now + timedelta(hours=1),
            "approved_by": "capgate-diff",
            "used": wrong == "approval used",
        }
    cost = contract.cost_units
    call = ExecuteInput.model_validate(
        {
            **facts,
            "call": {
                "tool": contract.name,
                "version": contract.version + (1 if wrong == "other version" else 0),
                "operation_id": _OPERATION,
                "subject": subject,
                "params_digest": _DIGEST,
            },
            "stage": "dispatch" if reviewed and wrong != "called without review" else "call",
            "approval": approval,
            "proposal": {
                "id": "capgate-diff-proposal",
                "status": "pending" if wrong == "proposal pending" else "approved",
            }
            if reviewed
            else None,
            "evidence": [] if wrong == "evidence missing" else list(contract.requires),
            "budget": {"remaining": cost - 1 if wrong == "budget short" else None, "cost": cost},
            "operation": {"status": "none"},
        }
    )
    return call.to_opa()


@dataclass(frozen=True, slots=True)
class Ask:
    """One call asked of both sides: the scenario (by index), the tool, the variant."""

    scenario: int
    tool: str
    variant: str


def calls_to_ask(
    base: Side, head: Side, scenarios: Sequence[Scenario], limit: int, seed: int
) -> tuple[list[Ask], int]:
    """Every variant of every tool visible at both sides in the scenarios with every
    connection active, or ``limit`` of them drawn with ``seed``; and how many there were."""
    asks = [
        Ask(index, tool, variant)
        for index, scenario in enumerate(scenarios)
        if scenario.connections == "all active"
        for tool in sorted(base.results[index][0] & head.results[index][0])
        if tool in base.catalogue.tools and tool in head.catalogue.tools
        for variant in CALL_VARIANTS
        if _applies(base.catalogue.tools[tool], variant)
        or _applies(head.catalogue.tools[tool], variant)
    ]
    if len(asks) <= limit:
        return asks, len(asks)
    draw = random.Random(seed)  # noqa: S311 (a reproducible sample, not a secret)
    return [asks[i] for i in sorted(draw.sample(range(len(asks)), limit))], len(asks)


def _evaluate_calls(
    side: Side,
    opa: Path,
    matrix: Matrix,
    scenarios: Sequence[Scenario],
    asks: Sequence[Ask],
    now: datetime,
) -> None:
    inputs = [
        call_input(matrix, scenarios[a.scenario], side.catalogue.tools[a.tool], a.variant, now)
        for a in asks
    ]
    for start in range(0, len(inputs), _CALL_BATCH):
        batch = inputs[start : start + _CALL_BATCH]
        seconds = eval_seconds(side, calls=len(batch))
        values = _opa_eval(opa, side.bundle, _CALL_QUERY, batch, side.label, seconds)
        if not isinstance(values, list) or len(values) != len(batch):
            raise PolicyUnavailable(
                f"{side.name} ({side.label}): the execute decision was undefined for some calls"
            )
        side.calls.extend((bool(v["allow"]), frozenset(v["codes"])) for v in values)
        print(
            f"capgate diff: {side.name}: {min(start + _CALL_BATCH, len(inputs))}/{len(inputs)} "
            "calls evaluated",
            file=sys.stderr,
            flush=True,
        )


# -- comparing --------------------------------------------------------------------------------

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


def _state(
    tool: str, catalogue: Catalogue, result: tuple[frozenset[str], dict[str, frozenset[str]]]
) -> tuple[bool, frozenset[str]]:
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
            was_visible, was = _state(tool, base.catalogue, before)
            is_visible, now = _state(tool, head.catalogue, after)
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


def _groups(flips: Sequence[Flip]) -> dict[tuple[str, str], list[Flip]]:
    grouped: dict[tuple[str, str], list[Flip]] = defaultdict(list)
    for flip in flips:
        grouped[(flip.tool, flip.scenario.role)].append(flip)
    return dict(sorted(grouped.items()))


def _counts(flips: Sequence[Flip]) -> str:
    counted = Counter(flip.kind for flip in flips)
    return ", ".join(f"{kind} {counted[kind]}" for kind in KINDS if counted[kind])


def _change(flip: Flip) -> str:
    def shown(codes: tuple[str, ...]) -> str:
        if codes:
            return ", ".join(codes)
        return "visible" if flip.call is None else "allowed"

    return f"{shown(flip.before)} => {shown(flip.after)}"


# -- reports ----------------------------------------------------------------------------------


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
            self.summary(),
        ]
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
                lines.append(f"    {flip.kind:<22}  {flip.label()}: {_change(flip)}")
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
            "",
            f"**{self.summary()}**",
        ]
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
                lines.append(f"  - {flip.kind}: {_md(flip.label())}: {_md(_change(flip))}")
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
        }


def _md(text: str) -> str:
    return safe(text).replace("|", "\\|").replace("`", "'").replace("<", "&lt;")


# -- the command ------------------------------------------------------------------------------


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def run(args: argparse.Namespace) -> int:
    repo = Path(_git(Path(args.repo), "rev-parse", "--show-toplevel").decode().strip())
    policies = _relative(args.policies, "--policies")
    catalogue = _relative(args.catalogue, "--catalogue")
    opa = find_opa_binary()
    work = Path(tempfile.mkdtemp(prefix="capgate-diff-"))
    try:
        base = _prepare("base", args.base, repo, policies, catalogue, work)
        head = _prepare("head", args.head, repo, policies, catalogue, work)
        base.reasons = head.reasons = not args.no_reasons
        if args.timeout is not None:
            base.timeout = head.timeout = args.timeout
        matrix = Matrix.of([base.catalogue, head.catalogue], args.limit, args.seed)
        scenarios = matrix.scenarios()
        print(f"capgate diff: {matrix.describe()}", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(max_workers=2) as pool:
            for running in [
                pool.submit(_evaluate, s, opa, matrix, scenarios) for s in (base, head)
            ]:
                running.result()
            asks: list[Ask] = []
            total = 0
            if not args.no_calls:
                asks, total = calls_to_ask(base, head, scenarios, args.call_limit, args.seed)
                now = datetime.now(UTC)
                for running in [
                    pool.submit(_evaluate_calls, s, opa, matrix, scenarios, asks, now)
                    for s in (base, head)
                ]:
                    running.result()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    flips = compare(base, head, scenarios) + compare_calls(base, head, scenarios, asks)
    report = Report(base, head, matrix, scenarios, flips, args.show, (len(asks), total))
    if args.json:
        print(json.dumps(report.as_json(), indent=2, ensure_ascii=True))
    elif args.markdown:
        print(report.markdown())
    else:
        print(report.text())
    return EXIT_WIDENED if args.fail_on_widen and report.widened else EXIT_OK


def register(sub: Actions) -> None:
    """Add ``capgate diff`` to the command line."""
    help = "list the decisions that flip between two policy-and-catalogue revisions"
    parser = sub.add_parser(
        "diff",
        help=help,
        description=help
        + ": every role x task type x environment x budget class, with all connections "
        "active and each alias revoked or missing in turn (docs/policy-authoring.md)",
        epilog=exit_codes(_EXITS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("base", help="the base git revision (e.g. main, HEAD~1, a commit)")
    parser.add_argument(
        "head", nargs="?", default=None, help="the head git revision (default: the working tree)"
    )
    parser.add_argument(
        "--catalogue", type=Path, required=True, help="the catalogue folder, from the repo root"
    )
    parser.add_argument(
        "--policies",
        type=Path,
        default=Path("policies"),
        help="the policies folder, from the repo root (default: policies)",
    )
    parser.add_argument("--repo", default=".", help="the git repository (default: .)")
    parser.add_argument(
        "--limit",
        type=_positive,
        default=DEFAULT_LIMIT,
        help=f"most scenarios to evaluate; a larger matrix is sampled (default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help=f"the sample's seed (default {DEFAULT_SEED})"
    )
    parser.add_argument(
        "--show",
        type=_positive,
        default=10,
        help="flipped decisions listed per tool and role (default 10; counts are complete)",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true", help="Markdown, for a PR comment")
    output.add_argument("--json", action="store_true", help="JSON, every flip")
    parser.add_argument(
        "--no-reasons",
        action="store_true",
        help="compare what is visible and callable, not the reasons of what is hidden: "
        "several times faster on a large catalogue, and all --fail-on-widen needs",
    )
    parser.add_argument(
        "--no-calls", action="store_true", help="compare compose only, ask no execute question"
    )
    parser.add_argument(
        "--call-limit",
        type=_positive,
        default=DEFAULT_CALL_LIMIT,
        help=f"most calls to evaluate; more are sampled with --seed (default {DEFAULT_CALL_LIMIT})",
    )
    parser.add_argument(
        "--fail-on-widen",
        action="store_true",
        help=f"exit {EXIT_WIDENED} if any decision goes hidden -> visible or denied -> allowed",
    )
    add_timeout(parser)
    parser.set_defaults(run=run)
