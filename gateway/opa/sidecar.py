"""Find the OPA to talk to: an external one if configured, else one we start and own.

With no address configured (neither the ``opa_url`` argument nor ``CAPGATE_OPA_URL``)
capgate writes a bundle of the policies and the compiled catalogue to a private
temporary folder, starts a local OPA on a unix socket, and stops it on close. In
both cases it then checks that OPA serves exactly the catalogue this process
loaded: a dispatcher whose catalogue differs from the policy's would describe
tools that OPA judges by other rules.

An external OPA deployed as ``docs/deployment.md`` describes is locked down: it
answers only the gateway's bearer token. The token comes from the ``token`` or
``token_file`` argument, else ``$CAPGATE_OPA_TOKEN`` or ``$CAPGATE_OPA_TOKEN_FILE``
(one of the two; a file holds the token alone, a final newline allowed). It is sent
to the external OPA only, never logged or shown; :attr:`PolicySidecar.token_source`
says where it came from. The embedded OPA, on a socket only this user can reach,
needs none.

Readiness. An external OPA may start before its bundle server serves anything, and
until it has activated a bundle that verifies it answers nothing capgate obeys.
Given ``startup_timeout`` (or ``$CAPGATE_OPA_STARTUP_TIMEOUT``) seconds, the
constructor waits that long for :meth:`PolicySidecar.ready`, then fails closed with
PolicyUnavailable; without it (the default, 0) it asks once. Every decision is
checked again whatever happened at start-up (the catalogue digest it carries), so
an OPA that restarts and loses its bundle is refused, never obeyed.
"""

from __future__ import annotations

import logging
import math
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from capgate.gateway.catalogue import compile_catalogue
from capgate.gateway.errors import PolicyUnavailable
from capgate.gateway.model.contracts import Catalogue
from capgate.gateway.model.health import CheckResult
from capgate.gateway.opa.binary import OPABinary
from capgate.gateway.opa.bundle import bundle_revision, write_bundle
from capgate.gateway.opa.policies import PoliciesLocation, locate_policies
from capgate.gateway.opa.process import EMBEDDED_STARTUP_TIMEOUT, EmbeddedOPA
from capgate.gateway.opa.traces import OPATracing
from capgate.gateway.opa.workdir import PrivateDir, private_dir, write_errors
from capgate.gateway.policy.address import OPA_URL_ENV, AddressOrigin, OPAAddress, check_token
from capgate.gateway.policy.client import Exchange, PolicyClient
from capgate.gateway.policy.timeouts import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT

__all__ = [
    "OPA_STARTUP_TIMEOUT_ENV",
    "OPA_TOKEN_ENV",
    "OPA_TOKEN_FILE_ENV",
    "OPA_URL_ENV",
    "PolicySidecar",
    "TokenSource",
    "configured_token",
    "opa_address",
    "read_token_file",
    "startup_timeout_from_env",
    "token_file_problem",
]

log = logging.getLogger("capgate.opa.sidecar")

#: Environment variable holding the bearer token of a locked-down external OPA.
OPA_TOKEN_ENV: Final = "CAPGATE_OPA_TOKEN"  # noqa: S105 (a variable name, not a token)
#: Environment variable naming a file that holds that token (0600, the token alone).
OPA_TOKEN_FILE_ENV: Final = "CAPGATE_OPA_TOKEN_FILE"  # noqa: S105 (a name)
#: Environment variable: seconds to wait for an external OPA to become ready.
OPA_STARTUP_TIMEOUT_ENV: Final = "CAPGATE_OPA_STARTUP_TIMEOUT"

#: The longest start-up wait accepted: a gateway that waits longer is better restarted.
MAX_STARTUP_TIMEOUT: Final = 3600.0
#: The largest token file read; a token is at most a few kilobytes.
_MAX_TOKEN_FILE_BYTES: Final = 8192
#: What an OPA that is not ready fails, in the start-up error and in readiness.
_NOT_HEALTHY: Final = "GET /health?bundles did not answer 200"


@dataclass(frozen=True, slots=True)
class TokenSource:
    """Where the OPA token came from: never the token itself.

    ``origin`` is ``argument`` or ``env`` (``$CAPGATE_OPA_TOKEN``), or for a file
    ``file argument`` or ``file env`` (``$CAPGATE_OPA_TOKEN_FILE``), with ``path``.
    """

    origin: str
    path: Path | None = None

    def describe(self) -> str:
        return {
            "argument": "given by the caller",
            "env": f"from ${OPA_TOKEN_ENV}",
            "file argument": f"read from {self.path} (given by the caller)",
            "file env": f"read from {self.path} (from ${OPA_TOKEN_FILE_ENV})",
        }[self.origin]


