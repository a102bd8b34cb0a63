"""The server's configuration: who each caller is, and where the tools come from.

An MCP client can say nothing about who it is: the principal (agent, role, tenant),
the task and the environment of every request come from this file, never from a
tool's arguments. Over stdio the one binding under ``stdio`` applies to the process
(one client, the one that started it); over HTTP each bearer token maps to a binding,
and the file holds only the SHA-256 digest of each token, so reading it does not
give anyone a token::

    tools: capgate.demo.tools.sales_desk:SalesDesk
    upstreams: "files=npx -y @modelcontextprotocol/server-filesystem /srv/files"
    credentials: environment
    stdio:
      principal: {agent: sales-bot, role: sales, tenant: acme}
      task: {type: customer_quote, id: task-17}
      environment: production
    http:
      - name: ada-laptop
        token_sha256: 5e88...      # sha256 of the token, 64 hex digits
        principal: {agent: ada-assistant, role: support, tenant: acme}
        task: {type: customer_quote, id: task-18}
        environment: production

The file is YAML (JSON is YAML too), read strictly: a key given twice in one
mapping, an unknown key, a malformed digest or a digest given twice is an error
naming where. ``tools`` (one entry point or a list) names ``module:attribute``
objects whose ``tools()`` returns an :class:`~capgate.gateway.tools.contract.Adapter`;
they are imported and called, so the file is as trusted as code: it is refused when
others than its owner may write it. ``upstreams`` (optional) names MCP servers in the
``MCP_SERVERS`` syntax of :mod:`capgate.adapters.tools.mcp.config`, whose tools the catalogue maps
(not given: the ``MCP_SERVERS`` gate of the environment); ``reconcile_seconds`` how
often unknown outcomes are looked up while serving; ``lease_seconds`` how long a
running operation whose runner stopped renewing it is left alone before it may be
taken over; ``worker`` how the execution worker dispatches approved proposals
(:class:`~capgate.gateway.service.worker.WorkerSettings`). ``capgate worker`` reads
the same file for the same adapters, servers and credentials (its bindings unused)::

    worker:
      poll_seconds: 0.5        # SQLite: how often to look for approved proposals
      concurrency: 4           # proposals dispatched at once
      max_attempts: 5          # attempts of a retryable operation
      first_backoff_seconds: 1
      longest_backoff_seconds: 300

``opa_tracing`` (optional) turns on the embedded OPA's distributed tracing: its spans
join the gateway's trace, exported to an OTLP/HTTP collector
(:mod:`capgate.gateway.opa.traces`; with ``--opa``, an external OPA's own
configuration says, and the key is refused)::

    opa_tracing:
      address: 127.0.0.1:4318  # the collector's OTLP/HTTP host:port
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import os
import stat
from collections.abc import Hashable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from capgate.adapters.fronts.inbox.settings import InboxSettings
from capgate.adapters.fronts.mcp.awaiting import DEFAULT_AWAIT_SECONDS
from capgate.adapters.fronts.people import (
    OidcSettings,
    OperatorEntry,
    People,
    PeopleConfig,
    PersonEntry,
)
from capgate.adapters.tools.mcp.config import ServerSpec, parse_servers
from capgate.gateway.errors import CapgateError, ConfigError, InvalidInput, quote
from capgate.gateway.model.facts import Identifier
from capgate.gateway.opa.traces import OPATracing
from capgate.gateway.service.credentials import (
    CredentialResolver,
    EnvironmentCredentials,
    NoCredentials,
)
from capgate.gateway.service.gateway import DEFAULT_LEASE
from capgate.gateway.service.health import DEFAULT_CHECK_TIMEOUT
from capgate.gateway.service.notices.settings import NoticeSettings
from capgate.gateway.service.recovery import DEFAULT_RECONCILE_SECONDS
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.service.worker import WorkerSettings
from capgate.gateway.tools.contract import Adapter

__all__ = [
    "DEFAULT_POLL_SECONDS",
    "Binding",
    "HttpBinding",
    "OpaTracingSettings",
    "ServeConfig",
    "bindings_of",
    "load_config",
    "parse_config",
    "token_digest",
]

#: How often each session composes again to notice that its visible set changed.
DEFAULT_POLL_SECONDS: Final = 1.0
_HEX64: Final = r"^[0-9a-f]{64}$"


def token_digest(token: str) -> str:
    """The SHA-256 digest (hex) of a bearer token, as ``token_sha256`` holds it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricsSettings(_Strict):
    """``metrics:``: serve ``/metrics`` (:mod:`capgate.adapters.fronts.metrics`)."""

    #: The SHA-256 of the bearer token a scraper must send; none: anyone on loopback.
    token_sha256: str | None = Field(default=None, pattern=_HEX64)
    #: A ``tenant`` label on decisions, outcomes and budgets: one series per tenant,
    #: which only an operator who knows how many tenants there are should ask for.
    tenant_labels: bool = False


