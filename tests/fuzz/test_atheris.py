"""Run each atheris fuzz target of ``fuzz_targets.py`` briefly, with a fixed seed.

Each target runs in its own process (libFuzzer owns the process and exits when it
is done) for a fixed number of inputs with ``-seed=1`` and ``PYTHONHASHSEED=0``, so
``make test`` fuzzes the same inputs every time; ``CAPGATE_ATHERIS_SECONDS`` runs
each for that long instead (``make fuzz``). A target that raises anything its
contract does not allow, breaks one of its assertions, or hangs on one input makes
libFuzzer exit non-zero with the input saved under the test's temporary folder;
the failure message shows the traceback and where the input is. The runs and
libFuzzer's coverage counters go into the session summary.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import pytest

from tests.fuzz.runs import ATHERIS_SEED, RESULTS, atheris_runs, atheris_seconds
from tests.hang import HANG_SECONDS, INNER_HANG_SECONDS

SCRIPT: Final = Path(__file__).with_name("fuzz_targets.py")
#: libFuzzer's last status line: "#150000	DONE   cov: 92 ft: 129 corp: 41/737b ...".
_DONE: Final = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")
_UNITS: Final = re.compile(r"stat::number_of_executed_units: (\d+)")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout((atheris_seconds() or 60) + 900),
]


@pytest.mark.parametrize("target", ["answer", "canonical", "credentials"])
def test_fuzz_target_runs_clean(target: str, tmp_path: Path) -> None:
    seconds = atheris_seconds()
    budget = [f"-max_total_time={seconds}"] if seconds else [f"-runs={atheris_runs(target)}"]
    command = [
        sys.executable,
        str(SCRIPT),
        target,
        *budget,
        f"-seed={ATHERIS_SEED}",
        f"-timeout={int(INNER_HANG_SECONDS)}",  # seconds for one input: longer is a hang
        "-rss_limit_mb=2048",
        "-print_final_stats=1",
        f"-artifact_prefix={tmp_path}/",
    ]
    started = time.perf_counter()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        errors="replace",
        cwd=tmp_path,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        timeout=(seconds or 0) + HANG_SECONDS,  # its own budget, then it must exit: a hang bound
        check=False,
    )
    elapsed = time.perf_counter() - started
    output = done.stderr + done.stdout
    saved = sorted(path.name for path in tmp_path.iterdir())
    assert done.returncode == 0, (
        f"fuzz target {target!r} failed (exit {done.returncode}); inputs saved in "
        f"{tmp_path}: {saved}\n{output[-6000:]}"
    )
    status = _DONE.search(output)
    units = _UNITS.search(output)
    assert status is not None, f"no final status line from libFuzzer:\n{output[-3000:]}"
    runs = int(units.group(1)) if units else int(status.group(1))
    cov, features, corpus, corpus_size = status.group(2, 3, 4, 5)
    RESULTS.append(
        f"atheris {target}: {runs} runs in {elapsed:.1f} s, seed {ATHERIS_SEED}: "
        f"cov {cov}, ft {features}, corpus {corpus} inputs ({corpus_size})"
    )
    if not seconds:
        assert runs == atheris_runs(target), f"libFuzzer stopped after {runs} runs"
