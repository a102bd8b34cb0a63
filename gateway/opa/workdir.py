"""capgate's private temporary folders: one per process, gone however the process ends.

Why: the embedded OPA's folder holds its socket (whoever can connect can ask for
decisions and read the catalogue) and its log, and the bundle folder holds the
compiled catalogue. Left behind by a crashed or killed process, they pile up in the
temp folder and keep that data on disk. So everything one capgate process writes
lives in one *run folder* that is removed when the process is done with it, and
that the next capgate start of the same user removes if the process died first.

Layout (``$TMPDIR`` if set and a directory, else Python's temp folder)::

    $TMPDIR/capgate-<uid>/              per-user root, 0700, owned by the user; kept
        run-<pid>-<random>/             this process's run folder, 0700
            owner                       owner record (JSON, 0600): pid, start time,
                                        boot id, pid namespace
            bundle-<random>/bundle/     a PolicySidecar's policy bundle
            opa-<random>/               an EmbeddedOPA: opa.sock (0600), opa.log
                                        (0600), home/ and tmp/ (its HOME and TMPDIR,
                                        0700), the bundle that drops decision logs

Rules:

- **The root is checked, never trusted.** It is created 0700; an existing root
  that is a symbolic link, not a directory, owned by another user, or open to the
  group or others is refused with :class:`~capgate.gateway.errors.OPAProcessError` (in a
  shared ``/tmp`` anyone can create ``capgate-<uid>`` first, to read or replace
  what capgate writes). The root itself stays: removing it would race with other
  processes of the same user creating their run folders in it.
- **Short enough for a socket.** A unix socket path must fit in ``sun_path`` (108
  bytes on Linux, 104 on macOS); if the OPA socket would be longer than
  :data:`MAX_SOCKET_PATH` under ``$TMPDIR`` (long on macOS and CI runners), the
  root is ``/tmp/capgate-<uid>`` instead.
- **Removed when done.** :func:`private_dir` hands out folders inside the run
  folder; when the last one is removed the run folder goes too, and an ``atexit``
  hook removes it when the interpreter exits with folders still handed out (a
  PolicySidecar never closed).
- **Swept when the owner died.** A process killed by a signal (SIGKILL, or SIGTERM
  with Python's default handling) runs no Python code. Every call to
  :func:`private_dir` therefore sweeps the root: a run folder is removed when the
  process named by its owner record is gone (no such pid, a zombie, or a pid
  reused by a process with another start time, from ``/proc/<pid>/stat``), or when
  the record is from an earlier boot. A folder whose record is from another pid
  namespace (another container sharing the temp folder) is left alone: its pid
  means nothing here. A folder with no readable record yet (being created) is
  judged by the pid in its name alone, so a live process's folder is never swept.
- **Failures are capgate errors.** Any failure to create or write these folders
  (disk or quota full, read-only file system, a refused root) raises
  ``OPAProcessError`` naming the folder, after removing whatever was made, so no
  OPA starts and no tool can run.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from capgate.gateway.errors import OPAProcessError

__all__ = [
    "MAX_SOCKET_PATH",
    "OwnerRecord",
    "PrivateDir",
    "current_run_dir",
    "owner_alive",
    "private_dir",
    "sweep",
    "user_root",
    "write_errors",
]

log = logging.getLogger("capgate.opa.workdir")

#: The longest unix socket path capgate creates, in bytes. ``sun_path`` holds 108
#: bytes on Linux and 104 on macOS, the terminating NUL included.
MAX_SOCKET_PATH: Final = 100
#: Where capgate's root goes when the socket would not fit under ``$TMPDIR``.
_FALLBACK_BASE: Final = Path("/tmp")  # noqa: S108 - checked like any other root
#: The deepest path under a run folder: the embedded OPA's socket
#: (``opa-<8 random>/opa.sock``, see gateway.opa.process).
_DEEPEST_UNDER_RUN: Final = len("/opa-XXXXXXXX/opa.sock")
_RANDOM_CHARS: Final = 8  # what tempfile.mkdtemp appends
_OWNER_FILE: Final = "owner"
_RUN_RE: Final = re.compile(r"^run-(\d+)-[a-z0-9_]+$")
# Errors that mean "this folder cannot take the data", whichever file was written.
_STORAGE_ERRNOS: Final = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}
)


# -- who owns a run folder ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """What identifies a process beyond its pid, which the kernel reuses.

    ``start`` is field 22 of ``/proc/<pid>/stat`` (clock ticks after boot), ``boot``
    the kernel's boot id and ``pidns`` the pid namespace; each is None where the
    platform does not say (then only the pid is compared).
    """

    pid: int
    start: int | None
    boot: str | None
    pidns: str | None

    @classmethod
    def of_this_process(cls) -> OwnerRecord:
        pid = os.getpid()
        found = _proc_stat(pid)
        return cls(pid, found[1] if found else None, _boot_id(), _pid_namespace())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def from_json(cls, text: str) -> OwnerRecord | None:
        """The record, or None for anything that is not a complete one."""
        try:
            data = json.loads(text)
            record = cls(data["pid"], data["start"], data["boot"], data["pidns"])
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(record.pid, int) or not (
            record.start is None or isinstance(record.start, int)
        ):
            return None
        return record


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time)`` of ``pid`` from /proc, or None if there is no such process."""
    text = _read_text(f"/proc/{pid}/stat")
    if text is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = text.rsplit(")", 1)[-1].split()
    return fields[0], int(fields[19])  # fields 3 (state) and 22 (starttime)


