"""capgate.gateway.opa.workdir: the per-user root, run folders, owner records and the sweep.

Everything here runs against a short temp folder private to the test (``base``), so
no test sees another test's folders or a real capgate process's. Integration tests
in tests/integration/test_opa_hygiene.py check the same rules through real OPA
processes that are killed, interrupted or left unclosed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from capgate.gateway.errors import OPAProcessError
from capgate.gateway.opa import workdir
from capgate.gateway.opa.workdir import OwnerRecord, owner_alive, private_dir, sweep, user_root

UID = os.geteuid()


@pytest.fixture
def base(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short, test-private TMPDIR (pytest's tmp_path is too long for a socket path)."""
    assert workdir.current_run_dir() is None, "an earlier test left a run folder open"
    path = Path(tempfile.mkdtemp(prefix="cg-unit-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def make_run(root: Path, pid: int, record: OwnerRecord | None, name: str = "abc") -> Path:
    folder = root / f"run-{pid}-{name}"
    folder.mkdir(mode=0o700)
    (folder / "opa-x").mkdir()
    (folder / "opa-x" / "opa.log").write_text("log\n")
    if record is not None:
        (folder / "owner").write_text(record.to_json())
    return folder


# -- the per-user root ---------------------------------------------------------------


def test_root_is_created_private(base: Path) -> None:
    root = user_root(base)
    assert root == base / f"capgate-{UID}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert user_root(base) == root, "an existing sound root is reused"


def test_root_is_private_whatever_the_umask(base: Path) -> None:
    old = os.umask(0o022)
    try:
        root = user_root(base)
    finally:
        os.umask(old)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_a_symlinked_root_is_refused(base: Path) -> None:
    elsewhere = base / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (base / f"capgate-{UID}").symlink_to(elsewhere)
    with pytest.raises(OPAProcessError, match="symbolic link") as info:
        user_root(base)
    assert str(base / f"capgate-{UID}") in str(info.value)


def test_a_root_that_is_a_file_is_refused(base: Path) -> None:
    (base / f"capgate-{UID}").write_text("")
    with pytest.raises(OPAProcessError, match="not a directory"):
        user_root(base)


def test_a_root_others_can_enter_is_refused(base: Path) -> None:
    root = base / f"capgate-{UID}"
    root.mkdir()
    root.chmod(0o755)
    with pytest.raises(OPAProcessError, match="mode is 0755"):
        user_root(base)
    assert stat.S_IMODE(root.stat().st_mode) == 0o755, "refused, not silently repaired"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_root_owned_by_another_user_is_refused(base: Path) -> None:
    root = base / f"capgate-{UID}"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(OPAProcessError, match=r"owned by uid 65534, not by you"):
        user_root(base)


def test_an_uncreatable_root_names_it(tmp_path: Path) -> None:
    with pytest.raises(OPAProcessError, match="could not create") as info:
        user_root(tmp_path / "missing")
    assert str(tmp_path / "missing" / f"capgate-{UID}") in str(info.value)


# -- owner records -------------------------------------------------------------------


def test_owner_record_of_this_process() -> None:
    record = OwnerRecord.of_this_process()
    assert record.pid == os.getpid()
    stat_fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    assert record.start == int(stat_fields[19])
    assert record.boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert record.pidns == os.readlink("/proc/self/ns/pid")
    assert OwnerRecord.from_json(record.to_json()) == record
    assert owner_alive(record)


@pytest.mark.parametrize(
    "text", ["", "{", "[]", '{"pid": 1}', '{"pid": "1", "start": 1, "boot": null, "pidns": null}']
)
def test_incomplete_owner_records_are_not_records(text: str) -> None:
    assert OwnerRecord.from_json(text) is None


def test_owner_liveness() -> None:
    me = OwnerRecord.of_this_process()
    assert me.start is not None
    assert not owner_alive(OwnerRecord(dead_pid(), me.start, me.boot, me.pidns))
    # The same pid, but another start time: the pid was reused by another process.
    assert not owner_alive(OwnerRecord(me.pid, me.start + 1, me.boot, me.pidns))
    # Written before a reboot: gone, whatever the pid is now.
    assert not owner_alive(OwnerRecord(me.pid, me.start, "another-boot", me.pidns))
    # Another pid namespace: its pid cannot be judged here, so it is left alone.
    assert owner_alive(OwnerRecord(dead_pid(), 1, me.boot, "pid:[1]"))


# -- the sweep -------------------------------------------------------------------------


def test_sweep_removes_only_folders_of_dead_owners(base: Path) -> None:
    root = user_root(base)
    me = OwnerRecord.of_this_process()
    assert me.start is not None
    gone = dead_pid()
    live = make_run(root, me.pid, me, "live")
    being_made = make_run(root, me.pid, None, "new")  # no record yet: judged by name
    other_ns = make_run(root, gone, OwnerRecord(gone, 1, me.boot, "pid:[1]"), "ns")
    dead = make_run(root, gone, OwnerRecord(gone, me.start, me.boot, me.pidns), "dead")
    dead_unrecorded = make_run(root, gone, None, "norec")
    reused = make_run(root, me.pid, OwnerRecord(me.pid, me.start + 1, me.boot, me.pidns), "re")
    rebooted = make_run(root, me.pid, OwnerRecord(me.pid, me.start, "old-boot", None), "boot")
    half_deleted = root / "dead-run-1-xyz"
    half_deleted.mkdir()
    (half_deleted / "opa.log").write_text("")
    unrelated = root / "notes"
    unrelated.mkdir()
    file_named_like_a_run = root / f"run-{gone}-file"
    file_named_like_a_run.write_text("")

    removed = sweep(root)

    assert sorted(removed) == sorted([dead, dead_unrecorded, reused, rebooted])
    assert sorted(p.name for p in root.iterdir()) == sorted(
        p.name for p in (live, being_made, other_ns, unrelated, file_named_like_a_run)
    )


def test_sweep_of_a_missing_root_does_nothing(tmp_path: Path) -> None:
    assert sweep(tmp_path / "nowhere") == []


# -- run folders and private folders ----------------------------------------------


def test_private_dirs_share_one_run_folder_that_goes_with_the_last(base: Path) -> None:
    first = private_dir("bundle")
    second = private_dir("opa")
    run = first.path.parent
    try:
        assert run == second.path.parent == workdir.current_run_dir()
        assert run.parent == base / f"capgate-{UID}"
        assert run.name.startswith(f"run-{os.getpid()}-")
        assert first.path.name.startswith("bundle-")
        assert second.path.name.startswith("opa-")
        for folder in (run, first.path, second.path):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        owner = run / "owner"
        assert stat.S_IMODE(owner.stat().st_mode) == 0o600
        assert json.loads(owner.read_text())["pid"] == os.getpid()
        assert OwnerRecord.from_json(owner.read_text()) == OwnerRecord.of_this_process()
        first.remove()
        assert not first.path.exists()
        assert run.is_dir()
        assert second.path.is_dir()
        first.remove()  # idempotent: must not release the run folder twice
        assert second.path.is_dir()
    finally:
        first.remove()
        second.remove()
    assert not run.exists()
    assert workdir.current_run_dir() is None
    assert list((base / f"capgate-{UID}").iterdir()) == []


def test_a_new_private_dir_sweeps_dead_owners(base: Path) -> None:
    root = user_root(base)
    gone = dead_pid()
    dead = make_run(root, gone, None)
    folder = private_dir("opa")
    try:
        assert not dead.exists()
    finally:
        folder.remove()


def test_a_refused_root_creates_nothing(base: Path) -> None:
    elsewhere = base / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (base / f"capgate-{UID}").symlink_to(elsewhere)
    with pytest.raises(OPAProcessError, match="symbolic link"):
        private_dir("opa")
    assert list(elsewhere.iterdir()) == []
    assert workdir.current_run_dir() is None


def test_a_long_tmpdir_falls_back_to_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    assert workdir.current_run_dir() is None
    long_base = Path(tempfile.mkdtemp(prefix="cg-" + "x" * 60 + "-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(long_base))
    folder = private_dir("opa")
    try:
        assert folder.path.parent.parent == Path(f"/tmp/capgate-{UID}")
        assert len(os.fsencode(folder.path / "opa.sock")) <= workdir.MAX_SOCKET_PATH
        assert list(long_base.iterdir()) == []
    finally:
        folder.remove()
        shutil.rmtree(long_base)
    assert not folder.path.parent.exists()


def test_a_forked_child_does_not_remove_its_parents_folder(base: Path) -> None:
    folder = private_dir("opa")
    try:
        pid = os.fork()
        if pid == 0:  # the child: remove() must not touch the parent's folder
            folder.remove()
            code = 0 if workdir.current_run_dir() is None else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert folder.path.is_dir()
    finally:
        folder.remove()


# -- write errors ------------------------------------------------------------------


def test_write_errors_name_the_folder(tmp_path: Path) -> None:
    with (
        pytest.raises(OPAProcessError, match="No space left on device") as info,
        workdir.write_errors(tmp_path, "the policy bundle"),
    ):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert f"could not write the policy bundle to {tmp_path}" in str(info.value)
    assert "set TMPDIR" in str(info.value)


def test_write_errors_inside_the_folder_are_translated(tmp_path: Path) -> None:
    with (
        pytest.raises(OPAProcessError, match=str(tmp_path)),
        workdir.write_errors(tmp_path, "the policy bundle"),
    ):
        (tmp_path / "missing" / "file").write_text("")


def test_other_errors_keep_their_own_message(tmp_path: Path) -> None:
    with (
        pytest.raises(FileNotFoundError, match="policies directory not found"),
        workdir.write_errors(tmp_path / "bundle", "the policy bundle"),
    ):
        raise FileNotFoundError("policies directory not found: /nowhere")
