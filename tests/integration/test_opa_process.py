"""EmbeddedOPA against the real OPA binary: start, stop, and never leave one behind.

Uses a throwaway bundle written per test, not the project's policies, so these tests
check the process handling alone. The orphan tests run a child Python that owns the
OPA (OPA is then our grandchild), interrupt or kill that child, and check that the
OPA pid is gone or a zombie (dead, waiting for init to reap it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capgate.gateway.errors import OPAProcessError, PolicyUnavailable
from capgate.gateway.opa.process import EmbeddedOPA
from capgate.gateway.policy.client import PolicyClient
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS, INNER_HANG_SECONDS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "0" * 64
#: How long an OPA that must start may take to: a hang bound, not EmbeddedOPA's 15 s.
STARTUP = INNER_HANG_SECONDS
SECRET = "tenant-secret-7d1e"


def write_bundle(root: Path, compose_rego: str | None = None) -> Path:
    """A minimal bundle: fixed compose and execute decisions and a catalogue digest."""
    bundle = root / "bundle"
    (bundle / "capgate" / "compose").mkdir(parents=True)
    (bundle / "capgate" / "execute").mkdir(parents=True)
    (bundle / "capgate" / "catalogue" / "meta").mkdir(parents=True)
    (bundle / ".manifest").write_text(json.dumps({"roots": ["capgate"]}))
    (bundle / "capgate" / "compose" / "compose.rego").write_text(
        compose_rego
        or textwrap.dedent("""\
            package capgate.compose

            decision := {"visible": [], "excluded": {}}
            """)
    )
    (bundle / "capgate" / "execute" / "execute.rego").write_text(
        textwrap.dedent("""\
            package capgate.execute

            decision := {
            \t"allow": false,
            \t"reasons": [{"code": "test_deny", "message": "the test bundle denies all"}],
            \t"obligations": [],
            }
            """)
    )
    (bundle / "capgate" / "catalogue" / "meta" / "data.json").write_text(
        json.dumps({"digest": DIGEST})
    )
    return bundle


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(tmp_path)


@pytest.fixture
def opa(bundle: Path) -> Iterator[EmbeddedOPA]:
    with EmbeddedOPA(bundle, startup_timeout=STARTUP) as process:
        yield process


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped) counts as gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    state = next((ln for ln in status.splitlines() if ln.startswith("State:")), "")
    return not state.split(":", 1)[1].strip().startswith(("Z", "X")) if state else False


def wait_gone(pid: int, seconds: float = INNER_HANG_SECONDS) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.05)
    return not is_alive(pid)


# -- lifecycle ---------------------------------------------------------------------


def test_start_serves_the_bundle_on_a_private_socket(opa: EmbeddedOPA) -> None:
    assert opa.running
    assert opa.address == f"unix://{opa.socket_path}"
    private = opa.socket_path.parent
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(opa.socket_path.stat().st_mode)
    assert stat.S_IMODE(opa.socket_path.stat().st_mode) == 0o600
    assert opa.log_path.parent == private
    with PolicyClient(opa.address, timeout=ANSWER_TIMEOUT) as client:
        assert client.health(bundles=True)
        assert client.catalogue_digest() == DIGEST
        decision = client.query("capgate/compose/decision", {})
    assert decision[0] == {"visible": [], "excluded": {}}
    assert decision[1], "decision_logs.console=true makes OPA return a decision_id"


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets ``pid`` holds open (fds may close while we look)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    return inodes


def test_opa_listens_on_no_tcp_port(opa: EmbeddedOPA) -> None:
    inodes = socket_inodes(opa.pid)
    listening_tcp: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                listening_tcp.append(fields[1])
    assert inodes, "OPA holds at least its unix listener"
    assert listening_tcp == []


def test_decisions_get_ids_but_leave_nothing_in_opas_log(opa: EmbeddedOPA) -> None:
    with PolicyClient(opa.address, timeout=ANSWER_TIMEOUT) as client:
        ids = [client.query("capgate/compose/decision", {"tenant": SECRET})[1] for _ in range(3)]
        assert client.health()
    assert all(ids)
    assert len(set(ids)) == 3
    # Console decision logs are written as the decision is made; give a slow machine
    # a moment, then check that neither the ids nor the facts reached the file.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        log = opa.log_path.read_text()
        assert SECRET not in log
        assert not any(i in log for i in ids)
        time.sleep(0.1)


def test_stop_ends_opa_removes_the_directory_and_is_idempotent(bundle: Path) -> None:
    opa = EmbeddedOPA(bundle, startup_timeout=STARTUP).start()
    pid, private = opa.pid, opa.socket_path.parent
    address = opa.address
    opa.stop()
    assert not is_alive(pid)
    assert not private.exists()
    assert not opa.running
    opa.stop()
    with pytest.raises(OPAProcessError):
        _ = opa.pid
    with PolicyClient(address) as client, pytest.raises(PolicyUnavailable):
        client.query("capgate/compose/decision", {})


def test_start_twice_is_one_process(opa: EmbeddedOPA) -> None:
    pid = opa.pid
    assert opa.start() is opa
    assert opa.pid == pid


STUBBORN_OPA = """\
import http.server, signal, socketserver, sys

if sys.argv[1:] == ["version"]:
    print("Version: 1.22.4")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = sys.argv[sys.argv.index("--addr") + 1].removeprefix("unix://")


class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


