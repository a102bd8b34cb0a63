"""Real OPA processes for integration tests, started the way an operator would."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from capgate.gateway.opa.binary import find_opa_binary
from capgate.gateway.policy.client import PolicyClient
from tests.hang import ANSWER_TIMEOUT, INNER_HANG_SECONDS

#: How long an OPA may take to become healthy: a hang bound (often nested in a test's).
STARTUP_SECONDS = INNER_HANG_SECONDS


@dataclass
class Server:
    """A running OPA: where to reach it and how to kill it."""

    address: str
    pid: int


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_healthy(address: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    deadline = time.monotonic() + STARTUP_SECONDS
    # A probe's own deadline is no pace either: a loaded machine may answer every probe
    # late, and one answer is all this waits for.
    with PolicyClient(address, timeout=ANSWER_TIMEOUT, connect_timeout=ANSWER_TIMEOUT) as client:
        while time.monotonic() < deadline:
            if client.health():
                return True
            if proc.poll() is not None:
                return False
            time.sleep(0.05)
    pytest.fail(f"external OPA did not become healthy:\n{log.read_text()[-2000:]}")


@contextmanager
def external_opa(bundle: Path, log: Path) -> Iterator[Server]:
    """``opa run`` on a free 127.0.0.1 port, as an operator would run a sidecar."""
    for _attempt in range(3):  # the port can be taken between probe and bind
        port = free_port()
        address = f"http://127.0.0.1:{port}"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(find_opa_binary()),
                    "run",
                    "--server",
                    "--addr",
                    f"127.0.0.1:{port}",
                    "--bundle",
                    str(bundle),
                    "--set",
                    "decision_logs.console=true",
                    "--log-format",
                    "json",
                    "--skip-version-check",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            if wait_healthy(address, proc, log):
                yield Server(address, proc.pid)
                return
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            proc.wait()
    pytest.fail(f"external OPA would not start:\n{log.read_text()[-2000:]}")
