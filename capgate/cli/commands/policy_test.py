"""``capgate policy-test [--watch]``: the policy gate, once or on every save.

    capgate policy-test [--only STEP] [POLICIES_DIR]
    capgate policy-test --watch [--interval SECONDS] [--runs N] [--only STEP] [POLICIES_DIR]

The gate is the checkout's ``scripts/policy-gate.sh`` (``make policy-test``): ``opa
fmt``, ``opa check --strict``, the capabilities check, Regal, ``opa test`` with
coverage. This command runs that script, not a copy of its steps, so the author's
loop and CI cannot drift apart; it therefore needs a source checkout (an installed
capgate has no gate to run) and says so.

``--watch`` runs the gate, then polls the policies folder every ``--interval``
seconds (default 0.5) for a file added, removed or changed (its modification time or
size), waits until the folder has been still for one more interval (an editor saving
several files, a formatter rewriting them), and runs the gate again, until Ctrl-C.
Polling needs no new dependency and works the same on every file system. ``--runs N``
stops after N runs of the gate, for scripts and tests.

The gate's own output goes to stdout and stderr as it comes; a failing table-driven
Rego test prints the rows that failed by name (``_failed_rows`` in the test
packages). This command's own lines (what changed, when it runs, the verdict) go to
stderr. Exit status: the gate's (0 passed, 1 a step failed), of the last run with
``--watch --runs``; 2 when the gate cannot be run; 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Final

from capgate.cli.commands.common import EXIT_DEMO_FAILED, EXIT_ERROR, EXIT_OK, Actions, exit_codes
from capgate.gateway.errors import InvalidInput
from capgate.gateway.opa.policies import checkout_root

__all__ = ["STEPS", "gate_command", "register", "snapshot"]

#: The steps ``scripts/policy-gate.sh --only`` accepts.
STEPS: Final = ("fmt", "check", "schema", "capabilities", "regal", "test")

_EXITS: Final = (
    (EXIT_OK, "the gate passed (with --watch --runs N: its last run passed)"),
    (EXIT_DEMO_FAILED, "a step of the gate failed (its output says which)"),
    (EXIT_ERROR, "error: not a source checkout, or the policies folder is missing"),
)

Snapshot = dict[str, tuple[int, int]]


def gate_command(only: str | None, policies: Path | None) -> list[str]:
    """The command that runs the checkout's gate (ValueError outside a checkout)."""
    root = checkout_root()
    script = root / "scripts" / "policy-gate.sh" if root is not None else None
    if script is None or not script.is_file():
        raise InvalidInput(
            "capgate policy-test runs the source checkout's scripts/policy-gate.sh, and "
            "this capgate is not running from a checkout; run it from one (make setup)"
        )
    command = ["bash", str(script)]
    if only is not None:
        command += ["--only", only]
    if policies is not None:
        command.append(str(policies))
    return command


def snapshot(folder: Path) -> Snapshot:
    """Every file under ``folder``: its path, modification time and size."""
    found: Snapshot = {}
    for path in folder.rglob("*"):
        try:
            stat = path.stat()
        except OSError:  # removed while we looked: the next poll sees it gone
            continue
        if path.is_file():
            found[path.relative_to(folder).as_posix()] = (stat.st_mtime_ns, stat.st_size)
    return found


def _changes(before: Snapshot, after: Snapshot) -> list[str]:
    return sorted(
        name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
    )


def _say(message: str) -> None:
    print(f"policy-test: {message}", file=sys.stderr, flush=True)


def _run_gate(command: list[str]) -> int:
    sys.stdout.flush()
    status = subprocess.run(command, check=False).returncode
    verdict = "passed" if status == 0 else f"FAILED (exit {status})"
    _say(f"gate {verdict} at {datetime.now():%H:%M:%S}")
    return EXIT_OK if status == 0 else EXIT_DEMO_FAILED


def _watch(command: list[str], folder: Path, interval: float, runs: int | None) -> int:
    done = 0
    while True:
        seen = snapshot(folder)
        status = _run_gate(command)
        done += 1
        if runs is not None and done >= runs:
            return status
        _say(f"watching {folder} for changes (Ctrl-C to stop)")
        while True:
            time.sleep(interval)
            now = snapshot(folder)
            if now == seen:
                continue
            # Wait until the folder is still for one interval: one save, one run.
            while True:
                time.sleep(interval)
                settled = snapshot(folder)
                if settled == now:
                    break
                now = settled
            changed = _changes(seen, now)
            shown = ", ".join(changed[:5]) + (
                f" and {len(changed) - 5} more" if changed[5:] else ""
            )
            _say(f"changed: {shown}; running the gate again")
            break


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.05 <= value <= 60:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds from 0.05 to 60")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def run(args: argparse.Namespace) -> int:
    command = gate_command(args.only, args.policies)
    if not args.watch:
        if args.runs is not None:
            raise InvalidInput("--runs goes with --watch")
        return _run_gate(command)
    root = checkout_root()
    assert root is not None  # gate_command found the checkout
    folder = (args.policies or root / "policies").resolve()
    if not folder.is_dir():
        raise InvalidInput(f"policies folder not found: {folder}")
    return _watch(command, folder, args.interval, args.runs)


def register(sub: Actions) -> None:
    """Add ``capgate policy-test`` to the command line."""
    help = "run the policy gate (make policy-test), once or with --watch on every save"
    parser = sub.add_parser(
        "policy-test",
        help=help,
        description=help
        + ": opa fmt, opa check --strict, input schemas, capabilities, regal, opa test with "
        "coverage (docs/policy-authoring.md)",
        epilog=exit_codes(_EXITS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "policies",
        nargs="?",
        type=Path,
        default=None,
        help="the policies folder (default: the checkout's policies/)",
    )
    parser.add_argument("--only", choices=STEPS, help="run one step of the gate")
    parser.add_argument(
        "--watch", action="store_true", help="run again whenever a file under the folder changes"
    )
    parser.add_argument(
        "--interval",
        type=_positive_seconds,
        default=0.5,
        help="with --watch: seconds between looks at the folder (default 0.5)",
    )
    parser.add_argument(
        "--runs", type=_positive, help="with --watch: stop after this many runs of the gate"
    )
    parser.set_defaults(run=run)
