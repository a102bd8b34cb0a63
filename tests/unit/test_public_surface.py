"""Pin the public API: adding or removing a name must be a deliberate change."""

import capgate
from capgate.gateway.errors import CapgateError

EXPECTED = {
    "OPA_URL_ENV", "Adapter", "AgentRequest", "AgentSession", "Approval", "AsyncGateway",
    "Authorised", "Call", "CallContext", "CapabilityViolation", "CapgateError", "Catalogue",
    "CatalogueError",
    "ComposeDecision", "ComposeInput", "ConnectionStatus", "CredentialResolver",
    "CredentialUnavailable", "DecisionEvent", "Dispatcher", "EnvironmentCredentials",
    "ExecuteDecision", "ExecuteInput", "Gateway", "InvalidInput", "OPAProcessError",
    "Obligation", "ObligationUnsupported", "OperationConflict", "Outcome", "OutcomeStatus",
    "PolicyClient", "PolicyDecider", "PolicySidecar", "PolicyUnavailable", "Prepared",
    "Principal", "ProposalRecord", "ProposalStatus", "Reason", "ResourceRef", "ReviewDecision",
    "ReviewRecord", "ReviewVerdict", "Reviewer", "Secret", "Stage", "StaticCredentials", "Store",
    "StoreError", "SupportsLookup", "Task", "ToolContract", "ToolFailed", "ToolNotInCatalogue",
    "ToolNotRegistered", "ToolRefused", "ToolRegistry", "ToolRetryable", "ToolUnknown",
    "InProcessTools", "tool_registry", "Worker", "WorkerEvent", "WorkerSettings",
    "Notifier", "NoticeSettings", "NoticeRejected", "verify_notice",
    "compile_catalogue", "load_catalogue", "open_store", "params_digest", "__version__",
}  # fmt: skip


def test_all_is_pinned():
    assert set(capgate.__all__) == EXPECTED


def test_every_exported_name_exists():
    missing = [name for name in capgate.__all__ if not hasattr(capgate, name)]
    assert missing == []


def test_error_codes_are_stable_and_unique():
    errors = [getattr(capgate, n) for n in capgate.__all__]
    errors = [e for e in errors if isinstance(e, type) and issubclass(e, CapgateError)]
    codes = {e.__name__: e.code for e in errors}
    assert codes == {
        "CapgateError": "capgate_error",
        "CatalogueError": "catalogue_invalid",
        "InvalidInput": "input_invalid",
        "OperationConflict": "operation_conflict",
        "PolicyUnavailable": "policy_unavailable",
        "OPAProcessError": "opa_process_failed",
        "CapabilityViolation": "capability_denied",
        "ObligationUnsupported": "obligation_unsupported",
        "ToolNotRegistered": "tool_not_registered",
        "ToolNotInCatalogue": "tool_not_in_catalogue",
        "CredentialUnavailable": "credential_unavailable",
        "StoreError": "store_error",
        "ToolFailed": "tool_failed",
        "NoticeRejected": "notice_rejected",
    }
    assert len(set(codes.values())) == len(codes)


def test_the_error_tree_is_the_documented_one():
    # The tree drawn in gateway/errors.py: catching a parent catches its children.
    parents = {
        e.__name__: e.__mro__[1].__name__
        for e in (getattr(capgate, n) for n in capgate.__all__)
        if isinstance(e, type) and issubclass(e, CapgateError) and e is not CapgateError
    }
    assert parents == {
        "CatalogueError": "CapgateError",
        "InvalidInput": "CapgateError",
        "OperationConflict": "InvalidInput",
        "PolicyUnavailable": "CapgateError",
        "OPAProcessError": "PolicyUnavailable",
        "CapabilityViolation": "CapgateError",
        "ObligationUnsupported": "CapabilityViolation",
        "ToolNotRegistered": "CapgateError",
        "ToolNotInCatalogue": "CapgateError",
        "CredentialUnavailable": "CapgateError",
        "StoreError": "CapgateError",
        "ToolFailed": "CapgateError",
        "NoticeRejected": "CapgateError",
    }


def test_version_is_the_distributions():
    from importlib.metadata import version

    assert capgate.__version__ == version("capgate")


def test_explain_and_reason_surfaces_are_pinned():
    # Not re-exported from capgate (whose surface is pinned above): imported from
    # their modules by capgate explain, capgate diff and the tests.
    from capgate.gateway.model import decisions, reasons
    from capgate.gateway.policy import client

    assert set(reasons.__all__) == {"compose_reasons", "render", "with_reasons"}
    assert {"Check", "ComposeExplanation", "ExecuteExplanation", "ToolExplanation"} <= set(
        decisions.__all__
    )
    assert {"EXPLAIN_COMPOSE_PATH", "EXPLAIN_EXECUTE_PATH"} <= set(client.__all__)
    assert client.EXPLAIN_COMPOSE_PATH == "capgate/explain/compose"
    assert client.EXPLAIN_EXECUTE_PATH == "capgate/explain/execute"
