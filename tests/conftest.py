"""Shared fixtures. Integration fixtures start a real OPA; none of them is faked.

``sales_sidecar`` has two transports (one fixture, parametrised):

- ``process``: the embedded OPA, a local process on a private unix socket, as
  ``PolicySidecar`` starts it in development;
- ``container``: OPA in a container started by testcontainers (the locally built OPA
  image, host networking, 127.0.0.1), serving the same bundle, reached over TCP as an
  external OPA, as in a deployment.

The integration modules in :data:`BOTH_TRANSPORTS` run every test on both; everywhere
else (the fuzz suite, whose cost is its example counts) the process alone. The
terminal summary says how many container-backed tests passed, so a CI log shows that
they ran.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from capgate.demo import demo_catalogue_dir
from capgate.gateway.catalogue import load_catalogue
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.opa.bundle import bundle_revision, write_bundle
from capgate.gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from tests.hang import ANSWER_TIMEOUT

TRANSPORTS = ("process", "container")
#: Modules whose tests run against both transports.
BOTH_TRANSPORTS = frozenset(
    {
        "tests/integration/test_cli_state.py",
        "tests/integration/test_end_to_end.py",
        "tests/integration/test_lifecycle.py",
        "tests/integration/test_mcp_server.py",
        "tests/integration/test_mcp_server_http.py",
    }
)
#: Tests that read the embedded OPA's own log file (``sales_sidecar.process``): a
#: container has no such file, so these run on the process only.
PROCESS_ONLY = frozenset(
    {
        "test_denials_are_logged_by_python_with_codes_but_no_facts",
        "test_a_secret_reaches_the_adapter_at_dispatch_only_and_is_written_nowhere",
    }
)
#: The marker of a test that ran against OPA in a container.
CONTAINER_MARK = "container_backed"
_passed_in_containers: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{CONTAINER_MARK}: ran against OPA in a container (testcontainers)"
    )


def _module(metafunc: pytest.Metafunc) -> str:
    return Path(metafunc.definition.fspath).relative_to(Path(__file__).parents[1]).as_posix()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sales_sidecar" not in metafunc.fixturenames:
        return
    if _module(metafunc) in BOTH_TRANSPORTS and metafunc.function.__name__ not in PROCESS_ONLY:
        metafunc.parametrize("sales_sidecar", TRANSPORTS, indirect=True, scope="module")
    # Elsewhere unparametrised (the test ids stay as they were): the process.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("sales_sidecar") == "container":
            item.add_marker(CONTAINER_MARK)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed and CONTAINER_MARK in report.keywords:
        _passed_in_containers.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _passed_in_containers:
        terminalreporter.write_sep(
            "-",
            f"capgate containers: {len(_passed_in_containers)} container-backed tests "
            "passed (OPA in a container: testcontainers, docker-compose)",
        )


@pytest.fixture(autouse=True)
def _no_external_opa(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose their OPA explicitly; a developer's CAPGATE_OPA_URL must not leak in."""
    monkeypatch.delenv(OPA_URL_ENV, raising=False)


@pytest.fixture(scope="session")
def sales_catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("sales"))


@pytest.fixture(scope="session")
def oracle_catalogue() -> Catalogue:
    return load_catalogue(demo_catalogue_dir("oracle-grove"))


@pytest.fixture(scope="module")
def sales_sidecar(
    request: pytest.FixtureRequest, sales_catalogue: Catalogue
) -> Iterator[PolicySidecar]:
    """OPA serving the real policies and the sales catalogue, on either transport."""
    transport = getattr(request, "param", TRANSPORTS[0])
    # Not the 0.5 s default: the tests wait for its answers, and CI machines are small and
    # shared, so the client's timeout is a hang bound (tests/hang.py), not a pace.
    if transport == "process":
        with PolicySidecar(sales_catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
            yield sidecar
        return
    # Imported here: testcontainers (and docker) only for the tests that use it.
    from tests.integration.containers_support import embedded_like, opa_container

    with tempfile.TemporaryDirectory(prefix="capgate-container-bundle-") as folder:
        bundle = write_bundle(sales_catalogue, Path(folder) / "bundle")
        command, mounts = embedded_like(bundle, Path(folder))
        with (
            opa_container(command, mounts=mounts) as opa,
            PolicySidecar(sales_catalogue, opa_url=opa.address, timeout=ANSWER_TIMEOUT) as sidecar,
        ):
            # The embedded sidecar pins the revision of the bundle it wrote; this bundle
            # was written here, from the same policies: pin its revision the same way.
            sidecar.client.expected_revision = bundle_revision(sales_catalogue)
            yield sidecar
