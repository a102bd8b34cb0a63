"""The fuzz suite's shared fixture, and the counts behind a green run in CI's log."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests.fuzz.harness import LogCapture
from tests.fuzz.runs import RESULTS, atheris_seconds, examples


@pytest.fixture(scope="module")
def log_capture() -> Iterator[LogCapture]:
    """A DEBUG handler on the root logger, with every logger made to reach it."""
    handler = LogCapture()
    root = logging.getLogger()
    loggers = [
        logger for logger in root.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    saved = [(logger, logger.level, logger.propagate) for logger in loggers]
    saved_root, saved_disable = root.level, root.manager.disable
    logging.disable(logging.NOTSET)
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    for logger in loggers:
        logger.setLevel(logging.NOTSET)  # effective level: the root's DEBUG
        logger.propagate = True
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_root)
        logging.disable(saved_disable)
        for logger, level, propagate in saved:
            logger.setLevel(level)
            logger.propagate = propagate


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    seconds = atheris_seconds()
    atheris = f"{seconds} s per atheris target" if seconds else "atheris by runs"
    terminalreporter.write_sep(
        "-", f"capgate fuzz: {examples()} examples per property, {atheris}, fixed seeds"
    )
    for line in RESULTS:
        terminalreporter.write_line(line)
