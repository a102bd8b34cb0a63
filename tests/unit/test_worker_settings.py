"""The execution worker's settings and backoff, and how a configuration file gives them.

- ``backoff``: doubles from the first wait, stops at the longest, and is never below
  what the outcome asked for (``retry_after_seconds``), whatever the attempt number.
- ``WorkerSettings`` refuse what would make a worker misbehave (no concurrency, a
  longest backoff below the first, unknown keys), and the configuration file's
  ``worker`` section is read strictly with them; ``lease_seconds`` is the gateway's.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from capgate.adapters.fronts.mcp.config import parse_config
from capgate.gateway.errors import ConfigError
from capgate.gateway.service.gateway import DEFAULT_LEASE
from capgate.gateway.service.worker import WorkerSettings, backoff

TOOLS = "tools: capgate.demo.tools.sales_desk:SalesDesk\n"


def test_backoff_doubles_up_to_the_longest():
    settings = WorkerSettings(first_backoff_seconds=1, longest_backoff_seconds=10)
    assert [backoff(settings, n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff(settings, 0) == 1  # a first try counts as the first
    assert backoff(settings, 10_000) == 10  # no overflow, however many


def test_backoff_is_never_below_what_the_outcome_asked_for():
    settings = WorkerSettings(first_backoff_seconds=1, longest_backoff_seconds=10)
    assert backoff(settings, 1, retry_after=30.0) == 30.0  # above the longest, too
    assert backoff(settings, 3, retry_after=0.5) == 4


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"max_attempts": 0},
        {"poll_seconds": 0},
        {"claim_seconds": -1},
        {"first_backoff_seconds": 5, "longest_backoff_seconds": 1},
        {"stop_seconds": -1},
        {"retries": 3},
    ],
)
def test_settings_that_would_misbehave_are_refused(bad: dict[str, float]):
    with pytest.raises(ValidationError):
        WorkerSettings.model_validate(bad)


def test_the_defaults_are_the_documented_ones():
    settings = WorkerSettings()
    assert (settings.poll_seconds, settings.claim_seconds, settings.concurrency) == (0.5, 30, 4)
    assert (settings.max_attempts, settings.first_backoff_seconds) == (5, 1)
    assert (settings.longest_backoff_seconds, settings.stop_seconds) == (300, 30)
    assert settings.claim == timedelta(seconds=30)


def test_a_configuration_file_gives_the_worker_and_the_lease():
    config = parse_config(TOOLS + "lease_seconds: 20\nworker: {concurrency: 2, poll_seconds: 1}")
    assert config.worker == WorkerSettings(concurrency=2, poll_seconds=1)
    assert config.lease == timedelta(seconds=20)
    plain = parse_config(TOOLS)
    assert plain.worker == WorkerSettings()
    assert plain.lease == DEFAULT_LEASE


@pytest.mark.parametrize(
    "text",
    ["worker: {retries: 3}", "worker: {concurrency: 0}", "worker: 4", "lease_seconds: 0"],
)
def test_a_bad_worker_section_is_a_configuration_error(text: str):
    with pytest.raises(ConfigError):
        parse_config(TOOLS + text)
