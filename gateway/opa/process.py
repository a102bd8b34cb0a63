"""Run a private OPA next to this process, reachable only through a unix socket.

Why a child process on a socket: the gateway must not depend on a sidecar someone
else started, and a socket in a 0700 directory is reachable by this user alone,
with no TCP port for anything else on the machine (or off it) to talk to.

Why so much care about stopping: an OPA left running keeps a stale policy serving
and holds the bundle open. The child therefore dies with us however we end:

- ``stop()`` (or leaving the ``with`` block, also on Ctrl-C) sends SIGTERM, waits,
  then SIGKILLs, and is safe to call twice;
- an ``atexit`` hook stops it when the interpreter exits normally;
- on Linux the child asks the kernel (``PR_SET_PDEATHSIG``) for SIGTERM when its
  parent dies, which covers ``kill -9`` of Python, where no Python code runs.

OPA is started with:

- ``--set decision_logs.console=true``: OPA returns a ``decision_id`` only when
  decision logging is on, and the id ties a trace line to its decision;
- a second, generated bundle whose ``system.log.drop`` drops every decision log
  event, so the ids still come back but nothing is written: a log file in a temp
  folder would grow by a line per decision with no rotation, and the facts and
  reason messages (tenants, principals, subjects) do not belong in it. The
  dispatcher logs each decision (id, tool, reason codes) through Python's
  ``logging`` instead, where the host application controls retention. The policy
  bundle must therefore declare its ``roots`` in ``.manifest`` (a bundle without
  roots claims every path and OPA refuses both);
- ``--skip-version-check``: otherwise OPA calls api.github.com at startup;
- ``--unix-socket-perm 600`` (OPA's default is 755), on top of the 0700 directory;
- given ``tracing=`` (an :class:`~capgate.gateway.opa.traces.OPATracing`), its
  ``distributed_tracing`` block as ``--set`` flags: OPA then reads the ``traceparent``
  capgate sends and exports its own spans, children of the gateway's, to that OTLP
  collector. Its decision log entries would carry the trace id too, but this OPA
  drops them (above); a deployment's sidecar keeps them (``opa_config``). Off by
  default: nothing leaves the socket.

Environment: OPA gets a minimal one, built here, never this process's. A policy can
read OPA's whole environment through ``opa.runtime().env``, and a host environment
holds cloud keys, tokens and database passwords. OPA needs none of it (no ``PATH``
either: it is run by absolute path and runs nothing itself), so its environment is
exactly::

    HOME=<OPA folder>/home      0700, empty: nothing for OPA to find in a home
    TMPDIR=<OPA folder>/tmp     0700: Go's temp files stay in the folder we remove

plus whatever the caller passes as ``env=`` (``EmbeddedOPA(..., env=...)``,
``PolicySidecar(..., opa_env=...)``), verbatim, for example ``GOMAXPROCS`` or
``GOMEMLIMIT``. Anything passed there is readable by every policy. ``HOME`` and
``TMPDIR`` cannot be overridden.

Folders: OPA's folder is ``opa-<random>/`` inside this process's private run folder
(:mod:`capgate.gateway.opa.workdir` has the layout and the rules: per-user root, 0700
folders, owner record, removal on stop and at exit, sweeping of folders whose
process died). It holds ``opa.sock`` (0600), ``opa.log`` (0600, OPA's stdout and
stderr), ``home/``, ``tmp/`` and the generated log bundle, and is removed by
``stop()``. A folder that cannot be written (disk full, say) fails ``start()`` with
OPAProcessError naming it, and nothing is left behind.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Final

from capgate.gateway.errors import OPAProcessError
from capgate.gateway.opa.binary import OPABinary, find_opa
from capgate.gateway.opa.traces import OPATracing
from capgate.gateway.opa.workdir import PrivateDir, private_dir, write_errors
from capgate.gateway.policy.client import PolicyClient

__all__ = ["EMBEDDED_STARTUP_TIMEOUT", "RESERVED_ENV", "EmbeddedOPA"]

#: Environment variables capgate sets for OPA itself; ``env=`` may not override them.
RESERVED_ENV: Final = frozenset({"HOME", "TMPDIR"})

#: Seconds OPA may take by default to start and activate its bundles.
EMBEDDED_STARTUP_TIMEOUT: Final = 15.0
_STOP_GRACE_SECONDS: Final = 5.0
_LOG_TAIL_CHARS: Final = 4000
_PR_SET_PDEATHSIG: Final = 1
_LOG_BUNDLE: Final = "capgate-no-decision-log"
_LOG_REGO: Final = """\
# METADATA
# title: Keep decisions out of the embedded OPA's log
# description: |
#   Drops every decision log event. OPA still assigns and returns decision ids;
#   capgate logs its decisions through Python logging instead.
package system.log

