"""OPA in a container, started by testcontainers, for the container-backed tests.

The image is the locally built OPA image (``scripts/docker-images.sh``: FROM scratch
with the static ``.tools/bin/opa``), under the name of the official static image of
the pinned version, or ``$CAPGATE_OPA_IMAGE``. Nothing is pulled: no registry is
reachable, so an image that is not there is a failure with the command that builds
it, never a skip. testcontainers' reaper (Ryuk) is an image it would pull, so it stays
off (``TESTCONTAINERS_RYUK_DISABLED=true``) and every container is removed
explicitly, also when a test fails.

The containers use the host's network (the engine runs with no bridge) and OPA listens
on 127.0.0.1 only, on a free port; files reach them as read-only bind mounts, and they
run as the test's own user, so those files stay private to it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

# Read by testcontainers when it is imported: set before the import below.
os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"

from testcontainers.core.container import DockerContainer

from tests.hang import ANSWER_TIMEOUT, INNER_HANG_SECONDS
from tests.integration.opa_servers import Server, free_port

ROOT = Path(__file__).resolve().parents[2]
IMAGE_ENV = "CAPGATE_OPA_IMAGE"
#: How to get an engine and the images, for the failure messages.
HOW = "run `make images` (as root: it starts the Docker engine and builds the images)"


def pinned_opa_version() -> str:
    for line in (ROOT / "scripts" / "versions.env").read_text(encoding="utf-8").splitlines():
        if line.startswith("OPA_VERSION="):
            return line.partition("=")[2].strip().removeprefix("v")
    raise AssertionError("scripts/versions.env has no OPA_VERSION")


def opa_image() -> str:
    """The OPA image the containers run (built locally, never pulled)."""
    return os.environ.get(IMAGE_ENV) or f"openpolicyagent/opa:{pinned_opa_version()}-static"


def require_engine_and_image(image: str) -> None:
    """Fail (not skip) when no Docker engine answers or ``image`` is not built."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.fail(f"the docker client is not installed: {HOW}")
    try:
        answered = subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=INNER_HANG_SECONDS,  # an engine that answers at all: a hang bound
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the Docker engine did not answer within {INNER_HANG_SECONDS:g} s: {HOW}")
    if answered.returncode != 0:
        reason = answered.stderr.strip().splitlines()[-1:] or ["no answer"]
        pytest.fail(
            f"no Docker engine answers ({reason[0]}). The container-backed tests need one "
            f"this user may use (root, or the docker group): {HOW}"
        )
    inspected = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        timeout=INNER_HANG_SECONDS,
        check=False,
    )
    if inspected.returncode != 0:
        pytest.fail(f"the image {image} is not built (nothing is pulled here): {HOW}")


#: OPA's arguments (without the binary) for an address ``127.0.0.1:PORT``.
Command = Callable[[str], list[str]]

#: What the embedded OPA does (gateway.opa.process): OPA returns a decision id only
#: with decision logging on, so it is on, and this bundle drops every event.
_DROP_DECISION_LOGS = """\
# METADATA
# title: Keep decisions out of the test container's log
# description: Drops every decision log event; OPA still returns decision ids.
package system.log

drop := true
"""


def embedded_like(
    bundle: Path, folder: Path
) -> tuple[Callable[[str], list[str]], list[tuple[Path, str]]]:
    """The command and mounts of an OPA that serves ``bundle`` as the embedded OPA
    (gateway.opa.process) serves its own: decision ids on, every decision log event
    dropped by a bundle of root ``system/log`` (written under ``folder``), the same
    store option. Over TCP on 127.0.0.1 instead of a unix socket."""
    drop = folder / "no-decision-log"
    (drop / "system" / "log").mkdir(parents=True)
    (drop / ".manifest").write_text('{"roots": ["system/log"]}\n', encoding="utf-8")
    (drop / "system" / "log" / "drop.rego").write_text(_DROP_DECISION_LOGS, encoding="utf-8")

    def command(addr: str) -> list[str]:
        return ["run", "--server", "--addr", addr, "--bundle", "/bundle", "/no-decision-log",
                "--set", "decision_logs.console=true", "--log-format", "json",
                "--skip-version-check", "--optimize-store-for-read-speed"]  # fmt: skip

    return command, [(bundle, "/bundle"), (drop, "/no-decision-log")]


