"""What the embedded OPA can see and what capgate leaves on disk (issue #6, fail closed).

- **Environment**: a policy reads OPA's environment through ``opa.runtime().env``,
  so OPA must get only the documented minimal set, never the host's secrets.
- **Folders**: whatever way a capgate process ends (closed, never closed, SIGTERM,
  SIGKILL, Ctrl-C during startup), its temp folders are gone at exit or at the
  next start of another capgate process, and a live process's are never touched.
- **Disk full**: a start that cannot write its folders fails with OPAProcessError
  naming the folder, leaves nothing, starts no OPA and runs no tool.
- **Other users**: can neither read OPA's log nor connect to its socket.

Tests that look at folders give capgate a short TMPDIR of their own (pytest's
tmp_path is too long for a socket path, and capgate would fall back to /tmp), so no
test sees another test's folders. Lifecycle tests run capgate in child processes,
since what is checked is what a process leaves behind when it ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capgate.gateway.opa.policies import locate_policies
from capgate.gateway.opa.process import EmbeddedOPA
from capgate.gateway.policy.client import PolicyClient
from tests.hang import ANSWER_TIMEOUT, HANG_SECONDS
from tests.integration.test_opa_process import (
    CTRL_C_AS_AT_A_TERMINAL,
    STARTUP,
    is_alive,
    wait_gone,
    write_bundle,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
UID = os.geteuid()
SECRETS = {
    "CAPGATE_TEST_SECRET": "capgate-test-secret-4b9f",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "DATABASE_URL": "postgres://app:hunter2@db.internal/app",
}
PROBE_REGO = """\
package capgate.probe