class OpaTracingSettings(_Strict):
    """``opa_tracing:``: the embedded OPA's distributed tracing
    (:mod:`capgate.gateway.opa.traces`): its spans, children of the gateway's, to the
    OTLP/HTTP collector at ``address`` (host:port)."""

    address: str
    service_name: str = "opa"
    sample_percentage: int = Field(default=0, ge=0, le=100)
    encryption: Literal["off", "tls"] = "off"

    @model_validator(mode="after")
    def _usable(self) -> OpaTracingSettings:
        self.tracing()  # ValueError (naming the field) for what OPA would misread
        return self

    def tracing(self) -> OPATracing:
        return OPATracing(
            address=self.address,
            service_name=self.service_name,
            sample_percentage=self.sample_percentage,
            encryption=self.encryption,
        )


class Binding(AgentRequest):
    """Who a caller is: the agent request every call of theirs is made with.

    An :class:`AgentRequest` itself (same fields, same checks: the task needs its id),
    so that the file cannot say more about a caller than a library caller can.
    """

    @model_validator(mode="before")
    @classmethod
    def _not_said_by_the_file(cls, data: Any) -> Any:
        # How a caller was authenticated is the front's to say, never the file's.
        if isinstance(data, dict) and "authenticated_by" in data:
            raise ValueError("authenticated_by is not a binding's field: the server records it")
        return data

    @property
    def request(self) -> AgentRequest:
        """The request every call of this caller is made with (this binding's own
        fields, without the binding's extras such as an HTTP token's name), saying
        how the caller was authenticated: over stdio, by starting the server."""
        return AgentRequest(
            principal=self.principal,
            task=self.task,
            environment=self.environment,
            authenticated_by="stdio",
        )


class HttpBinding(Binding):
    """A bearer token's binding. ``name`` identifies it in logs and sessions."""

    name: Identifier
    token_sha256: str = Field(pattern=_HEX64)

    @property
    def request(self) -> AgentRequest:
        """As :attr:`Binding.request`, authenticated by this binding's bearer token."""
        return AgentRequest(
            principal=self.principal,
            task=self.task,
            environment=self.environment,
            authenticated_by=f"token:{self.name}",
        )