def read_token_file(path: Path) -> str:
    """The token a file holds: its whole content, one final newline allowed.

    ValueError (naming the file, never its content) if it cannot be read, is empty,
    too large, or holds anything a bearer token may not
    (:func:`capgate.gateway.policy.address.check_token`).
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(_MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"OPA token file {path}: cannot read it: {exc.strerror}") from None
    if len(data) > _MAX_TOKEN_FILE_BYTES:
        raise ValueError(f"OPA token file {path} is larger than a token can be")
    text = data.decode("ascii", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    try:
        return check_token(text)
    except ValueError as exc:
        raise ValueError(f"OPA token file {path}: {exc}") from None


def configured_token(
    token: str | None = None,
    token_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, TokenSource] | None:
    """The token to send an external OPA and where it came from, or None.

    The arguments win over the environment; giving both arguments, or setting both
    variables, is a ValueError: one token, from one place.
    """
    env = os.environ if environ is None else environ
    if token is not None and token_file is not None:
        raise ValueError("give the OPA token or a file that holds it, not both")
    if token is not None:
        return check_token(token), TokenSource("argument")
    if token_file is not None:
        return read_token_file(Path(token_file)), TokenSource("file argument", Path(token_file))
    value, file = env.get(OPA_TOKEN_ENV), env.get(OPA_TOKEN_FILE_ENV)
    if value and file:
        raise ValueError(f"set ${OPA_TOKEN_ENV} or ${OPA_TOKEN_FILE_ENV}, not both")
    if value:
        try:
            return check_token(value), TokenSource("env")
        except ValueError as exc:
            raise ValueError(f"${OPA_TOKEN_ENV}: {exc}") from None
    if file:
        return read_token_file(Path(file)), TokenSource("file env", Path(file))
    return None


def token_file_problem(path: Path) -> str | None:
    """Why a token file is not private to its owner (group or others may read or
    write it, or it is not a regular file), or None."""
    try:
        info = Path(path).stat()
    except OSError as exc:
        return f"cannot stat it: {exc.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file"
    if info.st_mode & 0o077:
        return f"its mode is {stat.S_IMODE(info.st_mode):04o}: other users may read it (chmod 600)"
    return None


def opa_address(
    opa_url: str | OPAAddress | None = None, environ: Mapping[str, str] | None = None
) -> OPAAddress | None:
    """The external OPA to use and where its address came from, or None for the
    embedded one: ``opa_url`` (a plain string counts as the caller's argument), else
    ``$CAPGATE_OPA_URL``. An empty value counts as none given."""
    if isinstance(opa_url, OPAAddress):
        return opa_url if opa_url.url else None
    if opa_url:
        return OPAAddress(opa_url, AddressOrigin.ARGUMENT)
    value = (os.environ if environ is None else environ).get(OPA_URL_ENV)
    return OPAAddress(value, AddressOrigin.ENVIRONMENT) if value else None


def startup_timeout_from_env(environ: Mapping[str, str] | None = None) -> float:
    """``$CAPGATE_OPA_STARTUP_TIMEOUT`` in seconds (0 when unset); ValueError if malformed."""
    text = (os.environ if environ is None else environ).get(OPA_STARTUP_TIMEOUT_ENV, "")
    if not text.strip():
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_STARTUP_TIMEOUT:
        raise ValueError(
            f"${OPA_STARTUP_TIMEOUT_ENV} is {text[:40]!r}: give seconds from 0 to "
            f"{MAX_STARTUP_TIMEOUT:.0f}"
        )
    return value


class PolicySidecar:
    """A PolicyClient plus, when embedded, the OPA process and bundle it owns.

    ``opa_env`` adds variables to the embedded OPA's minimal environment (see
    :mod:`capgate.gateway.opa.process`); policies can read them, so pass no secrets.
    ``opa_tracing`` turns on the embedded OPA's distributed tracing
    (:mod:`capgate.gateway.opa.traces`); an external OPA's is in its own
    configuration, so it is refused (ValueError) with ``opa_url``.

    ``timeout`` (default :data:`~capgate.gateway.policy.timeouts.DEFAULT_TIMEOUT`) is the client's
    read and write timeout; a question about the whole catalogue adds an allowance
    for each of its tools (:func:`~capgate.gateway.policy.timeouts.whole_catalogue_timeout`).

    ``opa_url`` is the external OPA's address (an
    :class:`~capgate.gateway.policy.address.OPAAddress` says where it came from, e.g.
    ``--opa``), else ``$CAPGATE_OPA_URL``, else none: the embedded OPA. An OPA that
    cannot be reached is reported with where its address came from.
    ``connect_timeout`` (default
    :data:`~capgate.gateway.policy.timeouts.DEFAULT_CONNECT_TIMEOUT`) bounds each
    connect to it.

    For an external OPA: ``token`` or ``token_file`` (else the environment, see the
    module docstring) is the bearer token it requires, and ``startup_timeout``
    (else ``$CAPGATE_OPA_STARTUP_TIMEOUT``, else 0) how many seconds to wait for it
    to become ready before failing closed. For the embedded OPA, ``startup_timeout``
    (default :data:`~capgate.gateway.opa.process.EMBEDDED_STARTUP_TIMEOUT`) is how
    long it may take to start and activate its bundle.

    ``on_exchange`` hears every question's round trip to OPA (the metrics' latency;
    see :class:`~capgate.gateway.policy.client.Exchange`).
    """

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        opa_url: str | OPAAddress | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        policies_dir: Path | None = None,
        opa_binary: Path | None = None,
        opa_env: Mapping[str, str] | None = None,
        token: str | None = None,
        token_file: Path | None = None,
        startup_timeout: float | None = None,
        on_exchange: Callable[[Exchange], None] | None = None,
        opa_tracing: OPATracing | None = None,
    ) -> None:
        meta = compile_catalogue(catalogue)["meta"]
        self.expected_digest: str = meta["digest"]
        external = opa_address(opa_url)
        if external is not None and opa_tracing is not None:
            raise ValueError(
                f"opa_tracing configures the OPA capgate starts, but {external.describe()} "
                "is used: set distributed_tracing in that OPA's own configuration "
                "(capgate deploy init --otlp-address; docs/operations.md)"
            )
        self.process: EmbeddedOPA | None = None
        #: Where the external OPA's token came from; None when none is sent (always
        #: for the embedded OPA, whose socket only this user can reach).
        self.token_source: TokenSource | None = None
        #: The policies bundled for the embedded OPA; None for an external OPA,
        #: which serves whatever bundle its operator gave it.
        self.policies: PoliciesLocation | None = None
        self._client: PolicyClient | None = None
        self._bundle_root: PrivateDir | None = None
        # Pinned for the embedded OPA only: we wrote its bundle, so any other revision
        # is not ours. An external OPA's operator may publish new policies through a
        # bundle server without restarting gateways; its revisions are only recorded.
        revision: str | None = None
        secret: str | None = None
        wait = 0.0
        try:
            if external is not None:
                found = configured_token(token, token_file)
                if found is not None:
                    secret, self.token_source = found
                wait = startup_timeout_from_env() if startup_timeout is None else startup_timeout
                if not 0 <= wait <= MAX_STARTUP_TIMEOUT:
                    raise ValueError(f"startup_timeout must be from 0 to {MAX_STARTUP_TIMEOUT}")
            location = external
            if location is None:
                self.policies = (
                    locate_policies()
                    if policies_dir is None
                    else PoliciesLocation(Path(policies_dir).resolve(), "argument")
                )
                self._bundle_root = private_dir("bundle")  # see gateway.opa.workdir
                with write_errors(self._bundle_root.path, "the policy bundle"):
                    bundle = write_bundle(
                        catalogue, self._bundle_root.path / "bundle", self.policies.path
                    )
                revision = bundle_revision(catalogue, self.policies.path)
                start = EMBEDDED_STARTUP_TIMEOUT if startup_timeout is None else startup_timeout
                if not 0 < start <= MAX_STARTUP_TIMEOUT:
                    raise ValueError(
                        f"startup_timeout of the embedded OPA must be over 0 and at most "
                        f"{MAX_STARTUP_TIMEOUT:g}"
                    )
                self.process = EmbeddedOPA(
                    bundle,
                    opa_binary=opa_binary,
                    env=opa_env,
                    startup_timeout=start,
                    tracing=opa_tracing,
                )
                self.process.start()
                location = OPAAddress(self.process.address, AddressOrigin.EMBEDDED)
            # Every decision must carry the catalogue digest loaded here, not only the
            # first answer: an OPA restarted with another bundle behind the same address
            # would otherwise be obeyed until this process restarts. The catalogue's
            # size sets how long a question about all of it may take.
            self._client = PolicyClient(
                location,
                timeout=timeout or DEFAULT_TIMEOUT,
                connect_timeout=connect_timeout or DEFAULT_CONNECT_TIMEOUT,
                expected_catalogue=self.expected_digest,
                expected_revision=revision,
                token=secret,
                catalogue_size=meta["tool_count"],
                on_exchange=on_exchange,
            )
            del secret
            if wait > 0:
                self._wait_ready(self._client, wait)
            self._check_catalogue(self._client)
            log.info("%s", self.describe())
        except BaseException:
            # Whatever failed (a bad address, OPA not starting, the wrong catalogue,
            # Ctrl-C), nothing we started may outlive this constructor.
            self.close()
            raise

    @property
    def client(self) -> PolicyClient:
        """The client for this OPA (set once the constructor has returned)."""
        if self._client is None:  # pragma: no cover - only reachable mid-construction
            raise PolicyUnavailable("the policy sidecar has no client")
        return self._client

    @property
    def embedded(self) -> bool:
        return self.process is not None

    @property
    def opa_binary(self) -> OPABinary | None:
        """The OPA binary the embedded process runs; None for an external OPA."""
        return self.process.binary if self.process is not None else None

    def describe_lines(self) -> list[str]:
        """Which OPA, policies and catalogue are in use, one line each."""
        if self.process is None or self.policies is None or self.process.binary is None:
            token = self.token_source.describe() if self.token_source else "none"
            return [
                f"OPA: external, {self.client.address}",
                f"OPA token: {token}",
                f"catalogue: {self.expected_digest}",
            ]
        return [
            f"OPA: embedded, {self.process.binary.describe()}, pid {self.process.pid}",
            f"policies: {self.policies.describe()}",
            f"catalogue: {self.expected_digest}",
        ]

    def describe(self) -> str:
        """:meth:`describe_lines` as one line, for logs."""
        return "; ".join(self.describe_lines())

    def ready(self) -> bool:
        """True when OPA is healthy with every bundle active and serves this catalogue.

        What a service's readiness probe should report: until it is true no decision
        is obeyed (each one must carry this catalogue's digest), so the gateway
        denies every call. Never raises. :meth:`readiness` says why not.
        """
        return self.readiness().ok

    def readiness(self) -> CheckResult:
        """:meth:`ready`, with what was found: the bundle revision OPA answered under
        (``facts["bundle_revision"]``), or what is wrong.

        The check start-up makes, asked again: OPA healthy with every bundle active
        (``GET /health?bundles``), then the catalogue digest it serves compared with
        the one loaded here (and, for the embedded OPA, its answer's revision with
        the pinned one, as on every answer). Never raises.
        """
        if self._client is None:
            return CheckResult(ok=False, detail="the policy client is not set up")
        if not self._client.ready():
            return CheckResult(ok=False, detail=_NOT_HEALTHY)
        try:
            served = self._client.served_catalogue()
        except PolicyUnavailable as exc:
            return CheckResult(ok=False, detail=str(exc))
        problem = self._catalogue_problem(served.digest)
        if problem is not None:
            return CheckResult(ok=False, detail=problem)
        return CheckResult(
            ok=True,
            detail="healthy, every bundle active, serves this catalogue",
            facts={"bundle_revision": served.revision},
        )

    def _wait_ready(self, client: PolicyClient, seconds: float) -> None:
        """Poll OPA's readiness for up to ``seconds``; PolicyUnavailable after that.

        Only readiness is waited for: an OPA that is ready but serves another
        catalogue fails at once in :meth:`_check_catalogue`.
        """
        deadline = time.monotonic() + seconds
        pause = 0.05
        while (problem := client.health_problem(bundles=True)) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PolicyUnavailable(
                    f"{client.location.describe()} was not ready within {seconds:g}s "
                    f"(GET /health?bundles did not answer 200); the last try: {problem}. "
                    "capgate asks it nothing until it is ready; `capgate doctor` checks it"
                )
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)

    def _check_catalogue(self, client: PolicyClient) -> None:
        """Fail at start-up, with advice, if OPA serves another catalogue (or bundle).

        The client checks every decision again; this first check turns a wrong
        address or a stale bundle into one clear error before any agent is served.
        """
        problem = self._catalogue_problem(client.catalogue_digest())
        if problem is not None:
            raise PolicyUnavailable(problem)

    def _catalogue_problem(self, served: str) -> str | None:
        """What is wrong with the catalogue digest OPA serves (None: it is this one's)."""
        if served == self.expected_digest:
            return None
        shown = served if len(served) <= 80 else served[:77] + "..."
        return (
            f"OPA serves catalogue {shown!r}, but this dispatcher loaded "
            f"{self.expected_digest}: rebuild the bundle (`capgate bundle`) or "
            "point capgate at the matching catalogue"
        )

    def close(self) -> None:
        """Close the client, stop an owned OPA, remove its bundle. Safe to call twice."""
        if self._client is not None:
            self._client.close()
        if self.process is not None:
            self.process.stop()
        if self._bundle_root is not None:
            self._bundle_root.remove()
            self._bundle_root = None

    def __enter__(self) -> PolicySidecar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
