"""Pin the public API: adding or removing a name must be a deliberate change."""

import gateway
from gateway.errors import CapgateError

EXPECTED = {
    "OPA_URL_ENV", "Adapter", "AgentSession", "Approval", "Call", "CallContext",
    "CapabilityViolation", "CapgateError", "Catalogue", "CatalogueError", "ComposeDecision",
    "ComposeInput", "DecisionEvent", "Dispatcher", "ExecuteDecision", "ExecuteInput",
    "InvalidInput", "OPAProcessError", "Obligation", "ObligationUnsupported", "Outcome",
    "OutcomeStatus", "PolicyClient", "PolicyDecider", "PolicySidecar", "PolicyUnavailable",
    "Principal", "Reason", "ResourceRef", "Task", "ToolContract", "ToolFailed",
    "ToolNotInCatalogue", "ToolNotRegistered", "ToolRefused", "ToolRegistry", "ToolRetryable",
    "compile_catalogue", "load_catalogue", "params_digest", "__version__",
}  # fmt: skip


def test_all_is_pinned():
    assert set(gateway.__all__) == EXPECTED


def test_every_exported_name_exists():
    missing = [name for name in gateway.__all__ if not hasattr(gateway, name)]
    assert missing == []


def test_error_codes_are_stable_and_unique():
    errors = [getattr(gateway, n) for n in gateway.__all__]
    errors = [e for e in errors if isinstance(e, type) and issubclass(e, CapgateError)]
    codes = {e.__name__: e.code for e in errors}
    assert codes == {
        "CapgateError": "capgate_error",
        "CatalogueError": "catalogue_invalid",
        "InvalidInput": "input_invalid",
        "PolicyUnavailable": "policy_unavailable",
        "OPAProcessError": "opa_process_failed",
        "CapabilityViolation": "capability_denied",
        "ObligationUnsupported": "obligation_unsupported",
        "ToolNotRegistered": "tool_not_registered",
        "ToolNotInCatalogue": "tool_not_in_catalogue",
        "ToolFailed": "tool_failed",
    }


def test_version_is_the_distributions():
    from importlib.metadata import version

    assert gateway.__version__ == version("capgate")