@dataclass
class OpaContainer:
    """A running OPA container: where it answers and what it logged."""

    address: str
    container: DockerContainer

    def logs(self) -> str:
        out, err = self.container.get_logs()
        return (out + err).decode("utf-8", errors="replace")

    @property
    def pid(self) -> int:
        """OPA's process id on this machine (the container shares no pid namespace with
        us, but its processes are ours to signal: it runs as our user)."""
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        pid: int = wrapped.attrs["State"]["Pid"]
        assert pid > 0, f"the container is not running: {wrapped.status}"
        return pid


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.2)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _healthy(address: str) -> bool:
    try:
        return httpx.get(f"{address}/health", timeout=ANSWER_TIMEOUT).status_code == 200
    except httpx.HTTPError:
        return False


def _status(container: DockerContainer) -> str:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    return str(wrapped.status)


@contextmanager
def opa_container(
    command: Command,
    *,
    mounts: Sequence[tuple[Path, str]] = (),
    wait: str = "healthy",
    image: str | None = None,
) -> Iterator[OpaContainer]:
    """OPA in a container, running ``command(addr)``: OPA's arguments (``run --server
    --addr ADDR ...``, without the binary) for ``addr``, a free ``127.0.0.1:PORT``.

    ``mounts`` are (host path, container path) pairs, mounted read-only. ``wait``:
    ``"healthy"`` returns once ``GET /health`` answers 200 (an OPA with no
    authorisation policy); ``"listening"`` once the port accepts connections (a
    locked-down OPA, whose readiness is what its tests look at). The container is
    removed afterwards, whatever happened.
    """
    image = image or opa_image()
    require_engine_and_image(image)
    last_logs = ""
    for _attempt in range(3):  # the port can be taken between probe and bind
        port = free_port()
        address = f"http://127.0.0.1:{port}"
        container = (
            DockerContainer(image)
            .with_command(list(command(f"127.0.0.1:{port}")))
            # As this user: the mounted files stay private to it (0600, 0700).
            .with_kwargs(
                network_mode="host",
                user=f"{os.getuid()}:{os.getgid()}",
                read_only=True,
                cap_drop=["ALL"],
            )
        )
        for host, inside in mounts:
            container = container.with_volume_mapping(str(host), inside, "ro")
        try:
            container.start()
            # A slow start is no taken port: only a hang ends this wait.
            deadline = time.monotonic() + INNER_HANG_SECONDS
            while time.monotonic() < deadline:
                up = _healthy(address) if wait == "healthy" else _listening(port)
                if up:
                    yield OpaContainer(address, container)
                    return
                if _status(container) == "exited":
                    break
                time.sleep(0.1)
            out, err = container.get_logs()
            last_logs = (out + err).decode("utf-8", errors="replace")
        finally:
            container.stop()
    pytest.fail(f"OPA in a container ({image}) would not start:\n{last_logs[-2000:]}")


@contextmanager
def container_server(bundle: Path) -> Iterator[Server]:
    """:func:`tests.integration.opa_servers.external_opa`'s OPA (the same flags) in a
    container: ``bundle`` mounted read-only, decision ids on."""

    def command(addr: str) -> list[str]:
        return ["run", "--server", "--addr", addr, "--bundle", "/bundle",
                "--set", "decision_logs.console=true", "--log-format", "json",
                "--skip-version-check"]  # fmt: skip

    with opa_container(command, mounts=[(bundle, "/bundle")]) as opa:
        yield Server(opa.address, opa.pid)
