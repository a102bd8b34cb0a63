"""Streamable HTTP on loopback, behind bearer tokens that map to bindings.

The app is the MCP SDK's streamable-HTTP session manager at ``/mcp``, wrapped in the
SDK's bearer-token middleware with a verifier of our own: a token is hashed and
compared, in constant time, with every ``token_sha256`` of the configuration
(:meth:`ServeConfig.token_binding <capgate.adapters.fronts.mcp.config.ServeConfig.token_binding>`).
A request without a token, or with one no binding holds, gets ``401`` before the MCP
layer sees it: no session, no tool list. An accepted request carries the binding's
*name*, never the token, from there on: the SDK's ``AccessToken`` holds the name,
so no log line, session record or tool call downstream can hold the token, and the
registry's adapters (in-process tools, upstream MCP servers) are never given it. A
session belongs to the binding that opened it (the SDK answers 404 to another).

The server listens on a loopback address only (``127.0.0.1``, any ``127.x.y.z``, or
``::1``) and checks the ``Host`` and ``Origin`` headers against it (the SDK's DNS
rebinding protection), so a web page in a browser on the same machine cannot reach
it through a name it controls.

Beside ``/mcp``, without a token: the liveness and readiness probes ``/healthz`` and
``/readyz`` (:mod:`capgate.adapters.fronts.mcp.probes`).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import BaseRoute, Mount, Route

from capgate.adapters.fronts.mcp.config import ServeConfig
from capgate.adapters.fronts.mcp.probes import probe_routes
from capgate.adapters.fronts.mcp.server import GatewayMCP
from capgate.gateway.errors import InvalidInput, quote
from capgate.gateway.service.health import Readiness

if TYPE_CHECKING:
    from capgate.adapters.fronts.metrics import GatewayMetrics

__all__ = ["MCP_PATH", "BindingVerifier", "http_app", "loopback_socket", "parse_listen_address"]

log = logging.getLogger("capgate.serve")

#: Where the MCP endpoint is served.
MCP_PATH: Final = "/mcp"
#: Where the Prometheus metrics are, when the configuration asks for them.
METRICS_PATH: Final = "/metrics"


class BindingVerifier:
    """The SDK's ``TokenVerifier`` over the configuration's token digests."""

    def __init__(self, config: ServeConfig) -> None:
        self._config = config

    async def verify_token(self, token: str) -> AccessToken | None:
        binding = self._config.token_binding(token)
        if binding is None:
            log.info("refused a bearer token that no binding holds")
            return None
        # The binding's name stands in for the token from here on.
        return AccessToken(
            token=f"binding:{binding.name}",
            client_id=binding.name,
            subject=binding.name,
            scopes=[],
        )


def parse_listen_address(text: str) -> tuple[str, int]:
    """``127.0.0.1:8765`` or ``[::1]:8765`` (port 0: any free port) to (host, port).

    Only loopback IP literals: a name could resolve anywhere, and anything else would
    let other machines reach the gateway.
    """
    host, _, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidInput(
            f"--http {quote(text)}: give a loopback IP address and a port, such as "
            "127.0.0.1:8765 or [::1]:8765 (no host names)"
        ) from None
    if not address.is_loopback:
        raise InvalidInput(
            f"--http {quote(text)}: capgate serves MCP over HTTP on loopback only "
            "(127.0.0.1 or ::1); put a TLS proxy in front of it to reach it from elsewhere"
        )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidInput(f"--http {quote(text)}: the port is a number from 0 to 65535")
    return str(address), int(port_text)


@contextmanager
def loopback_socket(host: str, port: int) -> Iterator[socket.socket]:
    """A listening TCP socket on ``host:port`` (port 0: the kernel picks one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
        yield sock
    finally:
        sock.close()


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


def http_app(
    service: GatewayMCP,
    config: ServeConfig,
    *,
    port: int,
    readiness: Readiness | None = None,
    metrics: GatewayMetrics | None = None,
) -> Starlette:
    """The ASGI app: bearer authentication, then the SDK's session manager; the
    review inbox at ``/inbox`` when the configuration names people to sign in;
    given ``readiness``, the probes ``/healthz`` and ``/readyz``
    (:mod:`capgate.adapters.fronts.mcp.probes`); given ``metrics``, ``/metrics``."""
    hosts = [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{host}" for host in hosts],
    )
    manager = StreamableHTTPSessionManager(app=service.server, security_settings=security)
    endpoint = RequireAuthMiddleware(StreamableHTTPASGIApp(manager), required_scopes=[])
    routes: list[BaseRoute] = [Route(MCP_PATH, endpoint=endpoint)]
    if readiness is not None:
        routes.extend(probe_routes(readiness))
    if config.people and config.inbox.enabled:
        from capgate.adapters.fronts.inbox.app import INBOX_PATH, Inbox

        inbox = Inbox(service.desk, config.people_directory(), config.inbox, hosts=hosts)
        routes.append(Mount(INBOX_PATH, app=inbox.app()))
    if metrics is not None:
        routes.append(
            Route(METRICS_PATH, endpoint=_metrics_endpoint(metrics, config), methods=["GET"])
        )
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(
                AuthenticationMiddleware, backend=BearerAuthBackend(BindingVerifier(config))
            ),
            Middleware(AuthContextMiddleware),
        ],
        lifespan=lambda _app: manager.run(),
    )


def _metrics_endpoint(metrics: GatewayMetrics, config: ServeConfig) -> Any:
    """``GET /metrics``: the exposition, behind the configured token if there is one."""
    from starlette.requests import Request
    from starlette.responses import Response

    from capgate.adapters.fronts.metrics import CONTENT_TYPE

    assert config.metrics is not None
    token = config.metrics.token_sha256

    async def endpoint(request: Request) -> Response:
        if token is not None and not metrics.token_matches(
            request.headers.get("authorization"), token
        ):
            return Response("unauthorized\n", status_code=401, media_type="text/plain")
        body = await anyio.to_thread.run_sync(metrics.exposition)  # the store's gauges
        return Response(body, media_type=CONTENT_TYPE)

    return endpoint


async def serve_http(
    service: GatewayMCP,
    config: ServeConfig,
    sock: socket.socket,
    readiness: Readiness | None = None,
    metrics: GatewayMetrics | None = None,
) -> None:
    """Serve on ``sock`` until interrupted (Ctrl-C, SIGTERM)."""
    import uvicorn  # the SDK's own dependency; imported here, used here only

    app = http_app(
        service, config, port=sock.getsockname()[1], readiness=readiness, metrics=metrics
    )
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_config=None,  # capgate's logging, not uvicorn's
            access_log=False,
            server_header=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
    )
    print(f"capgate serve: MCP over HTTP at {url_of(sock)}", file=sys.stderr, flush=True)
    if config.people and config.inbox.enabled:
        inbox = url_of(sock).removesuffix(MCP_PATH) + "/inbox/"
        print(f"capgate serve: review inbox at {inbox}", file=sys.stderr, flush=True)
    await server.serve(sockets=[sock])
