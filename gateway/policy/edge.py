"""The policy client's edge: each request to one OPA, and every way of not getting an
answer turned into :class:`~capgate.gateway.errors.PolicyUnavailable`::

    Edge.ask(method, path, limits)
    ├── the client closed                      -> PolicyUnavailable
    ├── unreachable / connection refused       -> PolicyUnavailable
    ├── timeout (connect, write, read, pool)   -> PolicyUnavailable
    ├── whole exchange past its deadline       -> PolicyUnavailable
    ├── any other httpx transport error        -> PolicyUnavailable
    ├── body over the size cap                 -> PolicyUnavailable
    ├── 401: no token, or not one OPA accepts  -> PolicyUnavailable (naming which)
    └── what parse_answer and check_revision refuse (capgate.gateway.policy.answer)

One deadline for the whole exchange (:data:`~capgate.gateway.policy.wire.DEADLINE`,
set here per request): httpx times each socket operation, so an OPA or impostor
trickling bytes could otherwise hold a call for ever. With capgate's own transport
(:class:`~capgate.gateway.policy.wire.DeadlineTransport`) a question takes the
direct path, :meth:`DeadlineTransport.exchange`, without httpx's request and
response objects; any other transport (tests' ``httpx.MockTransport``) is sent the
same request through httpx's interface. Every request carries
``?provenance=true``, ``Accept-Encoding: gzip``, the current span's W3C
``traceparent`` (and ``tracestate``) when there is one
(:func:`capgate.gateway.tracing.trace_context`, for OPA's decision log and spans)
and, given one, the bearer token, which no message, log line or ``repr`` shows. Log
lines carry the path, latency and decision id, never inputs or results.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import httpx

from capgate.gateway.errors import PolicyUnavailable, cut, quote
from capgate.gateway.policy.address import OPAAddress, check_token, parse_address
from capgate.gateway.policy.answer import (
    MAX_ANSWER_BYTES,
    Envelope,
    Head,
    check_revision,
    parse_answer,
)
from capgate.gateway.policy.timeouts import RAISE_HINT, Limits
from capgate.gateway.policy.wire import DEADLINE, AnswerTooLarge, DeadlineTransport
from capgate.gateway.tracing import trace_context

__all__ = ["Edge"]

log = logging.getLogger("capgate.opa.client")

#: The content type of every request body: OPA's input document.
_JSON_BODY: Final = {"Content-Type": "application/json"}


class Edge:
    """Requests to the OPA at ``address`` (see :func:`parse_address`), each held to
    the :class:`Limits` it is asked with (``limits`` when none), through
    ``transport`` (capgate's own when None).

    ``token`` is sent as a bearer token with every request (:func:`check_token`);
    ``expected_revision``, when given, is the bundle revision every answer must
    report (:func:`check_revision`).
    """

    def __init__(
        self,
        address: OPAAddress,
        limits: Limits,
        *,
        transport: httpx.BaseTransport | None,
        token: str | None,
        expected_revision: str | None,
    ) -> None:
        headers = {"Accept-Encoding": "gzip"}
        if token is not None:
            headers["Authorization"] = f"Bearer {check_token(token)}"
        endpoint = parse_address(address.url)
        if transport is None:
            transport = DeadlineTransport(uds=endpoint.uds)
        #: The address and where it came from (an unreachable OPA's message says).
        self.location = address
        self.address = address.url
        self.has_token = token is not None
        self._limits = limits
        self._expected_revision = expected_revision
        self._closed = False
        self._headers = headers
        self._transport = transport
        # capgate's own transport takes the direct path (_exchange); any other, such
        # as a test's MockTransport, the httpx one (_send).
        self._direct = transport if isinstance(transport, DeadlineTransport) else None
        self._urls: dict[str, httpx.URL] = {}
        self._http = httpx.Client(
            base_url=endpoint.base_url,
            transport=transport,
            timeout=httpx.Timeout(limits.timeout, connect=limits.connect_timeout),
            # Never pick up HTTP(S)_PROXY from the environment: a proxy would carry
            # policy traffic off the machine and could answer in OPA's place.
            trust_env=False,
            follow_redirects=False,
            # Accept-Encoding: what OPA can send, and no more (not brotli or zstd,
            # which httpx offers when their packages happen to be installed); see
            # ENCODINGS. Authorization: the bearer token, on every request.
            headers=headers,
        )
        # What every request carries on the direct path, as _send gives httpx.
        self._raw_headers = [(name.encode(), value.encode()) for name, value in headers.items()]

    def close(self) -> None:
        """Close the pooled connections. Further requests raise PolicyUnavailable."""
        self._closed = True
        self._http.close()

    def health_problem(self, bundles: bool) -> str | None:
        """None when ``GET /health`` (with ``bundles``: every bundle active) answers 200
        within the client's own limits; else what went wrong, in a few words
        (connection refused, no answer in time, HTTP 401, HTTP 500 and OPA's reason),
        for a start-up wait to report the last one. Never raises."""
        url = "/health?bundles=true" if bundles else "/health"
        if self._closed:
            return "the policy client is closed"
        token = DEADLINE.set(time.monotonic() + self._limits.whole)
        try:
            response = self._http.get(url, headers=trace_context())
        except httpx.TimeoutException:
            return f"no answer in time ({self._limits.describe()})"
        except httpx.HTTPError as exc:
            return f"not reachable: {cut(str(exc) or type(exc).__name__, 200)}"
        finally:
            DEADLINE.reset(token)
        status = response.status_code
        if status == 200:
            return None
        if status == 401:
            return f"HTTP 401: {self._refused_hint()}"
        reason = _health_reason(response)
        if status == 500 and "bundle" in reason:
            return f"no bundle active yet, or none that verifies (HTTP 500: {quote(reason)})"
        return f"HTTP {status}" + (f": {quote(reason)}" if reason else "")

    def ask(
        self, method: str, path: str, limits: Limits | None = None, content: bytes | None = None
    ) -> Envelope:
        """Send one request for ``/v1/data/<path>`` and parse the answer.

        ``content`` is the JSON body of a POST. Every failure leaves as
        PolicyUnavailable, logged with the path and latency.
        """
        if self._closed:
            raise PolicyUnavailable(f"policy client is closed; {path} not asked")
        limits = limits or self._limits
        url = f"/v1/data/{path}"
        headers = _JSON_BODY if content is not None else None
        traced = trace_context()
        if traced:  # OPA's decision log names the trace (capgate.gateway.tracing)
            headers = {**(headers or {}), **traced}
        started = time.perf_counter()
        # The transport holds every connect, write and read to the deadline.
        deadline = time.monotonic() + limits.whole
        token = DEADLINE.set(deadline)
        try:
            if self._direct is not None:
                head, body = self._exchange(
                    self._direct, method, path, url, limits.timeouts, content, headers
                )
            else:
                response = self._send(method, url, limits.timeouts, content, headers)
                try:
                    head = Head(
                        response.status_code,
                        response.http_version,
                        response.headers.get("content-type"),
                        response.headers.get("content-encoding"),
                    )
                    body = _read_bounded(response, path, deadline, limits)
                finally:
                    response.close()
        except httpx.TimeoutException as exc:
            self._log(path, started, None, type(exc).__name__)
            raise PolicyUnavailable(
                f"OPA did not answer {path} in time ({type(exc).__name__}; "
                f"{limits.describe()}); {RAISE_HINT}"
            ) from exc
        except httpx.ConnectError as exc:
            self._log(path, started, None, "ConnectError")
            raise PolicyUnavailable(
                f"{self.location.describe()} is unreachable: {exc}; "
                f"{self.location.advice()} (asking {path})"
            ) from exc
        except httpx.HTTPError as exc:
            self._log(path, started, None, type(exc).__name__)
            raise PolicyUnavailable(
                f"transport error asking OPA for {path}: {type(exc).__name__}: {exc}"
            ) from exc
        except PolicyUnavailable as exc:
            self._log(path, started, None, str(exc))
            raise
        finally:
            DEADLINE.reset(token)
        try:
            envelope = parse_answer(path, head, body)
            check_revision(path, envelope, self._expected_revision)
        except PolicyUnavailable as exc:
            self._log(path, started, None, f"bad answer (HTTP {head.status})")
            if head.status == 401:
                raise PolicyUnavailable(f"{exc}: {self._refused_hint()}") from None
            raise
        self._log(path, started, envelope.decision_id, None)
        return envelope

    def _exchange(
        self,
        transport: DeadlineTransport,
        method: str,
        path: str,
        url: str,
        timeouts: dict[str, float | None],
        content: bytes | None,
        headers: dict[str, str] | None,
    ) -> tuple[Head, bytes]:
        """One exchange through capgate's own transport, skipping httpx's models.

        The request is the one :meth:`_send` would build (same URL, the client's
        headers and the request's, Host and Content-Length as httpx sets them, no
        redirect followed), and the answer is held to the same size cap; building
        and reading httpx's request and response objects cost about a tenth of an
        authorised call in Python (docs/benchmarks.md). Other transports (tests'
        ``httpx.MockTransport``) go through :meth:`_send`.
        """
        target = self._target(url)
        sent = [(b"Host", target.netloc), *self._raw_headers]
        sent += [
            (name.encode("ascii"), value.encode("ascii")) for name, value in (headers or {}).items()
        ]
        if content is not None:
            sent.append((b"Content-Length", str(len(content)).encode("ascii")))
        try:
            answer = transport.exchange(method, target, sent, content, timeouts, MAX_ANSWER_BYTES)
        except AnswerTooLarge:
            raise PolicyUnavailable(
                f"OPA's answer to {path} is over {MAX_ANSWER_BYTES} bytes"
            ) from None
        head = Head(
            answer.status, answer.http_version, answer.content_type, answer.content_encoding
        )
        return head, answer.body

    def _target(self, url: str) -> httpx.URL:
        """The absolute URL of a policy path, with ``?provenance=true``, parsed once."""
        target = self._urls.get(url)
        if target is None:
            target = self._urls[url] = self._http.base_url.join(url).copy_merge_params(
                {"provenance": "true"}
            )
        return target

    def _send(
        self,
        method: str,
        url: str,
        timeouts: dict[str, float | None],
        content: bytes | None,
        headers: dict[str, str] | None,
    ) -> httpx.Response:
        """One request straight to the transport, bypassing ``httpx.Client.send``.

        The client's machinery (URL merging and parsing, cookies, auth flows,
        redirects, event hooks) does nothing for a fixed loopback OPA, and costs a
        third of a decision's time in Python (docs/benchmarks.md). The request is
        what the client would build: its headers (Accept-Encoding, the token), its
        timeouts, ``?provenance=true``, and no redirect followed (a 3xx is an answer
        that is not 200, refused). The URL of each policy path is parsed once.
        """
        target = self._target(url)
        request = httpx.Request(
            method,
            target,
            headers={**self._headers, **(headers or {})},
            extensions={"timeout": timeouts},
            content=content,
        )
        response = self._transport.handle_request(request)
        response.request = request
        return response

    def _refused_hint(self) -> str:
        if self.has_token:
            return (
                "OPA refused this client's token; is it the gateway token of the "
                "deployment whose bundle OPA serves?"
            )
        return (
            "OPA requires a token (it runs with --authentication=token); give the "
            "gateway's token with $CAPGATE_OPA_TOKEN_FILE or $CAPGATE_OPA_TOKEN"
        )

    @staticmethod
    def _log(path: str, started: float, decision_id: str | None, failure: str | None) -> None:
        # Path, latency and decision id only: inputs and results stay out of logs.
        ms = (time.perf_counter() - started) * 1000
        if failure is None:
            log.debug("opa %s in %.1f ms, decision_id=%s", path, ms, decision_id)
        else:
            log.debug("opa %s failed after %.1f ms: %s", path, ms, failure)


def _health_reason(response: httpx.Response) -> str:
    """OPA's ``{"error": ...}`` of a health answer that is not 200, or ``""``."""
    try:
        error = response.json().get("error", "")
    except (ValueError, AttributeError):
        return ""
    return error if isinstance(error, str) else ""


def _read_bounded(response: httpx.Response, path: str, deadline: float, limits: Limits) -> bytes:
    """The whole body, within the size cap and the deadline, or PolicyUnavailable.

    The size cap counts decoded bytes, so a small compressed body cannot inflate past
    it. The deadline is also enforced below, by the transport's socket; checking it
    here as well covers transports without that socket (tests pass their own).
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise PolicyUnavailable(f"OPA's answer to {path} is over {MAX_ANSWER_BYTES} bytes")
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise PolicyUnavailable(f"OPA's answer to {path} is over {MAX_ANSWER_BYTES} bytes")
        if time.monotonic() > deadline:
            raise PolicyUnavailable(
                f"OPA did not finish answering {path} in time ({limits.describe()}); {RAISE_HINT}"
            )
        chunks.append(chunk)
    return b"".join(chunks)
