"""Is this process ready to serve? Its readiness checks, each bounded in time.

Liveness needs nothing from here: a process that answers at all is alive. Readiness
asks each part that a call needs:

- ``opa``: the sidecar's own check,
  :meth:`~capgate.gateway.opa.sidecar.PolicySidecar.readiness` (the one start-up
  makes): OPA healthy with every bundle active and serving this catalogue; it names
  the bundle revision OPA answered under;
- ``store``: :func:`store_check`, the store answers a read at the schema version this
  capgate writes (:data:`~capgate.gateway.state.store.SCHEMA_VERSION`);
- ``worker``: :func:`worker_check`, the execution worker's thread runs, where the
  process has one; where it has none (another process dispatches), the check says so
  and passes.

**Bounded.** Each check runs on a thread of its own, and :meth:`Readiness.check`
waits for all of them together at most ``timeout`` seconds: a check that has not
answered by then fails (``no answer within 2 s``), so a hung OPA or a locked store
makes the answer "not ready" instead of a probe that hangs. A check still running
when the next probe comes is waited for again, not started a second time, so a part
that hangs holds one thread however often it is probed.

**Shown to anyone.** Probes are not authenticated, so every detail goes through
:func:`public_detail`, which takes out anything shaped like a URL, an IP address or
an absolute file path: an OPA or store address (a PostgreSQL URL may hold a
password), a socket path or a store file never leaves the process that way. No check
puts a tenant, a token or a secret into its answer to begin with.

When a check changes from ready to not ready or back, one log line says so, with
the whole detail: the operator's log may name what a probe may not.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from capgate.gateway.errors import CapgateError
from capgate.gateway.model.health import CheckResult
from capgate.gateway.service.worker import Worker
from capgate.gateway.state.store import SCHEMA_VERSION, Store

__all__ = [
    "DEFAULT_CHECK_TIMEOUT",
    "Probe",
    "Readiness",
    "ReadinessReport",
    "public_detail",
    "store_check",
    "worker_check",
]

log = logging.getLogger("capgate.service.health")

#: How long a readiness probe waits for its checks, by default (seconds).
DEFAULT_CHECK_TIMEOUT: Final = 2.0

#: One check: asked from a thread of its own, it answers for one part.
Probe = Callable[[], CheckResult]

_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
_IP: Final = re.compile(
    r"\[?\b(?:\d{1,3}\.){3}\d{1,3}\b\]?(?::\d+)?|\[[0-9A-Fa-f:]*:[0-9A-Fa-f:]*\](?::\d+)?"
)
#: An absolute path of two segments or more (``/health?bundles`` is an OPA endpoint).
_PATH: Final = re.compile(r"(?<![\w/.:~-])~?/[^\s/'\"]+/[^\s'\"]*")


def public_detail(text: str) -> str:
    """``text`` with every URL, IP address and absolute file path replaced by
    ``<address>`` or ``<path>``, for answers shown to whoever asks."""
    text = _URL.sub("<address>", text)
    text = _IP.sub("<address>", text)
    return _PATH.sub("<path>", text)


def store_check(store: Store) -> CheckResult:
    """The store answers a read, at the schema version this capgate writes."""
    try:
        version = store.schema_version()
    except CapgateError as exc:
        return CheckResult(ok=False, detail=f"the store did not answer ({exc.code}: {exc})")
    except Exception as exc:  # a driver's own error: the store is not usable either
        return CheckResult(ok=False, detail=f"the store did not answer ({type(exc).__name__})")
    facts: dict[str, str | int | None] = {"schema_version": version}
    if version != SCHEMA_VERSION:
        return CheckResult(
            ok=False,
            detail=f"the store is at schema version {version}, this capgate works at "
            f"{SCHEMA_VERSION} (capgate migrates an older store when it opens it; a "
            "newer one needs the capgate that wrote it)",
            facts=facts,
        )
    return CheckResult(ok=True, detail="answers at the current schema version", facts=facts)


def worker_check(worker: Worker | None) -> CheckResult:
    """The execution worker's thread runs; passes when this process has none."""
    if worker is None:
        return CheckResult(
            ok=True, detail="not configured: approved proposals are dispatched elsewhere"
        )
    if worker.running:
        return CheckResult(ok=True, detail="running")
    return CheckResult(ok=False, detail="stopped: its thread is not running")


@dataclass(frozen=True)
class ReadinessReport:
    """Every check's answer, by name."""

    checks: dict[str, CheckResult]

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks.values())

    def to_json(self) -> dict[str, Any]:
        """``{"status": "ready"|"not_ready", "checks": {name: {"ok", "detail", facts...}}}``."""
        return {
            "status": "ready" if self.ready else "not_ready",
            "checks": {
                name: {"ok": check.ok, "detail": check.detail, **check.facts}
                for name, check in self.checks.items()
            },
        }


class _Bounded:
    """One check, run on a thread of its own; a thread still running is reused."""

    def __init__(self, name: str, probe: Probe) -> None:
        self.name = name
        self._probe = probe
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._answer: list[CheckResult] = []

    def start(self) -> tuple[threading.Thread, list[CheckResult]]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                answer: list[CheckResult] = []
                thread = threading.Thread(
                    target=self._run, args=(answer,), name=f"capgate-ready-{self.name}", daemon=True
                )
                self._thread, self._answer = thread, answer
                thread.start()
            return self._thread, self._answer

    def _run(self, answer: list[CheckResult]) -> None:
        try:
            answer.append(self._probe())
        except Exception as exc:  # a check that fails to check: not ready
            answer.append(CheckResult(ok=False, detail=f"the check failed ({type(exc).__name__})"))


class Readiness:
    """The process's readiness: ``checks`` by name, asked together within ``timeout``.

    Thread-safe: probes may come from many requests at once.
    """

    def __init__(
        self, checks: Mapping[str, Probe], *, timeout: float = DEFAULT_CHECK_TIMEOUT
    ) -> None:
        if not timeout > 0:
            raise ValueError("the readiness timeout must be positive")
        self.timeout = timeout
        self._checks = [_Bounded(name, probe) for name, probe in checks.items()]
        self._was: dict[str, bool] = {}
        self._log_lock = threading.Lock()

    def check(self) -> ReadinessReport:
        """Ask every check; those without an answer within ``timeout`` fail."""
        deadline = time.monotonic() + self.timeout
        started = [(bounded.name, *bounded.start()) for bounded in self._checks]
        found: dict[str, CheckResult] = {}
        for name, thread, answer in started:
            thread.join(max(deadline - time.monotonic(), 0.0))
            found[name] = (
                answer[0]
                if answer
                else CheckResult(ok=False, detail=f"no answer within {self.timeout:g} s")
            )
        self._log_changes(found)
        return ReadinessReport(
            {
                name: result.model_copy(update={"detail": public_detail(result.detail)})
                for name, result in found.items()
            }
        )

    def _log_changes(self, found: Mapping[str, CheckResult]) -> None:
        with self._log_lock:
            for name, result in found.items():
                before = self._was.get(name)
                self._was[name] = result.ok
                if (before is None and result.ok) or before == result.ok:
                    continue
                if result.ok:
                    log.info("readiness: %s is ready again", name)
                else:
                    log.warning("readiness: %s is not ready: %s", name, result.detail)
