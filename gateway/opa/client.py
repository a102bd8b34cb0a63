"""Ask the OPA sidecar for decisions and return them typed; never enforce anything.

The client is the one place where HTTP meets policy. It knows how to reach OPA, how
long to wait, and what a usable answer looks like; it does not know what an answer
means. Every way an answer can be missing or malformed is translated here, at the
edge, into :class:`gateway.errors.PolicyUnavailable`, so the dispatcher sees either a
validated decision or a refusal, and a broken OPA can never be read as an allow::

    PolicyClient.query(path, input)
    ├── unreachable / connection refused     -> PolicyUnavailable
    ├── timeout (connect, write, read, pool) -> PolicyUnavailable
    ├── any other httpx transport error      -> PolicyUnavailable
    ├── HTTP status other than 200           -> PolicyUnavailable
    ├── body not JSON / not a JSON object    -> PolicyUnavailable
    ├── no "result" key (undefined decision) -> PolicyUnavailable
    └── result not an object                 -> PolicyUnavailable
    PolicyClient.compose / execute
    └── result does not fit the decision model -> PolicyUnavailable

Messages name the policy path and what went wrong, never the input: facts carry
tenant and principal names, and errors end up in logs and agent transcripts.

Addresses are restricted to loopback IP literals and unix sockets. Policy traffic
carries who-may-do-what facts and the answer is trusted as the security decision,
so it must not leave the machine, and it must not depend on name resolution
(``localhost`` is whatever ``/etc/hosts`` or a resolver says it is).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import httpcore
import httpx
from httpcore._backends.sync import SyncStream
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidInput, PolicyUnavailable
from gateway.model.decisions import ComposeDecision, ExecuteDecision
from gateway.model.facts import ComposeInput, ExecuteInput

__all__ = [
    "CATALOGUE_DIGEST_PATH",
    "COMPOSE_PATH",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "EXECUTE_PATH",
    "PolicyClient",
]

log = logging.getLogger("capgate.opa.client")

COMPOSE_PATH: Final = "capgate/compose/decision"
EXECUTE_PATH: Final = "capgate/execute/decision"
CATALOGUE_DIGEST_PATH: Final = "capgate/catalogue/meta/digest"

#: Seconds to wait for each of write, read and a pooled connection. A decision over
#: loopback takes about a millisecond (the policies stay in Rego's linear fragment),
#: so half a second is hundreds of times the normal latency yet short enough that an
#: agent's tool call fails fast, closed, instead of hanging on a wedged OPA.
DEFAULT_TIMEOUT: Final = 0.5
#: Seconds to wait for a connection. A loopback connect either succeeds at once or is
#: refused at once; taking longer means the machine is in trouble.
DEFAULT_CONNECT_TIMEOUT: Final = 0.25

# Base URL used for unix sockets: the host is never resolved, only sent as Host header.
_UDS_BASE_URL: Final = "http://opa"
# Policy paths are fixed by the caller; refusing anything else keeps "..", "?" and
# "%2e" tricks out of the URL.
_PATH_RE: Final = re.compile(r"^[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*$")

_D = TypeVar("_D", bound=BaseModel)


@dataclass(frozen=True)
class _Endpoint:
    """Where to send requests: a base URL and, for a unix socket, its path."""

    base_url: str
    uds: str | None


def _parse_address(address: str) -> _Endpoint:
    """Accept ``http://<loopback IP>[:port]`` or ``unix:///abs/path``; refuse the rest."""
    parts = urlsplit(address)
    if parts.query or parts.fragment:
        raise ValueError(f"OPA address {address!r} must not carry a query or fragment")
    if parts.scheme == "unix":
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError(
                f"OPA address {address!r}: a unix socket address is unix:///absolute/path"
            )
        return _Endpoint(base_url=_UDS_BASE_URL, uds=parts.path)
    if parts.scheme != "http":
        raise ValueError(
            f"OPA address {address!r}: scheme must be 'http' (loopback) or 'unix'; "
            "policy traffic never leaves this machine, so TLS is not offered"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"OPA address {address!r} must not carry credentials")
    if parts.path not in ("", "/"):
        raise ValueError(f"OPA address {address!r} must not carry a path")
    host = parts.hostname or ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"OPA address {address!r}: host must be a loopback IP literal such as "
            "127.0.0.1 or [::1], not a name that a resolver could point elsewhere"
        ) from None
    if not ip.is_loopback:
        raise ValueError(
            f"OPA address {address!r}: host {host} is not a loopback address; "
            "policy traffic must not leave this machine"
        )
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(f"OPA address {address!r} has a malformed port") from None
    return _Endpoint(base_url=f"http://{parts.netloc}", uds=None)


class _UnixSocketBackend(httpcore.SyncBackend):
    """httpcore's sync backend, except that a failed unix-socket connect closes its socket.

    httpcore 1.0.9 leaves the socket open when ``connect()`` fails (refused, or no
    such file), so a dead OPA leaks one descriptor per query until the garbage
    collector finds it, and the ResourceWarning then fires in whatever code runs
    at that moment. ``connect_tcp`` uses ``socket.create_connection``, which is fine.
    """

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(path)
        except TimeoutError as exc:
            sock.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc
        return SyncStream(sock)


