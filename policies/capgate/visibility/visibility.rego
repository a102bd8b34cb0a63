# METADATA
# title: Tool visibility
# description: |
#   The compose checks for one tool, shared by both entrypoints: compose asks them
#   for every tool in the catalogue, execute asks them again for the called tool, so
#   a tool hidden at compose time is never callable. Every check is one keyed lookup
#   into data.capgate.catalogue or the input; a missing or malformed fact fails its
#   check (deny by default).
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
package capgate.visibility

# METADATA
# title: Is the tool visible?
# description: |
#   True only when the tool is in the catalogue and every compose check passes.
#   Decided by the positive checks themselves, so a hidden tool stays hidden even if
#   a reason could not be rendered.
is_visible(name) if {
	_role_granted(name)
	_task_lists(name)
	_connection_active(name)
	_environment_allowed(name)
	_budget_admits(name)
}

# METADATA
# title: Why the tool is hidden
# description: |
#   The set of {"code", "message"} reasons that hide the tool: one per failing check,
#   empty exactly when is_visible(name) holds.
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
reasons(name) := union({
	_role_reasons(name),
	_task_reasons(name),
	_connection_reasons(name),
	_environment_reasons(name),
	_budget_reasons(name),
})

# Facts from the catalogue and the input, normalised once per query. A fact that is
# missing or has the wrong type becomes a value that no check accepts.

default _tools := {}

_tools := data.capgate.catalogue.tools if is_object(data.capgate.catalogue.tools)

default _role := null

_role := input.principal.role

# A role counts only when the catalogue declares it as well as the tool granting it.
default _role_declared := false

_role_declared if {
	is_string(_role)
	_ := data.capgate.catalogue.roles[_role]
}

default _task_type := null

_task_type := input.task.type

default _task_tools := {}

_task_tools := data.capgate.catalogue.task_types[_task_type].tools if {
	is_object(data.capgate.catalogue.task_types[_task_type].tools)
}

# task.needs narrows the task type's list when present; null means absent. A
# present value that is not a list narrows to nothing.
_is_narrowed if input.task.needs != null

_needs contains need if {
	is_array(input.task.needs)
	some need in input.task.needs
}

default _connections := {}

_connections := input.connections if is_object(input.connections)

default _environment := null

_environment := input.environment

default _budget_class := null

_budget_class := input.budget_class

default _admits := {}

_admits := data.capgate.catalogue.budget_classes[_budget_class].admits if {
	is_object(data.capgate.catalogue.budget_classes[_budget_class].admits)
}

# The input's facts as JSON for messages, rendered once per query.
_role_text := json.marshal(_role)

_task_type_text := json.marshal(_task_type)

_environment_text := json.marshal(_environment)

_budget_class_text := json.marshal(_budget_class)

# The contract's field as JSON for a message; null when absent.
default _field(_, _) := "null"

_field(name, key) := json.marshal(object.get(_tools[name], key, null)) if is_object(_tools[name])

# The checks, each paired with the reason it gives when it fails. Every check takes
# the tool's name, a string, and looks its contract up in _tools: cheaper per call
# than passing the contract object around. A name with no contract, or a contract
# that is not an object, fails every check that reads the contract. Negate only
# these rules and functions: `not` over an expression with a reference argument is
# undefined, not true, when the reference is.

# role_not_granted

_role_granted(name) if {
	_role_declared
	_tools[name].roles[_role] == true
}

_role_reasons(name) := {reason |
	not _role_granted(name)
	reason := {
		"code": "role_not_granted",
		"message": sprintf("role %s is not granted tool %q", [_role_text, name]),
	}
}

# not_needed_by_task

_task_lists(name) if {
	_task_tools[name] == true
	_needs_name(name)
}

_needs_name(_) if not _is_narrowed

_needs_name(name) if name in _needs

_task_reasons(name) := {reason |
	not _task_lists(name)
	reason := {"code": "not_needed_by_task", "message": _task_message(name)}
}

_task_message(name) := sprintf("task.needs does not name tool %q", [name]) if {
	_task_tools[name] == true
} else := sprintf("task type %s does not list tool %q", [_task_type_text, name])

# connection_missing, tool_not_enabled_for_tenant, connection_revoked

_connection_active(name) if _tools[name].connection_alias == null

_connection_active(name) if _connections[_tools[name].connection_alias] == "active"

_connection_reasons(name) := {reason |
	not _connection_active(name)
	code := _connection_code(name)
	message := sprintf(_connection_messages[code], [_field(name, "connection_alias"), name])
	reason := {"code": code, "message": message}
}

# A status other than active or disabled reads as revoked.
_connection_code(name) := "tool_not_enabled_for_tenant" if {
	_connections[_tools[name].connection_alias] == "disabled"
} else := "connection_revoked" if {
	_ := _connections[_tools[name].connection_alias]
} else := "connection_missing"

_connection_messages := {
	"connection_missing": "the tenant has no connection %s, which tool %q needs",
	"tool_not_enabled_for_tenant": "the tenant has disabled connection %s, which tool %q needs",
	"connection_revoked": "connection %s, which tool %q needs, is revoked or otherwise not active",
}

# environment_restricted

_environment_allowed(name) if _tools[name].environments[_environment] == true

_environment_reasons(name) := {reason |
	not _environment_allowed(name)
	reason := {
		"code": "environment_restricted",
		"message": sprintf("tool %q is not available in environment %s", [name, _environment_text]),
	}
}

# budget_class_exceeded

_budget_admits(name) if _admits[_tools[name].cost_class] == true

_budget_reasons(name) := {reason |
	not _budget_admits(name)
	values := [_budget_class_text, _field(name, "cost_class"), name]
	message := sprintf("budget class %s does not admit cost class %s of tool %q", values)
	reason := {"code": "budget_class_exceeded", "message": message}
}
