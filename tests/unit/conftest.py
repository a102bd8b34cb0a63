"""Fixtures of the unit tests: a real SQLite store in the test's own folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from capgate.gateway.state.store import Store
from tests.unit.gateway_support import closing, open_seeded_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """Tenant ``t`` with every demo connection active, no budget limit."""
    yield from closing(open_seeded_store(tmp_path))