socketserver.UnixStreamServer(path, Ok).serve_forever()
"""


def test_stop_kills_an_opa_that_ignores_sigterm(bundle: Path, tmp_path: Path) -> None:
    # OPA itself always honours SIGTERM (Go re-enables an inherited SIG_IGN), so a
    # stand-in that answers /health and ignores SIGTERM exercises the SIGKILL path.
    stubborn = tmp_path / "stubborn-opa"
    stubborn.write_text(f"#!{sys.executable}\n{STUBBORN_OPA}")
    stubborn.chmod(0o755)
    opa = EmbeddedOPA(bundle, opa_binary=stubborn, startup_timeout=STARTUP).start()
    pid = opa.pid
    started = time.monotonic()
    opa.stop()
    assert time.monotonic() - started >= 4.5, "SIGTERM was ignored, so stop waited 5 s"
    assert not is_alive(pid)


# -- failures to start ---------------------------------------------------------


def test_rego_syntax_error_reports_opas_message(tmp_path: Path) -> None:
    bad = write_bundle(tmp_path, compose_rego="package capgate.compose\n\ndecision := {\n")
    opa = EmbeddedOPA(bad)
    with pytest.raises(OPAProcessError) as info:
        opa.start()
    message = str(info.value)
    assert "rego_parse_error" in message
    assert "compose.rego" in message
    assert not opa.running


def test_bundle_without_roots_is_explained(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path)
    (bundle / ".manifest").unlink()
    with pytest.raises(OPAProcessError, match="overlapping roots") as info:
        EmbeddedOPA(bundle).start()
    assert "hint: the policy bundle must list its roots" in str(info.value)


def test_missing_bundle(tmp_path: Path) -> None:
    with pytest.raises(OPAProcessError, match="does not exist"):
        EmbeddedOPA(tmp_path / "nowhere").start()


def test_startup_timeout_reports_and_cleans_up(bundle: Path, tmp_path: Path) -> None:
    sleeper = tmp_path / "sleepy-opa"
    sleeper.write_text(
        "#!/bin/sh\n[ \"$1\" = version ] && echo 'Version: 1.22.4' && exit 0\n"
        "echo 'pretending to be OPA'\nexec sleep 60\n"
    )
    sleeper.chmod(0o755)
    opa = EmbeddedOPA(bundle, opa_binary=sleeper, startup_timeout=1.0)
    with pytest.raises(OPAProcessError, match=r"within 1s") as info:
        opa.start()
    assert "pretending to be OPA" in str(info.value)
    assert not opa.running


def test_missing_explicit_binary(bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(OPAProcessError, match="not an executable"):
        EmbeddedOPA(bundle, opa_binary=tmp_path / "no-opa").start()


def test_binary_that_cannot_run(bundle: Path, tmp_path: Path) -> None:
    not_a_program = tmp_path / "opa"
    not_a_program.write_bytes(b"\x00\x01 not an executable format")
    not_a_program.chmod(0o755)
    with pytest.raises(OPAProcessError, match="could not run"):
        EmbeddedOPA(bundle, opa_binary=not_a_program).start()


# -- no orphans ------------------------------------------------------------------

#: Put first in a child script that a test stops with SIGINT. Python turns SIGINT
#: into KeyboardInterrupt only if SIGINT was not ignored when it started, and a test
#: run started in the background (a shell's ``&``, nohup) passes it on ignored.
CTRL_C_AS_AT_A_TERMINAL = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
)

CHILD = CTRL_C_AS_AT_A_TERMINAL + textwrap.dedent(f"""\
    import sys, time
    from pathlib import Path
    from capgate.gateway.opa.process import EmbeddedOPA

    with EmbeddedOPA(Path(sys.argv[1]), startup_timeout={STARTUP}) as opa:
        print(opa.pid, opa.socket_path.parent, flush=True)
        time.sleep({HANG_SECONDS})  # until the test stops it
    """)


def start_owner(bundle: Path) -> tuple[subprocess.Popen[str], int, Path]:
    """A child Python that starts OPA in a ``with`` block; returns it, OPA's pid and dir."""
    owner = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(bundle)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert owner.stdout is not None
    line = owner.stdout.readline()  # blocks until OPA is healthy (or the child died)
    if not line:
        owner.kill()
        owner.wait()
        pytest.fail(f"child exited ({owner.returncode}) before starting OPA")
    pid, directory = line.split()
    return owner, int(pid), Path(directory)


def test_ctrl_c_in_the_owner_stops_opa(bundle: Path) -> None:
    owner, opa_pid, directory = start_owner(bundle)
    try:
        assert is_alive(opa_pid)
        owner.send_signal(signal.SIGINT)
        owner.wait(timeout=HANG_SECONDS)
        assert wait_gone(opa_pid), "OPA outlived a Ctrl-C of its owner"
        assert not directory.exists(), "the with block removed the private directory"
    finally:
        owner.kill()
        owner.wait()
        assert owner.stdout is not None
        owner.stdout.close()


def test_kill_9_of_the_owner_still_stops_opa(bundle: Path) -> None:
    owner, opa_pid, directory = start_owner(bundle)
    try:
        assert is_alive(opa_pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=HANG_SECONDS)
        assert wait_gone(opa_pid), "OPA outlived kill -9 of its owner (PR_SET_PDEATHSIG)"
    finally:
        owner.kill()
        owner.wait()
        assert owner.stdout is not None
        owner.stdout.close()
        # No Python code ran in the owner, so its run folder (the parent of OPA's) is
        # left for the next capgate start to sweep (test_opa_hygiene.py checks that);
        # remove it now so that this test leaves nothing either way.
        shutil.rmtree(directory.parent, ignore_errors=True)