def _boot_id() -> str | None:
    text = _read_text("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _pid_exists(pid: int) -> bool:
    """For systems without /proc: does any process have this pid?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(record: OwnerRecord) -> bool:
    """True unless the process that wrote ``record`` is certainly gone."""
    here = OwnerRecord.of_this_process()
    if record.boot is not None and here.boot is not None and record.boot != here.boot:
        return False  # written before a reboot: every process of that boot is gone
    if record.pidns is not None and here.pidns is not None and record.pidns != here.pidns:
        return True  # another pid namespace: its pids cannot be checked from here
    if here.start is None:  # no /proc
        return _pid_exists(record.pid)
    found = _proc_stat(record.pid)
    if found is None:
        return False
    state, start = found
    if state in ("Z", "X"):  # dead, waiting to be reaped: it runs no more code
        return False
    return record.start is None or start == record.start


def _run_folder_alive(folder: Path) -> bool:
    match = _RUN_RE.match(folder.name)
    if match is None:  # pragma: no cover - sweep() only passes matching names
        return True
    text = _read_text(str(folder / _OWNER_FILE))
    record = OwnerRecord.from_json(text) if text is not None else None
    if record is None or record.pid != int(match[1]):
        # Still being created (no record yet), or a record we cannot read: judge by
        # the pid in the name alone, so that a live owner is never swept.
        record = OwnerRecord(int(match[1]), None, None, None)
    return owner_alive(record)


# -- the per-user root ------------------------------------------------------------


def _refuse(root: Path, why: str) -> OPAProcessError:
    return OPAProcessError(
        f"refusing to use {root} for capgate's private files: {why}. Remove it, or set "
        "TMPDIR to a folder only you can write"
    )


def user_root(base: Path) -> Path:
    """``base/capgate-<uid>``, created 0700 if missing, checked if present.

    Raises OPAProcessError for a root that anyone else could read, write or have
    swapped (see the module docstring), or that cannot be created.
    """
    uid = os.geteuid()
    root = base / f"capgate-{uid}"
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise OPAProcessError(
            f"could not create capgate's private folder {root}: {exc.strerror}"
        ) from exc
    else:
        with contextlib.suppress(OSError):
            os.chmod(root, 0o700)  # mkdir's mode is filtered by the umask
    try:
        info = os.lstat(root)
    except OSError as exc:
        raise _refuse(root, f"cannot inspect it ({exc.strerror})") from exc
    if stat.S_ISLNK(info.st_mode):
        raise _refuse(root, "it is a symbolic link")
    if not stat.S_ISDIR(info.st_mode):
        raise _refuse(root, "it is not a directory")
    if info.st_uid != uid:
        raise _refuse(root, f"it is owned by uid {info.st_uid}, not by you (uid {uid})")
    if info.st_mode & 0o077:
        raise _refuse(root, f"its mode is {stat.S_IMODE(info.st_mode):04o}, so others can reach it")
    return root


def _base_dir(pid: int) -> Path:
    """``$TMPDIR``, or ``/tmp`` if the OPA socket would not fit in ``sun_path`` there."""
    configured = os.environ.get("TMPDIR")
    base = Path(
        os.path.abspath(configured)
        if configured and os.path.isdir(configured)
        else tempfile.gettempdir()
    )
    run = base / f"capgate-{os.geteuid()}" / f"run-{pid}-{'x' * _RANDOM_CHARS}"
    if len(os.fsencode(run)) + _DEEPEST_UNDER_RUN > MAX_SOCKET_PATH:
        return _FALLBACK_BASE
    return base


def sweep(root: Path) -> list[Path]:
    """Remove the run folders in ``root`` whose owner is gone; return what was removed.

    Never raises: a folder that cannot be removed now is tried again next time.
    A folder is first renamed to ``dead-...`` (atomic: of two processes sweeping at
    once, one wins), then deleted; a ``dead-...`` folder left by a sweeper that died
    mid-delete is deleted too.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        if entry.name.startswith("dead-"):
            shutil.rmtree(path, ignore_errors=True)
            continue
        if _RUN_RE.match(entry.name) is None or _run_folder_alive(path):
            continue
        doomed = path.with_name(f"dead-{entry.name}")
        try:
            os.rename(path, doomed)
        except OSError:
            continue  # another process swept it first, or it vanished
        shutil.rmtree(doomed, ignore_errors=True)
        log.info("removed %s, left behind by a process that is gone", path)
        removed.append(path)
    return removed


def _sweep_roots(root: Path) -> None:
    """Sweep the root in use and, if different and sound, the ``/tmp`` fallback root."""
    sweep(root)
    fallback = _FALLBACK_BASE / root.name
    if fallback != root and os.path.lexists(fallback):
        try:
            info = os.lstat(fallback)
        except OSError:
            return
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077:
            sweep(fallback)


# -- this process's run folder ---------------------------------------------------------


@dataclass(slots=True)
class _Run:
    path: Path
    pid: int
    users: int = 0


_lock = threading.Lock()
_run: _Run | None = None


def _create_run() -> _Run:
    pid = os.getpid()
    root = user_root(_base_dir(pid))
    _sweep_roots(root)
    try:
        path = Path(tempfile.mkdtemp(prefix=f"run-{pid}-", dir=root))  # mode 0700
    except OSError as exc:
        raise OPAProcessError(f"could not create a run folder in {root}: {exc.strerror}") from exc
    try:
        with write_errors(path, "the owner record", every_error=True):
            fd = os.open(
                path / _OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
            )
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(OwnerRecord.of_this_process().to_json())
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return _Run(path, pid)


def _acquire() -> _Run:
    """This process's run folder, created if needed; sweeps the root either way."""
    global _run
    if _run is not None and _run.pid != os.getpid():
        _run = None  # inherited through fork(): the parent's, not ours to use or remove
    if _run is None:
        _run = _create_run()
    else:
        _sweep_roots(_run.path.parent)
    _run.users += 1
    return _run


def _release(run: _Run) -> None:
    global _run
    run.users -= 1
    if run.users <= 0 and _run is run:
        _run = None
        shutil.rmtree(run.path, ignore_errors=True)


class PrivateDir:
    """A 0700 folder inside this process's run folder. :meth:`remove` it when done."""

    def __init__(self, path: Path, run: _Run) -> None:
        #: The folder itself.
        self.path = path
        self._run: _Run | None = run

    def remove(self) -> None:
        """Delete the folder (and the run folder, if this was its last). Idempotent."""
        with _lock:
            run, self._run = self._run, None
            if run is None or run.pid != os.getpid():
                return  # already removed, or inherited through fork()
            shutil.rmtree(self.path, ignore_errors=True)
            _release(run)

    def __repr__(self) -> str:
        return f"PrivateDir({str(self.path)!r})"


def private_dir(kind: str) -> PrivateDir:
    """A new folder ``<kind>-<random>`` in this process's run folder.

    Sweeps the run folders of dead processes first. Raises OPAProcessError, leaving
    nothing behind, if the folder cannot be created (see the module docstring).
    """
    with _lock:
        run = _acquire()
        try:
            path = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=run.path))  # mode 0700
        except OSError as exc:
            _release(run)
            raise OPAProcessError(
                f"could not create a folder in {run.path}: {exc.strerror}"
            ) from exc
        except BaseException:
            _release(run)
            raise
        return PrivateDir(path, run)


