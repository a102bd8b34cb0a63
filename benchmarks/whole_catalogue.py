"""Whole-catalogue questions against their deadlines: explain compose and capgate diff.

Run by ``make bench`` after ``compose_scaling.py``; with ``--append FILE`` the results
are added to that Markdown file (docs/benchmarks.md) as one section. Every figure is
from this one run on a shared machine; the ratios compare measures taken in turn.

1. ``PolicyClient.explain_compose`` (``capgate/explain/compose``: six checks with
   their facts for every tool; what ``capgate explain``, ``capgate eval compose`` and
   ``compose(facts, reasons=True)`` ask) at 1,000 and 10,000 tools, on the synthetic
   catalogues of ``compose_scaling.py``, with the client as ``PolicySidecar`` builds
   it: its p50 against compose's, asked in turn, and its slowest call (answer parsed
   and validated too) against the question's read timeout,
   :func:`capgate.gateway.policy.timeouts.whole_catalogue_timeout`. With ``--baseline-policies
   DIR`` the same explanation is also asked of those policies, in turn.
2. ``capgate diff`` of the 1,000-tool catalogue the tests use
   (``tests/integration/large_catalogue.py``, one grant changed): the full matrix
   with every hidden tool's reasons and 4,000 sampled calls, against
   ``--no-reasons --no-calls``, each once, wall time.

Benchmarks are scripts, not tests: CI times nothing. The tests check what these
questions answer, and that their deadlines scale (tests/unit/test_policy_client.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compose_scaling import SYNTHETIC_FACTS, synthetic_catalogue
from capgate.cli.main import main as capgate
from capgate.gateway.opa.policies import default_policies_dir
from capgate.gateway.opa.sidecar import PolicySidecar
from capgate.gateway.policy.client import EXPLAIN_COMPOSE_PATH, PolicyClient
from capgate.gateway.policy.timeouts import PER_TOOL_TIMEOUT
from tests.integration.large_catalogue import write_large_catalogue

SIZES = (1_000, 10_000)


def seconds(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


class Exchanges(logging.Handler):
    """The client's own timing of each exchange (its DEBUG line): request to answer
    parsed as strict JSON, which is what the deadline bounds, less the models."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.ms: dict[str, list[float]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("opa %s in ") and isinstance(record.args, tuple):
            path, ms = record.args[0], record.args[1]
            self.ms.setdefault(str(path), []).append(float(str(ms)))


@contextlib.contextmanager
def exchanges() -> Iterator[Exchanges]:
    handler = Exchanges()
    logger = logging.getLogger("capgate.opa.client")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def explain_at(size: int, baseline: Path | None) -> list[str]:
    """One table row: explain against compose, and its slowest against its timeout."""
    catalogue = synthetic_catalogue(size)
    runs = 10 if size <= 1_000 else 4
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(PolicySidecar(catalogue)).client
        others: list[PolicyClient] = []
        if baseline is not None:
            # The baseline is measured, not held to a deadline.
            sidecar = PolicySidecar(catalogue, policies_dir=baseline, timeout=600)
            others.append(stack.enter_context(sidecar).client)
        composed: list[float] = []
        explained: list[float] = []
        before: list[float] = []
        client.explain_compose(SYNTHETIC_FACTS)  # warm
        with exchanges() as seen:
            for _ in range(runs):
                composed.append(seconds(lambda: client.compose(SYNTHETIC_FACTS)))
                explained.append(seconds(lambda: client.explain_compose(SYNTHETIC_FACTS)))
                for other in others:
                    before.append(seconds(partial(other.explain_compose, SYNTHETIC_FACTS)))
        limit = client.catalogue_timeout
    # Each round asks ours first, then the baseline's, if any.
    ours = seen.ms[EXPLAIN_COMPOSE_PATH][:: 1 + len(others)]
    p50 = statistics.median(explained)
    row = [
        f"{size:,}",
        f"{statistics.median(composed) * 1000:.1f}",
        f"{p50 * 1000:.0f}",
        f"{p50 / statistics.median(composed):.0f}x",
        f"{max(ours):.0f}",
        f"{limit:g} s",
        f"{max(ours) / 1000 / limit:.2f}x",
    ]
    if before:
        row.append(f"{p50 / statistics.median(before):.2f}x")
    print(f"explain compose, {size} tools: {' | '.join(row)}", flush=True)
    return row


