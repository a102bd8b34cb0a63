# METADATA
# title: Tool visibility
# description: |
#   The compose checks, in two forms over the same facts. Per tool, is_visible and
#   reasons, for execute: a few keyed lookups whatever the catalogue's size. Over the
#   whole catalogue, visible_tools and excluded_tools, for compose: each check run
#   once for every tool. A tool hidden at compose time is therefore never callable.
#   A missing or malformed fact fails its check (deny by default).
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
#     - tool_quarantined
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
	_not_quarantined(name)
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
#     - tool_quarantined
reasons(name) := union({
	_role_reasons(name),
	_task_reasons(name),
	_connection_reasons(name),
	_environment_reasons(name),
	_budget_reasons(name),
	_quarantine_reasons(name),
})

# METADATA
# title: Every visible tool
# description: |
#   The names of the catalogue's tools for which is_visible(name) holds: the names
#   in the set of every check. Like is_visible, decided by the positive checks alone.
visible_tools := (passing & _budget_admits_names) & _not_quarantined_names if {
	passing := ((_role_granted_names & _task_lists_names) & _connection_active_names) & _environment_allowed_names
}

# METADATA
# title: Every hidden tool, with its reasons
# description: |
#   {name: reasons(name)} for every tool of the catalogue not in visible_tools. A
#   tool's reasons are gathered from the per-check reasons, each built only for the
#   tools that fail that check.
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
#     - tool_quarantined
excluded_tools := {name: tool_reasons | # regal ignore:prefer-set-or-object-rule
	by_check := _reasons_by_check
	some name in (_names - visible_tools)
	tool_reasons := {reason | some by_name in by_check; reason := by_name[name]}
}

_reasons_by_check := [
	_role_reasons_by_name,
	_task_needs_reasons_by_name,
	_task_type_reasons_by_name,
	_connection_reasons_by_name,
	_environment_reasons_by_name,
	_budget_reasons_by_name,
	_quarantine_reasons_by_name,
]

# Facts from the catalogue and the input, normalised once per query. A fact that is
# missing or has the wrong type becomes a value that no check accepts.

default _tools := {}

_tools := data.capgate.catalogue.tools if is_object(data.capgate.catalogue.tools)

_names := object.keys(_tools)

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

# The checks, each in its two forms, beside the reason it gives when it fails.
#
# Per tool (execute): a function of the tool's name, a string, that looks the
# contract up in _tools, cheaper per call than passing the contract object around.
# Negate only these functions: `not` over an expression with a reference argument is
# undefined, not true, when the reference is.
#
# Whole catalogue (compose): the set of the names that pass, the same test written
# inline over every contract, since OPA's cost per function call, paid for every
# tool and check, is several times the cost of the checks themselves. The names that
# fail are the catalogue's names minus that set: no `not` at all. Rules and values
# used inside the loop are bound to a local first, so they are looked up once, not
# once per tool. The reasons are objects keyed by name, built only for the names
# that fail, as comprehensions: OPA (1.22.4) evaluates a partial object rule
# `x[name] := ...` in time quadratic in its number of keys (10,000 tools: 2 s;
# 30,000: 48 s), the comprehension in linear time.
#
# A name with no contract, or a contract that is not an object, fails every check
# that reads the contract, in both forms. Both forms share the message formats, and
# visibility_equivalence_test.rego holds them to the same answers.

# role_not_granted

_role_granted(name) if {
	_role_declared
	_tools[name].roles[_role] == true
}

_role_granted_names contains name if {
	_role_declared
	role := _role # regal ignore:pointless-reassignment
	some name, contract in _tools
	contract.roles[role] == true
}

_role_format := "role %s is not granted tool %q"

_role_reasons(name) := {reason |
	not _role_granted(name)
	reason := {"code": "role_not_granted", "message": sprintf(_role_format, [_role_text, name])}
}

_role_reasons_by_name := {name: reason | # regal ignore:prefer-set-or-object-rule
	format := _role_format
	role_text := _role_text
	some name in (_names - _role_granted_names)
	reason := {"code": "role_not_granted", "message": sprintf(format, [role_text, name])}
}

# not_needed_by_task

_task_lists(name) if {
	_task_tools[name] == true
	_needs_name(name)
}

_needs_name(_) if not _is_narrowed

_needs_name(name) if name in _needs

# The task type's list, which may name tools the catalogue lacks: visible_tools
# keeps catalogue names only, as every other check's set holds only those.
_task_listed_names contains name if {
	some name, listed in _task_tools
	listed == true
}

_task_lists_names := _task_listed_names & _needs if {
	_is_narrowed
} else := _task_listed_names

# The message tells a tool cut by task.needs from one the task type does not list.
_task_needs_format := "task.needs does not name tool %q"

_task_type_format := "task type %s does not list tool %q"

_task_reasons(name) := {reason |
	not _task_lists(name)
	reason := {"code": "not_needed_by_task", "message": _task_message(name)}
}

_task_message(name) := sprintf(_task_needs_format, [name]) if {
	_task_tools[name] == true
} else := sprintf(_task_type_format, [_task_type_text, name])

_task_denied_names := _names - _task_lists_names

_task_needs_reasons_by_name := {name: reason | # regal ignore:prefer-set-or-object-rule
	format := _task_needs_format
	some name in (_task_denied_names & _task_listed_names)
	reason := {"code": "not_needed_by_task", "message": sprintf(format, [name])}
}

