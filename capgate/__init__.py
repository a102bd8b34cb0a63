"""capgate: policy-engine-backed authorisation for AI-agent tools.

An agent never holds a tool. It asks a :class:`Gateway`, which gathers the facts
that grant from its own store, asks OPA (compose: which tools may this agent see;
execute: may this exact call run now; review: may this person approve this
proposal), runs a tool only on an allow, records everything in a hash-chained
ledger, and fails closed on every error. :class:`AsyncGateway` is the same for
asyncio code; a :class:`Worker` dispatches the proposals reviewers approve, and a
:class:`Notifier` sends each step to the tenant's webhook, signed (:func:`verify_notice`).
:class:`Dispatcher` is the stateless enforcement core underneath it.

One import name, this one: ``from capgate import Gateway, PolicySidecar, ...``.
Beneath it, :mod:`capgate.gateway` is the core (it imports nothing else of capgate),
:mod:`capgate.adapters` the ways tools are reached (in-process, MCP), and the
command line, the MCP server and the demo sit beside them (docs/architecture.md).
"""

from capgate.adapters.fronts.session import AgentSession
from capgate.adapters.tools.gate import tool_registry
from capgate.adapters.tools.in_process import InProcessTools
from capgate.gateway.catalogue import compile_catalogue, load_catalogue
from capgate.gateway.digest import params_digest
from capgate.gateway.enforce.dispatcher import DecisionEvent, Dispatcher, PolicyDecider
from capgate.gateway.enforce.grant import Authorised, Prepared
from capgate.gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CatalogueError,
    CredentialUnavailable,
    InvalidInput,
    NoticeRejected,
    ObligationUnsupported,
    OPAProcessError,
    OperationConflict,
    PolicyUnavailable,
    ToolFailed,
    ToolNotInCatalogue,
    ToolNotRegistered,
)
from capgate.gateway.model.contracts import Catalogue, ToolContract
from capgate.gateway.model.decisions import (
    ComposeDecision,
    ExecuteDecision,
    Obligation,
    Reason,
    ReviewDecision,
)
from capgate.gateway.model.facts import (
    Approval,
    Call,
    ComposeInput,
    ConnectionStatus,
    ExecuteInput,
    Principal,
    ResourceRef,
    Reviewer,
    Stage,
    Task,
)
from capgate.gateway.model.outcomes import (
    Outcome,
    OutcomeStatus,
    ToolRefused,
    ToolRetryable,
    ToolUnknown,
)
from capgate.gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from capgate.gateway.policy.client import PolicyClient
from capgate.gateway.service.aio import AsyncGateway
from capgate.gateway.service.credentials import (
    CredentialResolver,
    EnvironmentCredentials,
    StaticCredentials,
)
from capgate.gateway.service.gateway import Gateway
from capgate.gateway.service.notices import NoticeSettings, Notifier, verify_notice
from capgate.gateway.service.requests import AgentRequest
from capgate.gateway.service.worker import Worker, WorkerEvent, WorkerSettings
from capgate.gateway.state import Store, StoreError, open_store
from capgate.gateway.state.records import (
    ProposalRecord,
    ProposalStatus,
    ReviewRecord,
    ReviewVerdict,
)
from capgate.gateway.tools.contract import Adapter, CallContext, Secret, SupportsLookup
from capgate.gateway.tools.registry import ToolRegistry
from capgate.gateway.version import __version__

__all__ = [
    "OPA_URL_ENV",
    "Adapter",
    "AgentRequest",
    "AgentSession",
    "Approval",
    "AsyncGateway",
    "Authorised",
    "Call",
    "CallContext",
    "CapabilityViolation",
    "CapgateError",
    "Catalogue",
    "CatalogueError",
    "ComposeDecision",
    "ComposeInput",
    "ConnectionStatus",
    "CredentialResolver",
    "CredentialUnavailable",
    "DecisionEvent",
    "Dispatcher",
    "EnvironmentCredentials",
    "ExecuteDecision",
    "ExecuteInput",
    "Gateway",
    "InProcessTools",
    "InvalidInput",
    "NoticeRejected",
    "NoticeSettings",
    "Notifier",
    "OPAProcessError",
    "Obligation",
    "ObligationUnsupported",
    "OperationConflict",
    "Outcome",
    "OutcomeStatus",
    "PolicyClient",
    "PolicyDecider",
    "PolicySidecar",
    "PolicyUnavailable",
    "Prepared",
    "Principal",
    "ProposalRecord",
    "ProposalStatus",
    "Reason",
    "ResourceRef",
    "ReviewDecision",
    "ReviewRecord",
    "ReviewVerdict",
    "Reviewer",
    "Secret",
    "Stage",
    "StaticCredentials",
    "Store",
    "StoreError",
    "SupportsLookup",
    "Task",
    "ToolContract",
    "ToolFailed",
    "ToolNotInCatalogue",
    "ToolNotRegistered",
    "ToolRefused",
    "ToolRegistry",
    "ToolRetryable",
    "ToolUnknown",
    "Worker",
    "WorkerEvent",
    "WorkerSettings",
    "__version__",
    "compile_catalogue",
    "load_catalogue",
    "open_store",
    "params_digest",
    "tool_registry",
    "verify_notice",
]