def current_run_dir() -> Path | None:
    """This process's run folder, if it has one now."""
    with _lock:
        if _run is None or _run.pid != os.getpid():
            return None
        return _run.path


def _remove_at_exit() -> None:
    """Remove the run folder with whatever is still in it (an unclosed PolicySidecar).

    Registered at import, so it runs after the ``atexit`` hooks of every EmbeddedOPA
    started later (atexit runs hooks last-in, first-out): OPA is stopped first.
    """
    global _run
    with _lock:
        run, _run = _run, None
    if run is not None and run.pid == os.getpid():
        shutil.rmtree(run.path, ignore_errors=True)


atexit.register(_remove_at_exit)


@contextlib.contextmanager
def write_errors(folder: Path, what: str, *, every_error: bool = False) -> Iterator[None]:
    """Turn a failure to write ``what`` into ``folder`` into OPAProcessError naming it.

    Translated: errors that mean the folder cannot take the data (disk or quota
    full, file too large, read-only, I/O error) and errors about a file inside
    ``folder``; with ``every_error``, any OSError. Others (say, a missing source
    file elsewhere) pass through unchanged, so their own message is not lost.
    """
    try:
        yield
    except OSError as exc:
        if not (every_error or exc.errno in _STORAGE_ERRNOS or _names_inside(exc, folder)):
            raise
        reason = exc.strerror or str(exc)
        hint = ""
        if exc.errno in _STORAGE_ERRNOS:
            hint = "; free space there, or set TMPDIR to a folder with room"
        raise OPAProcessError(f"could not write {what} to {folder}: {reason}{hint}") from exc


def _names_inside(exc: OSError, folder: Path) -> bool:
    name = exc.filename
    return isinstance(name, str) and Path(name).is_relative_to(folder)