drop := true
"""


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when its parent dies (Linux).

    Caveat from prctl(2): "parent" is the thread that forked. Start OPA from a
    thread that lives as long as the gateway (normally the main thread).
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: nothing to load after
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class EmbeddedOPA:
    """One OPA server serving ``bundle_dir`` on a private unix socket.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Pass
    :attr:`address` to :class:`capgate.gateway.policy.client.PolicyClient`. ``start`` returns
    only once OPA reports every bundle activated, so the first decision is real.

    ``env`` adds variables to OPA's otherwise minimal environment (see the module
    docstring); every policy can read them through ``opa.runtime().env``.
    ``tracing`` turns on OPA's distributed tracing (see the module docstring).
    """

    def __init__(
        self,
        bundle_dir: Path,
        *,
        opa_binary: Path | None = None,
        startup_timeout: float = EMBEDDED_STARTUP_TIMEOUT,
        env: Mapping[str, str] | None = None,
        tracing: OPATracing | None = None,
    ) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.opa_binary = opa_binary
        self.startup_timeout = startup_timeout
        #: The variables added to OPA's environment, as given.
        self.env: dict[str, str] = _checked_env(env)
        #: OPA's distributed tracing (an OTLP collector to export to), or None: off.
        self.tracing = tracing
        #: The binary actually run, known once :meth:`start` has found it.
        self.binary: OPABinary | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: PrivateDir | None = None
        self._dir: Path | None = None

    # -- properties --------------------------------------------------------------

    @property
    def address(self) -> str:
        """``unix:///.../opa.sock``, for PolicyClient."""
        return f"unix://{self._require_dir() / 'opa.sock'}"

    @property
    def socket_path(self) -> Path:
        return self._require_dir() / "opa.sock"

    @property
    def log_path(self) -> Path:
        """OPA's stdout and stderr. Removed with the private directory on stop."""
        return self._require_dir() / "opa.log"

    @property
    def environment(self) -> dict[str, str]:
        """Exactly the environment OPA runs with (known once started)."""
        directory = self._require_dir()
        return {**self.env, "HOME": str(directory / "home"), "TMPDIR": str(directory / "tmp")}

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise OPAProcessError("OPA is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _require_dir(self) -> Path:
        if self._dir is None:
            raise OPAProcessError("OPA has not been started")
        return self._dir

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> EmbeddedOPA:
        """Start OPA and wait until it serves the bundle; on any failure, clean up.

        Raises OPAProcessError (with the tail of OPA's log) if OPA exits or does not
        become healthy within ``startup_timeout`` seconds.
        """
        if self._proc is not None:
            return self
        try:
            self._launch()
            self._wait_healthy()
        except BaseException:  # KeyboardInterrupt included: leave nothing behind
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        self.binary = find_opa(self.opa_binary)
        binary = self.binary.path
        if not self.bundle_dir.exists():
            raise OPAProcessError(f"bundle {self.bundle_dir} does not exist")
        self._workdir = private_dir("opa")
        self._dir = self._workdir.path
        log_bundle = self._dir / _LOG_BUNDLE
        with write_errors(self._dir, "the embedded OPA's files", every_error=True):
            for private in ("home", "tmp"):
                (self._dir / private).mkdir(mode=0o700)
            (log_bundle / "system" / "log").mkdir(parents=True)
            (log_bundle / ".manifest").write_text('{"roots": ["system/log"]}\n')
            (log_bundle / "system" / "log" / "drop.rego").write_text(_LOG_REGO)
            # 0600 from the start: OPA's errors can quote policy and data.
            log_fd = os.open(
                self.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
            )
        args = [
            str(binary),
            "run",
            "--server",
            "--addr",
            f"unix://{self.socket_path}",
            "--unix-socket-perm",
            "600",
            "--bundle",
            str(self.bundle_dir.resolve()),
            str(log_bundle),
            "--set",
            "decision_logs.console=true",
            "--log-format",
            "json",
            "--skip-version-check",
            # Keep the data as Rego values instead of converting the catalogue's
            # objects on every read: compose of 10,000 tools takes a third of the time
            # (docs/benchmarks.md). The store is written once per bundle activation.
            "--optimize-store-for-read-speed",
        ]
        if self.tracing is not None:
            args += self.tracing.set_flags()
        # A file, not a PIPE: nobody reads OPA's output while it runs, and a full
        # pipe would block OPA mid-decision.
        with open(log_fd, "wb") as log_file:
            try:
                self._proc = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self._dir,
                    env=self.environment,  # never os.environ: policies can read it
                    preexec_fn=_die_with_parent(),  # the only hook for PR_SET_PDEATHSIG
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise OPAProcessError(f"could not run {binary}: {exc}") from exc
        atexit.register(self.stop)

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        pause = 0.02
        with PolicyClient(self.address, timeout=1.0, connect_timeout=1.0) as client:
            while True:
                # Socket first: a health call before OPA listens is a wasted connect.
                if not self.socket_path.exists():
                    problem: str | None = "its socket is not there yet (OPA is not listening)"
                else:
                    problem = client.health_problem(bundles=True)
                    if problem is None:
                        return
                # Asked after the last try too: an OPA that died while it was asked
                # is reported as exited, with its log, not as slow.
                code = self._proc.poll()
                if code is not None:
                    tail = self._log_tail()
                    raise OPAProcessError(
                        f"OPA exited with status {code} while starting "
                        f"(bundle {self.bundle_dir}):\n{tail}{_hint(tail)}"
                    )
                if time.monotonic() >= deadline:
                    raise OPAProcessError(
                        f"OPA did not report its bundles activated within "
                        f"{self.startup_timeout:g}s (bundle {self.bundle_dir}); the last "
                        f"try: {problem}. Its log:\n{self._log_tail()}"
                    )
                time.sleep(pause)
                pause = min(pause * 2, 0.2)

    def stop(self) -> None:
        """SIGTERM, wait up to 5 s, SIGKILL; then remove the private directory.

        Idempotent. An interrupt while waiting still ends in SIGKILL, so leaving a
        ``with`` block on Ctrl-C, even a second Ctrl-C, leaves no OPA behind.
        """
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        try:
            if proc is not None and proc.poll() is None:
                try:
                    proc.terminate()
                    proc.wait(timeout=_STOP_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    pass
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
        finally:
            workdir, self._workdir, self._dir = self._workdir, None, None
            if workdir is not None:
                workdir.remove()

    def __enter__(self) -> EmbeddedOPA:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self._proc.pid}" if self._proc is not None else "stopped"
        return f"EmbeddedOPA({str(self.bundle_dir)!r}, {state})"

    # -- helpers ---------------------------------------------------------------

    def _log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError as exc:
            return f"(no OPA log: {exc})"
        text = data[-_LOG_TAIL_CHARS:].decode("utf-8", errors="replace")
        return text.strip() or "(OPA log is empty)"


def _hint(log_tail: str) -> str:
    """Advice for the one startup failure our own command line can cause."""
    if "overlapping roots" in log_tail:
        return (
            f"\nhint: the policy bundle must list its roots in .manifest (e.g. "
            f'{{"roots": ["capgate"]}}), so that it does not overlap the generated '
            f"{_LOG_BUNDLE} bundle (root system/log) that keeps decisions out of OPA's log"
        )
    return ""


def _checked_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``env``, refused (ValueError) if it could not be a sound environment."""
    checked = dict(env or {})
    for name, value in checked.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"env holds {name!r}: names and values must be strings")
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"env holds {name!r}: not a usable environment variable")
        if name in RESERVED_ENV:
            raise ValueError(f"env may not set {name}: capgate points it into OPA's private folder")
    return checked
