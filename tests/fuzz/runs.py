"""How long the fuzz suite runs, with which seed, and what it ran (for the summary).

The suite is bounded and reproducible by default, so ``make test`` takes the same
time and tests the same inputs on every run; one variable each makes it longer:

``CAPGATE_FUZZ_EXAMPLES``
    examples per hypothesis property (default :data:`DEFAULT_EXAMPLES`);
``CAPGATE_ATHERIS_RUNS``
    inputs per atheris target (default: :data:`DEFAULT_ATHERIS_RUNS`);
``CAPGATE_ATHERIS_SECONDS``
    if set, each atheris target runs for this many seconds instead of a number of
    inputs (``make fuzz`` sets it).

Hypothesis draws its examples from a seed derived from each test's own code
(``derandomize=True``) and keeps no example database; it also mixes in constants it
finds in the project's loaded modules, so :func:`load_project_code` loads all of
``gateway``, ``adapters`` and ``capgate`` first, and the examples do not depend on
which other tests ran before. Two runs of the same code therefore try the same
inputs (a change to the code may change them). libFuzzer gets ``-seed=``
:data:`ATHERIS_SEED`. A failure prints what reproduces it (hypothesis'
``@reproduce_failure`` blob, libFuzzer's crash input).

:data:`RESULTS` collects one line per property and target; ``tests/fuzz/conftest.py``
prints them at the end of the session, so CI's output shows what ran.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Final

from hypothesis import HealthCheck, settings

__all__ = [
    "ATHERIS_SEED",
    "DEFAULT_ATHERIS_RUNS",
    "DEFAULT_EXAMPLES",
    "EXAMPLES_ENV",
    "RESULTS",
    "atheris_runs",
    "atheris_seconds",
    "examples",
    "fuzz_settings",
    "load_project_code",
]

EXAMPLES_ENV: Final = "CAPGATE_FUZZ_EXAMPLES"
ATHERIS_RUNS_ENV: Final = "CAPGATE_ATHERIS_RUNS"
ATHERIS_SECONDS_ENV: Final = "CAPGATE_ATHERIS_SECONDS"

#: Examples per property in ``make test``: about 0.02 s each against a local OPA.
DEFAULT_EXAMPLES: Final = 200
#: Inputs per atheris target in ``make test``: about 10 s each on a small machine
#: (the answer parser runs some 10,000 inputs a second, the canonicaliser, whose
#: inputs include 4,000-digit integers, 3,000), and a few seconds for the credential
#: variables (some 30,000 a second).
DEFAULT_ATHERIS_RUNS: Final = {"answer": 100_000, "canonical": 30_000, "credentials": 100_000}
ATHERIS_SEED: Final = 1

#: One summary line per property or target, in the order they ran.
RESULTS: list[str] = []


def _positive(name: str, default: int | None) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: expected a positive whole number")
    return int(raw)


def examples() -> int:
    """Examples per hypothesis property."""
    value = _positive(EXAMPLES_ENV, DEFAULT_EXAMPLES)
    assert value is not None
    return value


def atheris_runs(target: str) -> int:
    """Inputs for one atheris target (ignored when :func:`atheris_seconds` is set)."""
    value = _positive(ATHERIS_RUNS_ENV, DEFAULT_ATHERIS_RUNS[target])
    assert value is not None
    return value


def atheris_seconds() -> int | None:
    """Seconds per atheris target, or None to run :func:`atheris_runs` inputs."""
    return _positive(ATHERIS_SECONDS_ENV, None)


def fuzz_settings() -> settings:
    """The settings every property of the suite runs under."""
    return settings(
        max_examples=examples(),
        derandomize=True,  # the same examples on every run of the same code
        database=None,  # ... and none replayed from an earlier run's failures
        deadline=None,  # OPA's latency on a shared CI machine is not the property
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


def load_project_code() -> None:
    """Import every module of the project's three packages.

    Hypothesis draws some values from constants in the local modules that are loaded
    when it runs; loading all of them first keeps the examples the same whether the
    fuzz tests run alone or after the rest of the suite.
    """
    for name in ("gateway", "adapters", "capgate"):
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            importlib.import_module(module.name)