def _unix_transport(path: str) -> httpx.HTTPTransport:
    """httpx's own transport over a unix socket, with the closing backend above.

    httpx offers no way to pass a network backend, so its pool is replaced by an
    equal one (httpx's default limits) with that backend. ``HTTPTransport._pool`` and
    ``httpcore._backends.sync.SyncStream`` are private names: revisit on upgrade;
    the unix-socket tests fail loudly (ResourceWarning is an error) if this breaks.
    """
    transport = httpx.HTTPTransport(uds=path, retries=0)
    transport._pool = httpcore.ConnectionPool(
        uds=path,
        network_backend=_UnixSocketBackend(),
        max_connections=100,
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        retries=0,
    )
    return transport


def _check_path(path: str) -> str:
    if not _PATH_RE.fullmatch(path):
        raise ValueError(f"policy path {path!r} must be slash-separated rule names")
    return path


def _encode_input(path: str, input: dict[str, Any]) -> bytes:
    """The request body; a value that is not plain JSON is the caller's bug."""
    try:
        return json.dumps({"input": input}, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        # Name the kind of problem, not the offending value: it is part of the input.
        raise InvalidInput(
            f"input for {path} is not plain JSON ({type(exc).__name__}); OPA was not asked"
        ) from None


def _parse_answer(path: str, status: int, body: bytes) -> tuple[Any, str | None]:
    """Return ``(result, decision_id)`` from a raw OPA answer, or raise PolicyUnavailable.

    Pure: takes what came over the wire, so every malformed case is testable alone.
    """
    if status != 200:
        raise PolicyUnavailable(f"OPA answered HTTP {status}{_opa_error_code(body)} for {path}")
    try:
        document = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        raise PolicyUnavailable(f"OPA answer for {path} is not JSON") from None
    if not isinstance(document, dict):
        raise PolicyUnavailable(
            f"OPA answer for {path} is a JSON {type(document).__name__}, not an object"
        )
    decision_id = document.get("decision_id")
    if decision_id is not None and not isinstance(decision_id, str):
        raise PolicyUnavailable(f"OPA answer for {path} has a non-string decision_id")
    if "result" not in document:
        raise PolicyUnavailable(
            f"decision {path} is undefined: OPA has no such rule or it produced no value "
            "(is the right bundle loaded?)"
        )
    return document["result"], decision_id


def _opa_error_code(body: bytes) -> str:
    """OPA's own error code (e.g. ``internal_error``), without its message.

    OPA error messages can quote the values a builtin failed on, which may come from
    the input, so only the short code is passed on.
    """
    try:
        document = json.loads(body)
    except ValueError:
        return ""
    code = document.get("code") if isinstance(document, dict) else None
    if isinstance(code, str) and re.fullmatch(r"[a-z_]{1,64}", code):
        return f" ({code})"
    return ""


def _validate(path: str, model: type[_D], result: dict[str, Any], decision_id: str | None) -> _D:
    """Fit a result object to its decision model; any misfit means no decision."""
    if "decision_id" in result:
        # The id is OPA's, attached here; a policy that sets its own would mask it.
        raise PolicyUnavailable(f"decision {path} sets decision_id itself")
    try:
        return model.model_validate({**result, "decision_id": decision_id})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['type']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise PolicyUnavailable(
            f"decision {path} does not fit {model.__name__}: {problems}"
        ) from None


#: The largest answer read: a compose decision for 10,000 tools is about 2.5 MB.
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024


def _read_bounded(response: httpx.Response, path: str, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise PolicyUnavailable(f"OPA's answer to {path} is over {MAX_ANSWER_BYTES} bytes")
        if time.perf_counter() > deadline:
            raise PolicyUnavailable(f"OPA did not finish answering {path} in time")
        chunks.append(chunk)
    return b"".join(chunks)


class PolicyClient:
    """A keep-alive HTTP client for one OPA, answering with typed decisions.

    ``address`` is ``http://127.0.0.1:8181`` (any loopback IP literal, ``[::1]``
    included) or ``unix:///abs/path/opa.sock``; anything else raises ValueError here,
    before a request is sent. ``timeout`` bounds each write, read and wait for a
    pooled connection, ``connect_timeout`` the connect; a request can therefore take
    at most about ``connect_timeout + 2 * timeout``. ``transport`` replaces the
    network for tests (``httpx.MockTransport``).

    One ``httpx.Client`` is kept for the client's lifetime so decisions reuse a warm
    connection. Use it as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeouts must be positive: waiting forever would not fail closed")
        endpoint = _parse_address(address)
        if transport is None:
            transport = (
                httpx.HTTPTransport(retries=0)
                if endpoint.uds is None
                else _unix_transport(endpoint.uds)
            )
        self.address = address
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._closed = False
        self._http = httpx.Client(
            base_url=endpoint.base_url,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            # Never pick up HTTP(S)_PROXY from the environment: a proxy would carry
            # policy traffic off the machine and could answer in OPA's place.
            trust_env=False,
            follow_redirects=False,
        )

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close the pooled connections. Further queries raise PolicyUnavailable."""
        self._closed = True
        self._http.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PolicyClient({self.address!r}, timeout={self.timeout})"

    # -- decisions -------------------------------------------------------------

    def compose(self, facts: ComposeInput) -> ComposeDecision:
        """Which tools may this agent see now? One query, one typed answer."""
        # Same serialisation as ExecuteInput.to_opa: None fields are sent as null.
        result, decision_id = self.query(COMPOSE_PATH, facts.model_dump(mode="json"))
        return _validate(COMPOSE_PATH, ComposeDecision, result, decision_id)

    def execute(self, facts: ExecuteInput) -> ExecuteDecision:
        """May this exact call run? One query, one typed answer."""
        result, decision_id = self.query(EXECUTE_PATH, facts.to_opa())
        return _validate(EXECUTE_PATH, ExecuteDecision, result, decision_id)

    def query(self, path: str, input: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """POST ``input`` to ``/v1/data/<path>``; return ``(result, decision_id)``.

        The result must be a JSON object. ``decision_id`` is None when OPA runs
        without decision logging. Raises PolicyUnavailable for every failure to get
        such an answer (see the module docstring), InvalidInput if ``input`` is not
        plain JSON, and ValueError for a malformed ``path``.
        """
        _check_path(path)
        body = _encode_input(path, input)
        result, decision_id = self._ask(
            "POST",
            path,
            f"/v1/data/{path}",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        if not isinstance(result, dict):
            raise PolicyUnavailable(f"decision {path} is a {type(result).__name__}, not an object")
        return result, decision_id

    # -- checks on the OPA itself ------------------------------------------------

    def health(self, bundles: bool = True) -> bool:
        """True when OPA answers its health check (with ``bundles``: all activated).

        Answers False rather than raising: callers poll this while OPA starts.
        """
        url = "/health?bundles=true" if bundles else "/health"
        try:
            if self._closed:
                return False
            response = self._http.get(url)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def catalogue_digest(self) -> str:
        """The digest of the catalogue OPA serves, to compare with the one loaded.

        Raises PolicyUnavailable if OPA serves no catalogue or a malformed digest.
        """
        path = CATALOGUE_DIGEST_PATH
        result, _ = self._ask("GET", path, f"/v1/data/{path}")
        if not isinstance(result, str) or not result:
            raise PolicyUnavailable(f"{path} is not a non-empty string")
        return result

    # -- the edge --------------------------------------------------------------

    def _ask(self, method: str, path: str, url: str, **kwargs: Any) -> tuple[Any, str | None]:
        """Send one request and parse it; every transport failure leaves as PolicyUnavailable."""
        if self._closed:
            raise PolicyUnavailable(f"policy client is closed; {path} not asked")
        started = time.perf_counter()
        # httpx times each read, not the whole answer: an OPA (or impostor) trickling
        # bytes could hold a call for ever. Reading the body in chunks against one
        # deadline, and a size cap, bounds the whole exchange.
        deadline = started + self.connect_timeout + 2 * self.timeout
        try:
            with self._http.stream(method, url, **kwargs) as response:
                status = response.status_code
                content = _read_bounded(response, path, deadline)
        except httpx.TimeoutException as exc:
            self._log(path, started, None, type(exc).__name__)
            raise PolicyUnavailable(
                f"OPA did not answer {path} in time ({type(exc).__name__}; "
                f"timeout {self.timeout}s, connect {self.connect_timeout}s)"
            ) from exc
        except httpx.ConnectError as exc:
            self._log(path, started, None, "ConnectError")
            raise PolicyUnavailable(
                f"OPA at {self.address} is unreachable for {path}: {exc}"
            ) from exc
        except httpx.HTTPError as exc:
            self._log(path, started, None, type(exc).__name__)
            raise PolicyUnavailable(
                f"transport error asking OPA for {path}: {type(exc).__name__}: {exc}"
            ) from exc
        except PolicyUnavailable as exc:
            self._log(path, started, None, str(exc))
            raise
        try:
            result, decision_id = _parse_answer(path, status, content)
        except PolicyUnavailable:
            self._log(path, started, None, f"bad answer (HTTP {status})")
            raise
        self._log(path, started, decision_id, None)
        return result, decision_id

    @staticmethod
    def _log(path: str, started: float, decision_id: str | None, failure: str | None) -> None:
        # Path, latency and decision id only: inputs and results stay out of logs.
        ms = (time.perf_counter() - started) * 1000
        if failure is None:
            log.debug("opa %s in %.1f ms, decision_id=%s", path, ms, decision_id)
        else:
            log.debug("opa %s failed after %.1f ms: %s", path, ms, failure)