_task_type_reasons_by_name := {name: reason | # regal ignore:prefer-set-or-object-rule
	format := _task_type_format
	task_type_text := _task_type_text
	some name in (_task_denied_names - _task_listed_names)
	reason := {"code": "not_needed_by_task", "message": sprintf(format, [task_type_text, name])}
}

# connection_missing, tool_not_enabled_for_tenant, connection_revoked

# The aliases a visible tool may name: the tenant's active connections, and null
# for a tool that needs no connection.
_active_aliases := {alias | some alias, status in _connections; status == "active"} | {null}

_connection_active(name) if _tools[name].connection_alias in _active_aliases

_connection_active_names contains name if {
	active_aliases := _active_aliases # regal ignore:pointless-reassignment
	some name, contract in _tools
	contract.connection_alias in active_aliases
}

# The reason code for each of the tenant's connections, for a tool whose connection
# is not active; a connection the tenant lacks is missing. A status other than
# active or disabled reads as revoked.
_connection_codes[alias] := "tool_not_enabled_for_tenant" if {
	some alias, status in _connections
	status == "disabled"
}

_connection_codes[alias] := "connection_revoked" if {
	some alias, status in _connections
	status != "disabled"
}

_connection_formats := {
	"connection_missing": "the tenant has no connection %s, which tool %q needs",
	"tool_not_enabled_for_tenant": "the tenant has disabled connection %s, which tool %q needs",
	"connection_revoked": "connection %s, which tool %q needs, is revoked or otherwise not active",
}

# Both forms read the alias and the cost class with object.get and a path from
# _tools, which never fails: null when the tool has no contract, the contract is not
# an object or lacks the field. The alias is looked up as a one-element path, so an
# alias that is not a string is one key, never a path.

_connection_reasons(name) := {reason |
	not _connection_active(name)
	alias := object.get(_tools, [name, "connection_alias"], null)
	code := object.get(_connection_codes, [alias], "connection_missing")
	message := sprintf(_connection_formats[code], [json.marshal(alias), name])
	reason := {"code": code, "message": message}
}

_connection_reasons_by_name := {name: reason | # regal ignore:prefer-set-or-object-rule
	tools := _tools
	codes := _connection_codes
	formats := _connection_formats
	some name in (_names - _connection_active_names)
	alias := object.get(tools, [name, "connection_alias"], null)
	code := object.get(codes, [alias], "connection_missing")
	message := sprintf(formats[code], [json.marshal(alias), name])
	reason := {"code": code, "message": message}
}

# environment_restricted

_environment_allowed(name) if _tools[name].environments[_environment] == true

_environment_allowed_names contains name if {
	environment := _environment # regal ignore:pointless-reassignment
	some name, contract in _tools
	contract.environments[environment] == true
}

_environment_format := "tool %q is not available in environment %s"

_environment_reasons(name) := {reason |
	not _environment_allowed(name)
	reason := {"code": "environment_restricted", "message": sprintf(_environment_format, [name, _environment_text])}
}

_environment_reasons_by_name := {name: reason | # regal ignore:prefer-set-or-object-rule
	format := _environment_format
	environment_text := _environment_text
	some name in (_names - _environment_allowed_names)
	reason := {"code": "environment_restricted", "message": sprintf(format, [name, environment_text])}
}

# budget_class_exceeded

_budget_admits(name) if _admits[_tools[name].cost_class] == true

_budget_admits_names contains name if {
	admits := _admits # regal ignore:pointless-reassignment
	some name, contract in _tools
	admits[contract.cost_class] == true
}

_budget_format := "budget class %s does not admit cost class %s of tool %q"

_budget_reasons(name) := {reason |
	not _budget_admits(name)
	cost_class := object.get(_tools, [name, "cost_class"], null)
	message := sprintf(_budget_format, [_budget_class_text, json.marshal(cost_class), name])
	reason := {"code": "budget_class_exceeded", "message": message}
}

_budget_reasons_by_name := {name: reason | # regal ignore:prefer-set-or-object-rule
	tools := _tools
	format := _budget_format
	budget_class_text := _budget_class_text
	some name in (_names - _budget_admits_names)
	cost_class := object.get(tools, [name, "cost_class"], null)
	message := sprintf(format, [budget_class_text, json.marshal(cost_class), name])
	reason := {"code": "budget_class_exceeded", "message": message}
}

# tool_quarantined

# input.quarantined names the tools that run on an MCP server whose current definition
# of them a person has not accepted (the gateway reads it from its pins of upstream
# definitions). null or absent quarantines nothing; a value that is not a list
# quarantines every tool, as a task.needs that is not a list narrows to nothing.
_is_quarantine_malformed if {
	input.quarantined != null
	not is_array(input.quarantined)
}

_quarantined_names contains name if {
	is_array(input.quarantined)
	some name in input.quarantined
}

_not_quarantined(name) if {
	not _is_quarantine_malformed
	not name in _quarantined_names
}

default _not_quarantined_names := set()

_not_quarantined_names := _names - _quarantined_names if not _is_quarantine_malformed

_quarantine_format := "tool %q is quarantined: its MCP server's current definition of it is not one a person accepted"

_quarantine_reasons(name) := {reason |
	not _not_quarantined(name)
	reason := {"code": "tool_quarantined", "message": sprintf(_quarantine_format, [name])}
}

_quarantine_reasons_by_name := {name: reason | # regal ignore:prefer-set-or-object-rule
	format := _quarantine_format
	some name in (_names - _not_quarantined_names)
	reason := {"code": "tool_quarantined", "message": sprintf(format, [name])}
}
