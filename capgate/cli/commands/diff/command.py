"""The ``capgate diff`` command line: its options, its run and its exit codes.

:func:`register` adds the command to ``capgate``'s parser (:mod:`capgate.cli.main`);
:func:`run` prepares both sides, evaluates the matrix and then the calls on both at
once (a thread a side), compares them and prints the report. ``--fail-on-widen``
exits 1 when anything went hidden -> visible or denied -> allowed, for CI. Progress
goes to stderr; only the report goes to stdout. ``--html FILE`` writes the page of
:mod:`.page` besides, not instead: one evaluation gives a CI job both the text (or
Markdown) for its log or comment and the page to keep as an artifact, and the
evaluation is the slow part.

A module of its own so that the steps (:mod:`capgate.cli.commands.diff`) know
nothing of argparse, and the order they run in is read in one function.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from capgate.cli.commands.common import (
    EXIT_ERROR,
    EXIT_OK,
    Actions,
    add_timeout,
    exit_codes,
    safe,
)
from capgate.cli.commands.diff.calls import Ask, calls_to_ask
from capgate.cli.commands.diff.compare import compare, compare_calls
from capgate.cli.commands.diff.evaluate import evaluate, evaluate_calls
from capgate.cli.commands.diff.fixtures import evaluate_fixtures
from capgate.cli.commands.diff.matrix import Matrix
from capgate.cli.commands.diff.page import render
from capgate.cli.commands.diff.report import Report
from capgate.cli.commands.diff.sides import prepare, relative, repository
from capgate.gateway.errors import InvalidInput
from capgate.gateway.opa.binary import find_opa_binary

__all__ = ["DEFAULT_CALL_LIMIT", "DEFAULT_LIMIT", "DEFAULT_SEED", "EXIT_WIDENED", "register", "run"]

#: ``--fail-on-widen``: some decision went hidden -> visible.
EXIT_WIDENED: Final = 1
#: Scenarios evaluated at most before the matrix is sampled.
DEFAULT_LIMIT: Final = 2000
#: The seed of the sample when the matrix exceeds ``--limit``.
DEFAULT_SEED: Final = 11
#: Calls evaluated at most before they are sampled.
DEFAULT_CALL_LIMIT: Final = 4000

_EXITS = (
    (EXIT_OK, "the report was printed (with --fail-on-widen: nothing was widened)"),
    (
        EXIT_WIDENED,
        "--fail-on-widen, and a tool went hidden -> visible or a call denied -> allowed; or "
        "--fail-on-fixtures, and the head decides a fixture otherwise than it expects",
    ),
    (EXIT_ERROR, "error: bad revision or path, a catalogue that does not load, OPA failed"),
)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _html_target(path: Path) -> Path:
    """``--html``'s file, refused before the diff runs if it cannot be written there."""
    if path.is_dir() or not path.parent.is_dir():
        raise InvalidInput(f"--html {safe(path)}: give a file in a folder that exists")
    return path


def _write_html(path: Path, page: str) -> None:
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"--html {safe(path)}: cannot write it: {exc.strerror}") from None
    print(f"capgate diff: wrote {safe(path)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.html is not None:
        _html_target(args.html)
    repo = repository(Path(args.repo))
    policies = relative(args.policies, "--policies")
    catalogue = relative(args.catalogue, "--catalogue")
    opa = find_opa_binary()
    work = Path(tempfile.mkdtemp(prefix="capgate-diff-"))
    try:
        base = prepare("base", args.base, repo, policies, catalogue, work)
        head = prepare("head", args.head, repo, policies, catalogue, work)
        base.reasons = head.reasons = not args.no_reasons
        if args.timeout is not None:
            base.timeout = head.timeout = args.timeout
        matrix = Matrix.of([base.catalogue, head.catalogue], args.limit, args.seed)
        scenarios = matrix.scenarios()
        print(f"capgate diff: {matrix.describe()}", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(max_workers=2) as pool:
            for running in [pool.submit(evaluate, s, opa, matrix, scenarios) for s in (base, head)]:
                running.result()
            asks: list[Ask] = []
            total = 0
            if not args.no_calls:
                asks, total = calls_to_ask(base, head, scenarios, args.call_limit, args.seed)
                now = datetime.now(UTC)
                for running in [
                    pool.submit(evaluate_calls, s, opa, matrix, scenarios, asks, now)
                    for s in (base, head)
                ]:
                    running.result()
        fixtures = evaluate_fixtures(base, head, opa, datetime.now(UTC))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    flips = compare(base, head, scenarios) + compare_calls(base, head, scenarios, asks)
    report = Report(base, head, matrix, scenarios, flips, args.show, (len(asks), total), asks)
    report.fixtures = fixtures
    if args.html is not None:
        _write_html(args.html, render(report))
    if args.json:
        print(json.dumps(report.as_json(), indent=2, ensure_ascii=True))
    elif args.markdown:
        print(report.markdown())
    else:
        print(report.text())
    if args.fail_on_widen and report.widened:
        return EXIT_WIDENED
    return EXIT_WIDENED if args.fail_on_fixtures and report.fixtures_failing else EXIT_OK


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
        "--html",
        type=Path,
        metavar="FILE",
        help="also write the role x tool grids, base beside head, as a self-contained "
        "HTML page to FILE (with any of the outputs above on stdout)",
    )
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
    parser.add_argument(
        "--fail-on-fixtures",
        action="store_true",
        help=f"exit {EXIT_WIDENED} if the head decides one of the catalogue's fixtures "
        "otherwise than it expects (serve and worker would refuse that catalogue)",
    )
    add_timeout(parser)
    parser.set_defaults(run=run)