@contextlib.contextmanager
def large_repo() -> Iterator[Path]:
    """A git repository holding the policies and the 1,000-tool catalogue, and in its
    working tree one grant more (tool.n0 for finance too)."""
    folder = Path(tempfile.mkdtemp(prefix="capgate-bench-diff-"))
    try:
        repo = folder / "repo"
        shutil.copytree(default_policies_dir(), repo / "policies")
        write_large_catalogue(repo / "catalogue", vary_environments=True)
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@example.test",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@example.test",
        }
        for command in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "1000"]):
            subprocess.run(["git", "-C", str(repo), *command], check=True, env=env)
        tools = repo / "catalogue" / "tools.yaml"
        document = yaml.safe_load(tools.read_text(encoding="utf-8"))
        document["tools"][0]["roles"] = ["sales", "finance"]
        tools.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        yield repo
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def diff_seconds(repo: Path, *options: str) -> float:
    """Wall time of one ``capgate diff HEAD`` of the working tree (output discarded)."""
    args = ["diff", "HEAD", "--repo", str(repo), "--catalogue", "catalogue", "--json", *options]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        started = time.perf_counter()
        code = capgate(args)
        took = time.perf_counter() - started
    if code != 0:
        sys.exit(f"bench: capgate diff failed:\n{err.getvalue()[-2000:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--append", type=Path, help="add the results to this Markdown file")
    parser.add_argument(
        "--baseline-policies", type=Path, help="also explain with these policies, in turn"
    )
    args = parser.parse_args()
    before = load()
    print(f"load average {before}", flush=True)
    rows = [explain_at(size, args.baseline_policies) for size in SIZES]
    with large_repo() as repo:
        full = diff_seconds(repo)
        bare = diff_seconds(repo, "--no-reasons", "--no-calls")
    print(f"capgate diff, 1,000 tools: {full:.1f} s, --no-reasons --no-calls {bare:.1f} s")
    after = load()
    headers = [
        "tools",
        "compose p50 ms",
        "explain p50 ms",
        "explain / compose",
        "slowest exchange ms",
        "read timeout",
        "slowest exchange / read timeout",
    ]
    if args.baseline_policies is not None:
        headers.append("explain p50 against the baseline policies'")
    lines = [
        "",
        "## Whole-catalogue questions against their deadlines",
        "",
        "Written by `benchmarks/whole_catalogue.py`, which `make bench` runs after the "
        f"script above; load average {before} before, {after} after.",
        "",
        "`PolicyClient.explain_compose` (what `capgate explain`, `capgate eval compose` and "
        "`compose(facts, reasons=True)` ask) with the client `PolicySidecar` builds: its "
        f"read timeout is the default plus {PER_TOOL_TIMEOUT * 1000:g} ms a tool "
        "(`whole_catalogue_timeout`), and the whole answer may take twice that. The p50s "
        "are of whole calls; an exchange is the client's own timing (request to answer "
        "parsed as JSON), which leaves out checking the answer against the models, a "
        "step the deadline does not bound.",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---:|" * len(headers),
        *("| " + " | ".join(row) + " |" for row in rows),
        *(
            [
                "",
                "The last column is the p50 against that of the policies given as "
                "`--baseline-policies`, asked in turn.",
            ]
            if args.baseline_policies is not None
            else []
        ),
        "",
        "`capgate diff` of the tests' 1,000-tool catalogue with one grant changed: the "
        "full matrix (280 scenarios) with every hidden tool's reasons and 4,000 sampled "
        f"calls took {full:.1f} s; with `--no-reasons --no-calls`, {bare:.1f} s "
        f"({full / bare:.1f}x). Each `opa eval` batch is bounded by `eval_seconds`, far "
        "above what it takes.",
    ]
    publish(lines, args.append)
    return 0


def publish(lines: list[str], append: Path | None) -> None:
    """Print a section, and add it to the Markdown file ``append`` when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if append is not None:
        with append.open("a", encoding="utf-8") as file:
            file.write(text)


if __name__ == "__main__":
    raise SystemExit(main())