class ServeConfig(_Strict):
    """The whole file. ``stdio`` is needed for ``--stdio``, ``http`` for ``--http``."""

    tools: list[str] = Field(min_length=1)
    #: Upstream MCP servers, in ``MCP_SERVERS`` syntax (docs/mcp-upstreams.md): their
    #: tools run through :class:`capgate.adapters.tools.mcp.McpTools`, after the ``tools`` adapters.
    #: Not given: the ``MCP_SERVERS`` / ``MCP_ORACLE`` gate of the environment.
    upstreams: str | None = None
    #: How often the gateway reconciles while it serves: operations left running by
    #: a dead process become unknown, unknown ones are looked up.
    reconcile_seconds: float = Field(default=DEFAULT_RECONCILE_SECONDS, gt=0, le=86400)
    #: How long a running operation is left alone before it may be reconciled or
    #: taken over (a live runner renews it every third of it).
    lease_seconds: float = Field(default=DEFAULT_LEASE.total_seconds(), gt=0, le=86400)
    #: How the execution worker works (``capgate serve`` runs one unless
    #: ``--no-worker``; ``capgate worker`` runs one alone).
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    #: Signed webhook notices per tenant (docs/notices.md); none when not given.
    notices: NoticeSettings | None = None
    credentials: str = "environment"
    list_changed_poll_seconds: float = Field(default=DEFAULT_POLL_SECONDS, gt=0, le=3600)
    #: How long one round of a reviewed call that awaits its decision waits before it
    #: answers input_required again (MCP 2026-07-28; fronts/mcp/awaiting.py).
    await_review_seconds: float = Field(default=DEFAULT_AWAIT_SECONDS, gt=0, le=300)
    #: How long ``/readyz`` waits for its checks (OPA, the store, the worker) before
    #: it answers 503 naming those that did not answer.
    readiness_timeout_seconds: float = Field(default=DEFAULT_CHECK_TIMEOUT, gt=0, le=60)
    #: Threads running tool calls (each runs a call to its end) and decisions (lists,
    #: compose polls): two pools, so slow tools cannot hold up listing.
    max_concurrent_calls: int = Field(default=32, ge=1, le=1024)
    max_concurrent_decisions: int = Field(default=16, ge=1, le=1024)
    stdio: Binding | None = None
    http: list[HttpBinding] = Field(default_factory=list)
    #: The people who review, how ID tokens are verified, and who the command line
    #: acts as (:mod:`capgate.adapters.fronts.people`).
    people: list[PersonEntry] = Field(default_factory=list)
    oidc: OidcSettings | None = None
    operators: list[OperatorEntry] = Field(default_factory=list)
    #: The review inbox served beside ``/mcp`` (:mod:`capgate.adapters.fronts.inbox`).
    inbox: InboxSettings = Field(default_factory=InboxSettings)
    #: Prometheus metrics at ``/metrics`` of the HTTP port (``capgate[metrics]``).
    metrics: MetricsSettings | None = None
    #: The embedded OPA's distributed tracing (off when not given); an external OPA's
    #: is set in its own configuration.
    opa_tracing: OpaTracingSettings | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("tools")
    @classmethod
    def _entry_points(cls, value: list[str]) -> list[str]:
        for entry in value:
            module, _, attribute = entry.partition(":")
            if not module or not attribute:
                raise ValueError(f"{quote(entry)} is not an entry point (module.path:attribute)")
        return value

    @field_validator("upstreams")
    @classmethod
    def _upstreams(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_servers(value)
            except CapgateError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("credentials")
    @classmethod
    def _credentials(cls, value: str) -> str:
        if value not in ("environment", "none") and ":" not in value:
            raise ValueError(
                "credentials: 'environment' (CAPGATE_SECRET_<TENANT>__<ALIAS>, as "
                "`capgate connections variable` names it), 'none', or an entry point "
                "module.path:attribute giving a CredentialResolver"
            )
        return value

    @model_validator(mode="after")
    def _unique_tokens_and_names(self) -> ServeConfig:
        for field in ("name", "token_sha256"):
            seen: set[str] = set()
            for position, binding in enumerate(self.http):
                value = getattr(binding, field)
                if value in seen:
                    what = "token digest" if field == "token_sha256" else "name"
                    raise ValueError(f"http[{position}]: the same {what} is given twice")
                seen.add(value)
        PeopleConfig(people=self.people, oidc=self.oidc, operators=self.operators)
        agents = {binding.token_sha256 for binding in self.http}
        for position, person in enumerate(self.people):
            if person.token_sha256 in agents:
                raise ValueError(
                    f"people[{position}].token_sha256: an agent binding (http) holds the "
                    "same token: one token, one identity"
                )
        return self

    # -- use ---------------------------------------------------------------------------

    @property
    def lease(self) -> timedelta:
        """``lease_seconds``, as the gateway takes it."""
        return timedelta(seconds=self.lease_seconds)

    def token_binding(self, token: str) -> HttpBinding | None:
        """The binding of a bearer token, or None.

        Every digest is compared, in constant time and without stopping at a match,
        so how long an answer takes says nothing about which digest, if any, matched.
        """
        digest = token_digest(token).encode("ascii")
        found: HttpBinding | None = None
        for binding in self.http:
            if hmac.compare_digest(digest, binding.token_sha256.encode("ascii")):
                found = binding
        return found

    def people_directory(self) -> People:
        """The people of this file, who reviewers and operators are authenticated as."""
        return People(
            PeopleConfig(people=self.people, oidc=self.oidc, operators=self.operators),
            agent_token_digests=frozenset(b.token_sha256 for b in self.http),
        )

    def upstream_servers(self) -> list[ServerSpec]:
        """The upstream MCP servers ``upstreams`` names (none when it is not given)."""
        return parse_servers(self.upstreams) if self.upstreams else []

    def adapters(self) -> list[Adapter]:
        """Import each ``tools`` entry point and return its adapter, in order."""
        return [_adapter(entry) for entry in self.tools]

    def credential_resolver(self) -> CredentialResolver:
        if self.credentials == "environment":
            return EnvironmentCredentials()
        if self.credentials == "none":
            return NoCredentials()
        resolver = _instance(self.credentials)
        if not isinstance(resolver, CredentialResolver):
            raise ConfigError(
                f"credentials: {quote(self.credentials)} gives no CredentialResolver "
                "(an object with resolve(tenant, alias))"
            )
        return resolver


# -- loading ----------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a key given twice in one mapping (plain
    YAML keeps the last one silently: a second ``role:`` would win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {quote(key)} is given twice", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, where: str = "the configuration") -> ServeConfig:
    """Validate configuration text (YAML or JSON); raise ConfigError naming each problem."""
    loader = _StrictLoader(text)
    try:
        raw = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{where}{at}: {problem}") from None
    finally:
        loader.dispose()
    try:
        return ServeConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(str(InvalidInput.from_validation(exc, where))) from None


def load_config(path: Path, *, runs_code: bool = True) -> ServeConfig:
    """Read and validate the file at ``path``.

    Refused when it is not a regular file or when its group or others may write
    it: its entry points run as this process, and it says who people are. A
    process that runs its entry points also refuses a file another user owns; one
    that only reads who people are (``runs_code=False``: the command line looking
    up its operator) accepts the file of root as well, the usual owner of a shared
    configuration.
    """
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{path}: cannot read: {reason}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: not a regular file")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{path}: others may write it, and its entry points run as this process: "
            f"chmod go-w {path}"
        )
    if info.st_uid != os.getuid() and (runs_code or info.st_uid != 0):
        raise ConfigError(f"{path}: owned by another user; it names code this process runs")
    return parse_config(text, str(path))


def _instance(entry: str) -> object:
    """The object an entry point names: a class is instantiated without arguments, a
    function called, anything else used as it is."""
    module_name, _, attribute = entry.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except ImportError as exc:
        raise ConfigError(f"entry point {quote(entry)}: cannot import {exc.name!r}") from None
    except AttributeError:
        raise ConfigError(f"entry point {quote(entry)}: no attribute {quote(attribute)}") from None
    if isinstance(target, type) or (callable(target) and not hasattr(target, "tools")):
        try:
            return target()
        except Exception as exc:
            raise ConfigError(
                f"entry point {quote(entry)}: calling it failed ({type(exc).__name__})"
            ) from None
    return target


def _adapter(entry: str) -> Adapter:
    holder = _instance(entry)
    make = getattr(holder, "tools", None)
    if not callable(make):
        raise ConfigError(f"tools: {quote(entry)} has no tools() method")
    adapter = make()
    if not isinstance(adapter, Adapter):
        raise ConfigError(f"tools: {quote(entry)}.tools() returned no Adapter")
    return adapter


def bindings_of(config: ServeConfig) -> Sequence[Binding]:
    """Every binding of the file: the stdio one, then the HTTP ones."""
    return [*([config.stdio] if config.stdio else []), *config.http]
