"""capgate: policy-engine-backed authorisation for AI-agent tools.

An agent never holds a tool. It asks a :class:`Dispatcher`, which asks OPA two
questions (compose: which tools may this agent see; execute: may this exact call
run now), runs the tool only on an allow, and fails closed on every error.
"""

from gateway.catalogue import compile_catalogue, load_catalogue
from gateway.digest import params_digest
from gateway.dispatch.agent import AgentSession
from gateway.dispatch.dispatcher import DecisionEvent, Dispatcher, PolicyDecider
from gateway.dispatch.registry import ToolRegistry
from gateway.dispatch.transport import Adapter, CallContext
from gateway.errors import (
    CapabilityViolation,
    CapgateError,
    CatalogueError,
    InvalidInput,
    ObligationUnsupported,
    OPAProcessError,
    PolicyUnavailable,
    ToolFailed,
    ToolNotInCatalogue,
    ToolNotRegistered,
)
from gateway.model.contracts import Catalogue, ToolContract
from gateway.model.decisions import ComposeDecision, ExecuteDecision, Obligation, Reason
from gateway.model.facts import (
    Approval,
    Call,
    ComposeInput,
    ExecuteInput,
    Principal,
    ResourceRef,
    Task,
)
from gateway.model.outcomes import Outcome, OutcomeStatus, ToolRefused, ToolRetryable
from gateway.opa.client import PolicyClient
from gateway.opa.sidecar import OPA_URL_ENV, PolicySidecar
from gateway.version import __version__

__all__ = [
    "OPA_URL_ENV",
    "Adapter",
    "AgentSession",
    "Approval",
    "Call",
    "CallContext",
    "CapabilityViolation",
    "CapgateError",
    "Catalogue",
    "CatalogueError",
    "ComposeDecision",
    "ComposeInput",
    "DecisionEvent",
    "Dispatcher",
    "ExecuteDecision",
    "ExecuteInput",
    "InvalidInput",
    "OPAProcessError",
    "Obligation",
    "ObligationUnsupported",
    "Outcome",
    "OutcomeStatus",
    "PolicyClient",
    "PolicyDecider",
    "PolicySidecar",
    "PolicyUnavailable",
    "Principal",
    "Reason",
    "ResourceRef",
    "Task",
    "ToolContract",
    "ToolFailed",
    "ToolNotInCatalogue",
    "ToolNotRegistered",
    "ToolRefused",
    "ToolRegistry",
    "ToolRetryable",
    "__version__",
    "compile_catalogue",
    "load_catalogue",
    "params_digest",
]
