"""capgate: policy-engine-backed authorisation for AI-agent tools.

An agent never holds a tool. It asks a :class:`Gateway`, which gathers the facts
that grant from its own store, asks OPA (compose: which tools may this agent see;
execute: may this exact call run now; review: may this person approve this
proposal), runs a tool only on an allow, records everything in a hash-chained
ledger, and fails closed on every error. :class:`AsyncGateway` is the same for
asyncio code. :class:`Dispatcher` is the stateless enforcement core underneath it.
"""

from gateway.catalogue import compile_catalogue, load_catalogue
from gateway.digest import params_digest
from gateway.dispatch.dispatcher import (
    Authorised,
    DecisionEvent,
    Dispatcher,
    PolicyDecider,
    Prepared,
)
from gateway.dispatch.registry import ToolRegistry
from gateway.dispatch.transport import Adapter, CallContext, Secret, SupportsLookup
from gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CatalogueError,
    CredentialUnavailable,
    InvalidInput,
    ObligationUnsupported,
    OPAProcessError,
    OperationConflict,
    PolicyUnavailable,
    ToolFailed,
    ToolNotInCatalogue,
    ToolNotRegistered,
)
from gateway.model.contracts import Catalogue, ToolContract
from gateway.model.decisions import (
    ComposeDecision,
    ExecuteDecision,
    Obligation,
    Reason,
    ReviewDecision,
)
from gateway.model.facts import (
    Approval,
    Call,
    ComposeInput,
    ConnectionStatus,
    ExecuteInput,
    Principal,
    ResourceRef,
    Stage,
    Task,
)
from gateway.model.outcomes import Outcome, OutcomeStatus, ToolRefused, ToolRetryable, ToolUnknown
from gateway.opa.client import PolicyClient
from gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from gateway.service.agent import AgentSession
from gateway.service.aio import AsyncGateway
from gateway.service.credentials import (
    CredentialResolver,
    EnvironmentCredentials,
    StaticCredentials,
)
from gateway.service.gateway import Gateway
from gateway.service.requests import AgentRequest
from gateway.state import Store, StoreError, open_store
from gateway.state.records import ProposalRecord, ProposalStatus, ReviewRecord, ReviewVerdict
from gateway.version import __version__

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
    "InvalidInput",
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
    "__version__",
    "compile_catalogue",
    "load_catalogue",
    "open_store",
    "params_digest",
]
