"""The policy author's loop: ``capgate policy-test [--watch]`` and ``scripts/policy-watch.sh``.

Each test runs the real gate (``scripts/policy-gate.sh``, real OPA) on a copy of the
policies in a temporary folder, so the checkout's policies are never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from tests.hang import HANG_SECONDS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CAPGATE = [sys.executable, "-m", "capgate.cli.main"]
ROW = '"tool not in the catalogue": {'


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    copy = tmp_path / "policies"
    shutil.copytree(ROOT / "policies", copy)
    return copy


def break_a_row(policies: Path) -> None:
    """Make one row of the review deny table expect a code it does not get."""
    path = policies / "capgate" / "review" / "review_test.rego"
    text = path.read_text(encoding="utf-8")
    start = text.index(ROW)
    old = '"codes": {"unknown_tool"}'
    at = text.index(old, start)
    path.write_text(text[:at] + '"codes": {"unknown_tool", "self_review"}' + text[at + len(old) :])


def read_until(stream: IO[str], needle: str, seconds: float = HANG_SECONDS) -> str:
    """Lines of ``stream`` up to the first holding ``needle`` (all of them, for messages)."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    pytest.fail(f"no {needle!r} in:\n{''.join(seen)[-3000:]}")


def test_policy_test_runs_the_gate_once_and_names_a_failing_row(policies):
    passed = subprocess.run(
        [*CAPGATE, "policy-test", "--only", "test", str(policies)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "policy-gate: policy coverage" in passed.stdout
    assert "policy-test: gate passed" in passed.stderr

    break_a_row(policies)
    failed = subprocess.run(
        [*CAPGATE, "policy-test", "--only", "test", str(policies)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert failed.returncode == 1
    assert "data.capgate.review_test.test_deny_matrix: FAIL" in failed.stdout
    assert (
        "table _deny_cases (review_test.rego) rows that failed: 1 "
        '{"tool not in the catalogue": {"got": {"allow": false, "codes": {"unknown_tool"}}, '
        '"want": {"allow": false, "codes": {"self_review", "unknown_tool"}}}}'
    ) in failed.stdout
    assert "policy-test: gate FAILED (exit " in failed.stderr  # opa test's own status


def test_watch_runs_again_on_save_until_its_runs_are_done(policies):
    with subprocess.Popen(
        [
            *CAPGATE,
            "policy-test",
            "--watch",
            "--interval",
            "0.1",
            "--runs",
            "2",
            "--only",
            "test",
            str(policies),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as watcher:
        assert watcher.stderr is not None
        first = read_until(watcher.stderr, "watching")
        assert "policy-test: gate passed" in first

        break_a_row(policies)

        second = read_until(watcher.stderr, "gate FAILED")
        assert "policy-test: changed: capgate/review/review_test.rego; running the gate again" in (
            second
        )
        assert watcher.wait(timeout=HANG_SECONDS) == 1


def test_the_watch_script_is_the_same_loop(policies):
    done = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "policy-watch.sh"),
            "--runs",
            "1",
            "--only",
            "fmt",
            "--interval",
            "0.2",
            str(policies),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "policy-gate: opa fmt" in done.stdout
    assert "policy-test: gate passed" in done.stderr


def test_bad_arguments_are_errors(capsys):
    from capgate.cli.main import main

    assert main(["policy-test", "--runs", "2"]) == 2
    assert "--runs goes with --watch" in capsys.readouterr().err
    assert main(["policy-test", "--watch", "--runs", "1", "/no/such/policies"]) == 2
    assert "policies folder not found" in capsys.readouterr().err
