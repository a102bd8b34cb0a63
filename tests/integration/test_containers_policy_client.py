"""tests/integration/test_policy_client_live.py again, with OPA in a container.

Every test of that module that takes its ``server`` (or the ``client`` made from it)
runs here once more, collected in this module, where ``server`` is OPA started by
testcontainers from the locally built OPA image (host networking, 127.0.0.1, the same
flags and bundle as that module's ``external_tcp`` server). Nothing else changes: the
same answers, the same fail-closed paths, OPA killed mid-run by its process id (the
container runs as our user, so its process is ours to signal).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CONTAINER_MARK
from tests.integration import test_policy_client_live as live
from tests.integration.containers_support import container_server
from tests.integration.opa_servers import Server
from tests.integration.test_policy_client_live import client  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    request.applymarker(CONTAINER_MARK)  # counted in the run's summary
    with container_server(live.write_bundle(tmp_path)) as container:
        yield container


#: The live module's tests that use its OPA server, collected here too.
REUSED = sorted(
    name
    for name, test in vars(live).items()
    if name.startswith("test_")
    and callable(test)
    and {"server", "client"} & set(inspect.signature(test).parameters)
)
globals().update({name: getattr(live, name) for name in REUSED})


def test_the_live_tests_that_use_a_server_run_here_too() -> None:
    assert len(REUSED) >= 10, REUSED
    assert "test_opa_killed_mid_run_fails_closed_and_the_tool_never_runs" in REUSED