env := opa.runtime().env
"""


@pytest.fixture
def tmpdir_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short TMPDIR private to this test, for this process and its children."""
    path = Path(tempfile.mkdtemp(prefix="cg-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(tmp_path)


@pytest.fixture
def probe_bundle(tmp_path: Path) -> Path:
    """The test bundle plus ``capgate.probe.env``: all a policy can see of OPA's env."""
    bundle = write_bundle(tmp_path)
    (bundle / "capgate" / "probe").mkdir()
    (bundle / "capgate" / "probe" / "probe.rego").write_text(PROBE_REGO)
    return bundle


def leftovers(tmpdir: Path) -> list[str]:
    """Everything under ``tmpdir`` except capgate's per-user root folder itself."""
    return sorted(
        str(path.relative_to(tmpdir))
        for path in tmpdir.rglob("*")
        if path != tmpdir / f"capgate-{UID}"
    )


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if item)


def mode_of(path: Path) -> int | None:
    """Permission bits of ``path``, None if it does not exist."""
    try:
        return stat.S_IMODE(path.lstat().st_mode)
    except FileNotFoundError:
        return None


def minimal_env(opa_dir: Path) -> dict[str, str]:
    """The documented environment of the embedded OPA (gateway/opa/process.py)."""
    return {"HOME": str(opa_dir / "home"), "TMPDIR": str(opa_dir / "tmp")}


# -- 1. the environment ----------------------------------------------------------


def test_policies_see_only_the_minimal_environment(
    probe_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    with (
        EmbeddedOPA(probe_bundle, startup_timeout=STARTUP) as opa,
        PolicyClient(opa.address, timeout=ANSWER_TIMEOUT) as client,
    ):
        seen, _ = client.query("capgate/probe/env", {})
        in_proc = environ_of(opa.pid)
        expected = minimal_env(opa.socket_path.parent)
        modes = {name: mode_of(Path(path)) for name, path in seen.items()}
    for name, value in SECRETS.items():
        assert name not in seen
        assert value not in json.dumps(seen)
        assert name not in in_proc
    assert seen == expected
    assert in_proc == expected
    assert modes == {"HOME": 0o700, "TMPDIR": 0o700}, "private folders, made for OPA"


def test_env_adds_exactly_what_the_caller_passes(
    probe_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOMAXPROCS", "7")  # set here too: only the argument may pass it
    with (
        EmbeddedOPA(
            probe_bundle,
            env={"GOMAXPROCS": "2", "CAPGATE_TEST_FLAG": "on"},
            startup_timeout=STARTUP,
        ) as opa,
        PolicyClient(opa.address, timeout=ANSWER_TIMEOUT) as client,
    ):
        seen, _ = client.query("capgate/probe/env", {})
        expected = {
            **minimal_env(opa.socket_path.parent),
            "GOMAXPROCS": "2",
            "CAPGATE_TEST_FLAG": "on",
        }
        assert seen == expected
        assert environ_of(opa.pid) == expected
        assert opa.environment == expected


@pytest.mark.parametrize(
    "env",
    [{"HOME": "/root"}, {"TMPDIR": "/tmp"}, {"": "x"}, {"A=B": "x"}, {"A": "x\0y"}],
    ids=["HOME", "TMPDIR", "empty-name", "equals-in-name", "nul-in-value"],
)
def test_env_cannot_move_opas_folders_or_be_malformed(bundle: Path, env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="env"):
        EmbeddedOPA(bundle, env=env)


def test_the_sidecars_opa_sees_only_the_minimal_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sales_catalogue: Any
) -> None:
    from capgate.gateway.opa.sidecar import PolicySidecar

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    policies = tmp_path / "policies"
    shutil.copytree(locate_policies().path, policies)
    (policies / "capgate" / "probe").mkdir()
    (policies / "capgate" / "probe" / "probe.rego").write_text(PROBE_REGO)
    with PolicySidecar(
        sales_catalogue, timeout=ANSWER_TIMEOUT, policies_dir=policies, opa_env={"GOMAXPROCS": "1"}
    ) as sidecar:
        assert sidecar.process is not None
        with PolicyClient(sidecar.process.address, timeout=ANSWER_TIMEOUT) as client:
            seen, _ = client.query("capgate/probe/env", {})
        expected = {**minimal_env(sidecar.process.socket_path.parent), "GOMAXPROCS": "1"}
        assert seen == expected
        assert environ_of(sidecar.process.pid) == expected


# -- 2. folders: layout, modes, other users -----------------------------------------


def test_layout_and_modes(bundle: Path, tmpdir_env: Path) -> None:
    with EmbeddedOPA(bundle, startup_timeout=STARTUP) as opa:
        opa_dir = opa.socket_path.parent
        run = opa_dir.parent
        root = run.parent
        assert root == tmpdir_env / f"capgate-{UID}"
        assert re.fullmatch(rf"run-{os.getpid()}-\w+", run.name)
        assert re.fullmatch(r"opa-\w+", opa_dir.name)
        for folder in (root, run, opa_dir):
            assert stat.S_IMODE(folder.lstat().st_mode) == 0o700, folder
        for private in (opa.socket_path, opa.log_path, run / "owner"):
            assert stat.S_IMODE(private.lstat().st_mode) == 0o600, private
        record = json.loads((run / "owner").read_text())
        start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        assert (record["pid"], record["start"]) == (os.getpid(), start)
    assert leftovers(tmpdir_env) == []


PEEK = textwrap.dedent("""\
    import socket, sys
    results = []
    try:
        open(sys.argv[1], "rb").close()
        results.append("read log")
    except OSError as exc:
        results.append(type(exc).__name__)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(sys.argv[2])
        results.append("connected")
    except OSError as exc:
        results.append(type(exc).__name__)
    print(" ".join(results))
    """)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_other_users_can_neither_read_the_log_nor_connect(bundle: Path, tmpdir_env: Path) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that another user may run")
    with EmbeddedOPA(bundle, startup_timeout=STARTUP) as opa:
        args = [python, "-I", "-c", PEEK, str(opa.log_path), str(opa.socket_path)]

        def peek(**kwargs: Any) -> str:
            done = subprocess.run(args, capture_output=True, text=True, check=True, **kwargs)
            return done.stdout.strip()

        assert peek() == "read log connected", "the owner can (so the probe works)"
        assert peek(user=65534, group=65534, extra_groups=[]) == ("PermissionError PermissionError")


# -- 2. folders: however a process ends ----------------------------------------------

OWNER = CTRL_C_AS_AT_A_TERMINAL + textwrap.dedent(f"""\
    import json, sys, time
    from pathlib import Path

    what, then = sys.argv[1], sys.argv[2]
    if what == "sidecar":
        from capgate.demo import demo_catalogue_dir
        from capgate.gateway.catalogue import load_catalogue
        from capgate.gateway.opa.sidecar import PolicySidecar

        owner = PolicySidecar(load_catalogue(demo_catalogue_dir("sales")), timeout={ANSWER_TIMEOUT})
        opa, finish = owner.process, owner.close
    else:
        from capgate.gateway.opa.process import EmbeddedOPA

        opa = EmbeddedOPA(Path(sys.argv[3]), startup_timeout={STARTUP}).start()
        finish = opa.stop
    print(json.dumps({{"pid": opa.pid, "dir": str(opa.socket_path.parent),
                       "address": opa.address}}), flush=True)
    if then == "sleep":
        time.sleep({HANG_SECONDS})  # until the test ends it
    elif then == "close":
        finish()
    # "exit": end without closing anything
    """)


class Owner:
    """A child Python that starts an OPA (alone or in a PolicySidecar) and reports it."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until OPA is healthy
        if not line:
            self.close()
            pytest.fail(f"owner exited ({self.proc.returncode}) before starting OPA")
        info = json.loads(line)
        self.opa_pid: int = info["pid"]
        self.opa_dir = Path(info["dir"])
        self.address: str = info["address"]

    def end(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=HANG_SECONDS)  # its status is asserted

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=HANG_SECONDS)  # reap, and close both pipes


def start_and_stop_another(bundle: Path) -> None:
    """What the next capgate start does, in another process."""
    subprocess.run(
        [sys.executable, "-c", OWNER, "embedded", "close", str(bundle)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=HANG_SECONDS,
    )


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_owners_folders_go_at_the_next_start(
    sig: signal.Signals, bundle: Path, tmpdir_env: Path
) -> None:
    owner = Owner("sidecar", "sleep")
    try:
        assert owner.opa_dir.is_relative_to(tmpdir_env)
        assert owner.end(sig) == -sig
        assert wait_gone(owner.opa_pid), "OPA outlived its killed owner (PR_SET_PDEATHSIG)"
    finally:
        owner.close()
    assert leftovers(tmpdir_env) != [], "a killed process runs no cleanup of its own"
    start_and_stop_another(bundle)
    assert leftovers(tmpdir_env) == []


def test_an_unclosed_sidecar_is_removed_at_exit(tmpdir_env: Path) -> None:
    owner = Owner("sidecar", "exit")
    try:
        assert owner.opa_dir.is_relative_to(tmpdir_env)
        assert owner.proc.wait(timeout=HANG_SECONDS) == 0
        assert wait_gone(owner.opa_pid)
    finally:
        owner.close()
    assert leftovers(tmpdir_env) == []


def test_live_owners_folders_are_never_swept(bundle: Path, tmpdir_env: Path) -> None:
    owners: list[Owner] = []
    try:
        owners.append(Owner("embedded", "sleep", str(bundle)))
        owners.append(Owner("sidecar", "sleep"))
        before = leftovers(tmpdir_env)
        start_and_stop_another(bundle)
        assert leftovers(tmpdir_env) == before
        for owner in owners:
            assert owner.opa_dir.is_relative_to(tmpdir_env)
            assert is_alive(owner.opa_pid)
            with PolicyClient(owner.address, timeout=ANSWER_TIMEOUT) as client:
                assert client.health()
        for owner in owners:  # Ctrl-C: the owners clean up themselves
            assert owner.end(signal.SIGINT) != 0
            assert wait_gone(owner.opa_pid)
    finally:
        for owner in owners:
            owner.close()
    assert leftovers(tmpdir_env) == []


SLOW_OPA = """\
#!/bin/sh
[ "$1" = version ] && echo 'Version: 1.22.4' && exit 0
echo "pretending to be OPA, pid $$"
exec sleep 60
"""

STARTING = CTRL_C_AS_AT_A_TERMINAL + textwrap.dedent("""\
    import sys
    from pathlib import Path
    from capgate.demo import demo_catalogue_dir
    from capgate.gateway.catalogue import load_catalogue
    from capgate.gateway.opa.sidecar import PolicySidecar

    PolicySidecar(load_catalogue(demo_catalogue_dir("sales")), opa_binary=Path(sys.argv[1]))
    """)


def test_ctrl_c_during_startup_leaves_nothing(tmp_path: Path, tmpdir_env: Path) -> None:
    slow = tmp_path / "slow-opa"
    slow.write_text(SLOW_OPA)
    slow.chmod(0o755)
    owner = subprocess.Popen(
        [sys.executable, "-c", STARTING, str(slow)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + HANG_SECONDS
        started = None
        while started is None and time.monotonic() < deadline and owner.poll() is None:
            try:
                for log in tmpdir_env.rglob("opa.log"):
                    started = re.search(r"pretending to be OPA, pid (\d+)", log.read_text())
            except FileNotFoundError:
                pass  # a folder went while walked (the bundle's temporary one is renamed)
            time.sleep(0.05)
        assert started is not None, "the stand-in OPA never started"
        owner.send_signal(signal.SIGINT)
        owner.wait(timeout=HANG_SECONDS)  # its status is asserted
    finally:
        if owner.poll() is None:
            owner.kill()
        _, stderr = owner.communicate(timeout=HANG_SECONDS)
    assert owner.returncode != 0
    assert "KeyboardInterrupt" in stderr
    assert wait_gone(int(started[1])), "stop() during startup ended the OPA process"
    assert leftovers(tmpdir_env) == []


# -- 3. disk full ---------------------------------------------------------------------

DISK_FULL = textwrap.dedent("""\
    import json, os, resource, signal, sys
    from pathlib import Path

    from capgate.adapters.tools.in_process import InProcessTools
    from capgate.demo import demo_catalogue_dir
    from capgate import AgentSession, ComposeInput, Dispatcher, ToolRegistry, load_catalogue
    from capgate.gateway.errors import CapgateError, PolicyUnavailable
    from capgate.gateway.opa.process import EmbeddedOPA
    from capgate.gateway.opa.sidecar import PolicySidecar

    what, limit, free = sys.argv[1], sys.argv[2], sys.argv[3]
    catalogue = load_catalogue(demo_catalogue_dir("sales"))
    calls = []
    tools = InProcessTools()
    tools.register("contact.read", "Read one CRM contact.",
                   lambda contact_id: calls.append(contact_id) or {
                       "contact_id": contact_id, "name": "Ada", "email": "ada@example.test"})
    facts = ComposeInput.model_validate({
        "principal": {"agent": "sales-bot", "role": "sales", "tenant": "acme"},
        "task": {"type": "customer_quote",
                 "linked_resources": [{"type": "contact", "id": "c-42"}]},
        "connections": {"crm": "active"},
        "environment": "production",
        "budget_class": "standard",
    })
    tmp = Path(os.environ["TMPDIR"])
    if free != "-":  # fill the (tmpfs) TMPDIR, then free this many bytes
        filler = tmp / "filler"
        with open(filler, "wb") as handle:
            try:
                while True:
                    handle.write(b"\\0" * 65536)
                    handle.flush()
            except OSError:
                pass
        os.truncate(filler, max(0, filler.stat().st_size - int(free)))
    if limit != "-":  # every file this process writes is cut at `limit` bytes
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))

    result = {"raised": None}
    try:
        if what == "sidecar":
            with PolicySidecar(catalogue, timeout=ANSWER_TIMEOUT) as sidecar:
                session = AgentSession(Dispatcher(catalogue, sidecar.client,
                                                  ToolRegistry(tools)), facts)
                session.call_tool("contact.read", contact_id="c-42")
        else:
            with EmbeddedOPA(Path(sys.argv[4])):
                pass
    except CapgateError as exc:
        result = {"raised": type(exc).__name__, "code": exc.code, "message": str(exc),
                  "fails_closed": isinstance(exc, PolicyUnavailable)}
    result["tool_calls"] = len(calls)
    result["children"] = open(f"/proc/self/task/{os.getpid()}/children").read().split()
    result["left"] = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")
                            if p.name != "filler" and p != tmp / f"capgate-{os.geteuid()}")
    print(json.dumps(result))
    """).replace("ANSWER_TIMEOUT", str(ANSWER_TIMEOUT))


def check_disk_full(result: dict[str, Any], tmpdir: Path, folder: str) -> None:
    """The start failed closed, named the folder it could not write, left nothing."""
    assert result["raised"] == "OPAProcessError", result
    assert result["code"] == "opa_process_failed"
    assert result["fails_closed"], "OPAProcessError is a PolicyUnavailable"
    named = re.escape(str(tmpdir / f"capgate-{UID}")) + folder
    assert re.search(rf"could not write .* to {named}:", result["message"]), result["message"]
    assert result["tool_calls"] == 0
    assert result["children"] == [], "no OPA was left running"
    assert result["left"] == []


@pytest.mark.parametrize(
    ("what", "limit", "folder"),
    [
        # Nothing can be written: not even the run folder's owner record.
        ("sidecar", 0, r"/run-\d+-\w+"),
        # The owner record fits (about 110 bytes), the first policy file does not.
        ("sidecar", 200, r"/run-\d+-\w+/bundle-\w+"),
        # OPA's folder: its generated drop.rego (258 bytes) does not fit.
        ("embedded", 200, r"/run-\d+-\w+/opa-\w+"),
    ],
    ids=["nothing-fits", "bundle-does-not-fit", "opa-files-do-not-fit"],
)
def test_a_full_disk_fails_closed_naming_the_folder(
    what: str, limit: int, folder: str, bundle: Path, tmpdir_env: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DISK_FULL, what, str(limit), "-", str(bundle)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    check_disk_full(json.loads(done.stdout), tmpdir_env, folder)
    assert leftovers(tmpdir_env) == []


def can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "none", "/mnt"],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and unshare to mount a tmpfs")
@pytest.mark.parametrize(
    ("free", "folder"),
    [(0, r"/run-\d+-\w+"), (8192, r"/run-\d+-\w+/bundle-\w+")],
    ids=["full", "two-pages-free"],
)
def test_a_full_tmpfs_fails_closed_naming_the_folder(
    free: int, folder: str, bundle: Path, tmpdir_env: Path
) -> None:
    # A real full file system (ENOSPC), mounted over the test's TMPDIR in a private
    # mount namespace: it vanishes with the child, so the child reports what is left.
    done = subprocess.run(
        [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=1m capgate-test "$0" && exec "$@"', str(tmpdir_env),
            sys.executable, "-c", DISK_FULL, "sidecar", "-", str(free), str(bundle),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    check_disk_full(result, tmpdir_env, folder)
    assert "No space left on device" in result["message"]
