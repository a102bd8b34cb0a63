# The compose checks for the one tool a call names (input.call.tool): the per-call
# form execute asks, once per call. Each check is its per-tool function in
# visibility.rego applied to the called tool, so there is one definition of each;
# the set is argument-free, which OPA evaluates once per query, and the per-tool
# functions read the input and the index directly rather than through the
# normalising rules, which OPA (1.22.4, opa bench) charges about 4 µs a rule.
# visibility_equivalence_test.rego holds the set equal to failed_checks for every
# name. Part of package capgate.visibility.
package capgate.visibility

# METADATA
# scope: document
# title: The checks that hide the called tool
# description: |
#   failed_checks(input.call.tool) as an argument-free set: the names of the compose
#   checks the tool the call names fails, empty exactly when is_visible holds for it.
#   Execute derives both its verdict and its compose reasons from it.
called_failed_checks contains "role" if not _role_granted_called

called_failed_checks contains "task" if not _task_lists_called

called_failed_checks contains "connection" if not _connection_active_called

called_failed_checks contains "environment" if not _environment_allowed_called

called_failed_checks contains "budget" if not _budget_admits_called

called_failed_checks contains "quarantine" if not _not_quarantined_called

_role_granted_called if _role_granted(input.call.tool)

_task_lists_called if _task_lists(input.call.tool)

_connection_active_called if _connection_active(input.call.tool)

_environment_allowed_called if _environment_allowed(input.call.tool)

_budget_admits_called if _budget_admits(input.call.tool)

# A call naming no tool fails every check: each function's argument is undefined.
_not_quarantined_called if _not_quarantined(input.call.tool)
