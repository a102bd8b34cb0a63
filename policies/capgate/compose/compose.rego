# METADATA
# title: Compose
# description: |
#   Which tools may this agent see now? Runs the visibility checks once for every tool
#   in data.capgate.catalogue and answers with the visible names and, for every other
#   tool, all the reasons that hide it. Query data.capgate.compose.decision.
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
package capgate.compose

import data.capgate.visibility

# METADATA
# title: Compose decision
# description: |
#   {"visible": [name, ...], "excluded": {name: [{"code", "message"}, ...]}}.
#   Every tool in the catalogue appears in exactly one of the two. Always defined:
#   with no catalogue both are empty.
# entrypoint: true
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
decision := {"visible": visible, "excluded": excluded}

visible contains name if {
	some name, _ in _tools
	visibility.is_visible(name)
}

# An object comprehension, not a partial object rule `excluded[name] := ...`: OPA
# (1.22.4) evaluates such a rule in time quadratic in its number of keys (10,000
# tools: 2 s; 30,000: 48 s), the comprehension in linear time.
excluded := {name: visibility.reasons(name) |
	some name, _ in _tools
	not name in visible
}

default _tools := {}

_tools := data.capgate.catalogue.tools if is_object(data.capgate.catalogue.tools)
