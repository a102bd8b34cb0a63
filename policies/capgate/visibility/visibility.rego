# METADATA
# title: Tool visibility
# description: |
#   The compose checks, each written once over the catalogue's index
#   (data.capgate.catalogue.index, compiled with the catalogue: for each fact a check
#   reads, the tools that pass for each value). Per tool, a check is one keyed lookup
#   in the index (is_visible, reasons, checks; execute asks the same lookups for the
#   called tool, argument-free, in called.rego: called_failed_checks). Over the whole
#   catalogue, a check is the set the index holds for the input's value, and compose
#   is the intersection of those sets (visible_tools, tool_checks). Both forms read
#   the same entries of the same index, so a tool hidden at compose time is never
#   callable. A missing or malformed fact fails its check (deny by default).
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
#   True only when every compose check passes for the tool. Decided by the positive
#   checks themselves, so a hidden tool stays hidden even if a reason could not be
#   rendered. Execute also checks that the tool is in the catalogue.
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
#   empty exactly when is_visible(name) holds. Execute reports these; compose reports
#   codes only, on request (capgate.explain), and the gateway renders their messages.
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
reasons(name) := {reason(check, name) | some check in failed_checks(name)}

# METADATA
# title: The checks that hide the tool
# description: |
#   The names of the compose checks (role, task, connection, environment, budget,
#   quarantine) that the tool fails, each decided by its per-tool lookup: empty
#   exactly when is_visible(name) holds. Execute asks its per-call form,
#   called_failed_checks, which visibility_equivalence_test.rego holds equal to it.
failed_checks(name) := union({
	_fails_role(name),
	_fails_task(name),
	_fails_connection(name),
	_fails_environment(name),
	_fails_budget(name),
	_fails_quarantine(name),
})

# One set per check, each calling its check directly: cheaper per call than asking
# _passes, whose six definitions OPA would try in turn for every check.
_fails_role(name) := {"role" | not _role_granted(name)}

_fails_task(name) := {"task" | not _task_lists(name)}

_fails_connection(name) := {"connection" | not _connection_active(name)}

_fails_environment(name) := {"environment" | not _environment_allowed(name)}

_fails_budget(name) := {"budget" | not _budget_admits(name)}

_fails_quarantine(name) := {"quarantine" | not _not_quarantined(name)}

# METADATA
# title: The reason a failed check gives
# description: |
#   {"code", "message"} for the compose check named check failing for the tool, the
#   message naming the facts the check read.
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
reason(check, name) := {"code": code, "message": _message(code, name, _facts(check, name))} if {
	code := _code(check, name)
}

# METADATA
# title: Every check, for one tool
# description: |
#   [{"check", "pass", "code", "facts"}, ...] for the six compose checks in order
#   (role, task, connection, environment, budget, quarantine), each decided by the
#   per-tool lookup that is_visible makes. code is null exactly when the check
#   passes; facts are the values the check read.
checks(name) := [_tool_check(check, name) | some check in _check_names]

# METADATA
# scope: document
# title: Every visible tool
# description: |
#   The catalogue's tools that pass every check. The task, role and connection
#   checks, which hide most of a large catalogue, are read whole from the index and
#   intersected; the few candidates left are looked up one by one in the
#   environment and budget entries by the per-tool checks execute makes; quarantined
#   names are taken out. visibility_equivalence_test.rego holds this set to the
#   tools for which is_visible holds, and capgate.explain's verdicts to it.
default visible_tools := set()

visible_tools := {name | some name in _candidates; _ = _tools[name]} - _quarantined_names if {
	not _is_quarantine_malformed
}

# The catalogue's names (10,000 of them in a large catalogue) are never built here,
# nor the environment and cost-class sets, each most of the catalogue: building a
# set of the keys of an entry costs more per name than looking a candidate up in it
# (OPA 1.22.4, 10,000 tools: 7.5 ms against 11.5 ms in opa bench). A comprehension,
# not a partial set rule, which OPA evaluates about twice as slowly here.
_candidates := {name | # regal ignore:prefer-set-or-object-rule
	environment := _index.by_environment[_environment] # _environment_allowed, bound once
	some name in ((_task_lists_names & _role_granted_names) & _connection_active_names)
	_ = environment[name]
	_budget_admits(name)
}

# METADATA
# title: Every tool, check by check
# description: |
#   {name: {"visible": bool, "checks": [...]}} for every tool of the catalogue, the
#   checks shaped as checks(name) but decided by membership in the sets visible_tools
#   intersects. For people and audits (capgate.explain), not for agents. Each check
#   object, as _tool_check builds it, is built once per key (_fact_keys) and verdict
#   in _check_objects, not once per tool: under a third of the cost (1,000 tools).
tool_checks := {name: explained | # regal ignore:prefer-set-or-object-rule
	passing := passing_names
	visible := visible_tools
	built := _check_objects
	some name in tool_names
	keys := _fact_keys(name)
	explained := {
		"visible": name in visible,
		"checks": [built[check][object.get(keys, check, null)][name in passing[check]] | some check in _check_names],
	}
}

_check_objects[check] := {key: {
	true: {"check": check, "pass": true, "code": null, "facts": facts},
	false: {"check": check, "pass": false, "code": _code_of(check, key), "facts": facts},
} |
	some key in _catalogue_keys(check)
	facts := _facts_of(check, key)
} if {
	some check in _check_names
}

_catalogue_keys("connection") := {_alias(name) | some name in tool_names}

_catalogue_keys("budget") := {_cost_class(name) | some name in tool_names}

_catalogue_keys("quarantine") := {true, false}

_catalogue_keys(check) := {null} if check in {"role", "task", "environment"}

_check_names := ["role", "task", "connection", "environment", "budget", "quarantine"]

# METADATA
# title: Reason code
# description: The reason code the failing check gives the tool.
reason_code(check, name) := _code(check, name)

# METADATA
# title: Passing names
# description: |
#   For each compose check ("role", "task", ...), the names of the tools that pass
#   it, read whole from the index: the sets compose intersects (and
#   capgate.explain's codes-only answer reads).
passing_names := {
	"role": _role_granted_names,
	"task": _task_lists_names,
	"connection": _connection_active_names,
	"environment": _environment_allowed_names,
	"budget": _budget_admits_names,
	"quarantine": _not_quarantined_names,
}

_tool_check(check, name) := {"check": check, "pass": true, "code": null, "facts": _facts(check, name)} if {
	_passes(check, name)
} else := {"check": check, "pass": false, "code": _code(check, name), "facts": _facts(check, name)}

_passes("role", name) if _role_granted(name)

_passes("task", name) if _task_lists(name)

_passes("connection", name) if _connection_active(name)

_passes("environment", name) if _environment_allowed(name)

_passes("budget", name) if _budget_admits(name)

_passes("quarantine", name) if _not_quarantined(name)

_code("role", _) := "role_not_granted"

_code("task", _) := "not_needed_by_task"

_code("connection", name) := _connection_code(_alias(name))

_code("environment", _) := "environment_restricted"

_code("budget", _) := "budget_class_exceeded"

_code("quarantine", _) := "tool_quarantined"

# A check's facts and code depend on the tool only through its alias, cost or listing.
_facts(check, name) := _facts_of(check, object.get(_fact_keys(name), check, null))

_fact_keys(name) := {"connection": _alias(name), "budget": _cost_class(name), "quarantine": name in _quarantined_names}

_code_of("connection", key) := _connection_code(key)

_code_of(check, _) := _code(check, null) if check != "connection"

_facts_of("role", _) := {"role": _role}

_facts_of("task", _) := {"task_type": _task_type, "needs": _task_needs}

_facts_of("connection", key) := {"alias": key, "status": object.get(_connections, [key], null)}

_facts_of("environment", _) := {"environment": _environment}

_facts_of("budget", key) := {"budget_class": _budget_class, "cost_class": key}

_facts_of("quarantine", key) := {"listed": key, "list_malformed": _is_quarantine_malformed}

# Facts from the catalogue and the input, normalised once per query. A fact that is
# missing or has the wrong type becomes a value that no check accepts.

default _tools := {}

_tools := data.capgate.catalogue.tools if is_object(data.capgate.catalogue.tools)

# METADATA
# title: Tool names
# description: The names of the catalogue's tools (none without a catalogue).
tool_names := object.keys(_tools)

default _index := {}

_index := data.capgate.catalogue.index if is_object(data.capgate.catalogue.index)

# The index entry for a fact's value, null when there is none. A path lookup never
# fails, whatever the type of the value or of the index's sections.
_entry(section, value) := object.get(_index, [section, value], null)

# The names of an index entry: its keys when it is an object, else none.
_members(entry) := object.keys(entry) if is_object(entry)

else := set()

# Per tool, a name is in an index entry when the entry holds it as a key, whatever
# the value, as the whole-set form (object.keys) reads the keys only. A lookup into
# anything but an object is undefined, so a malformed entry holds nothing in both.

default _role := null

_role := input.principal.role

# A role counts only when the catalogue declares it, as well as the index granting it.
default _role_declared := false

_role_declared if {
	is_string(input.principal.role)
	_ = data.capgate.catalogue.roles[input.principal.role]
}

default _task_type := null

_task_type := input.task.type

default _task_needs := null

_task_needs := input.task.needs

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

# The cost classes the budget class admits: those its admits object maps to true.
_admitted contains cost_class if {
	admits := data.capgate.catalogue.budget_classes[input.budget_class].admits
	is_object(admits)
	some cost_class, admitted in admits
	admitted == true
}

# The checks. Each has a per-tool form, a function of the tool's name that looks the
# name up in the index entry the input selects, and a whole-set form, the names of
# that same entry. visibility_equivalence_test.rego holds the two to the same answer
# on well-formed and malformed data. Negate only the per-tool functions: `not` over
# an expression with a reference argument is undefined, not true, when the
# reference is.

# role_not_granted

_role_granted(name) if _ = _role_tools[name]

# The index entry the per-tool check looks names up in, read once per query: the
# tools granted to the input's role, undefined unless the catalogue declares it.
_role_tools := tools if {
	_role_declared
	index := data.capgate.catalogue.index
	tools := index.by_role[input.principal.role]
}

default _role_granted_names := set()

_role_granted_names := _members(_entry("by_role", _role)) if _role_declared

# not_needed_by_task

_task_lists(name) if {
	_ = _task_tools[name]
	not _is_narrowed
}

_task_lists(name) if {
	_ = _task_tools[name]
	name in _needs
}

# The tools the input's task type lists, read once per query.
_task_tools := tools if {
	index := data.capgate.catalogue.index
	tools := index.by_task_type[input.task.type]
}

_task_listed_names := _members(_entry("by_task_type", _task_type))

_task_lists_names := _task_listed_names & _needs if {
	_is_narrowed
} else := _task_listed_names

# connection_missing, tool_not_enabled_for_tenant, connection_revoked

_active_aliases contains alias if {
	is_object(input.connections)
	some alias, status in input.connections
	status == "active"
}

_connection_active(name) if {
	index := data.capgate.catalogue.index
	_ = index.no_connection[name]
}

_connection_active(name) if {
	index := data.capgate.catalogue.index
	some alias in _active_aliases
	_ = index.by_connection[alias][name]
}

_connection_active_names := _members(object.get(_index, "no_connection", null)) | union({names |
	some alias in _active_aliases
	names := _members(_entry("by_connection", alias))
})

# The contract's alias names the connection in the facts and picks the code of a
# failing check; it never decides the check. Read with object.get and a path, which
# never fails: null when the tool has no contract or the contract lacks the field.
# A status other than active or disabled reads as revoked; a connection the tenant
# lacks, or an active one the index does not hold the tool under, is missing.
_alias(name) := object.get(_tools, [name, "connection_alias"], null)

_cost_class(name) := object.get(_tools, [name, "cost_class"], null)

_connection_code(alias) := "tool_not_enabled_for_tenant" if {
	_connections[alias] == "disabled"
} else := "connection_revoked" if {
	_has_connection(alias)
	_connections[alias] != "active"
} else := "connection_missing"

_has_connection(alias) if _ = _connections[alias]

# environment_restricted

_environment_allowed(name) if _ = _environment_tools[name]

# The tools available in the input's environment, read once per query.
_environment_tools := tools if {
	index := data.capgate.catalogue.index
	tools := index.by_environment[input.environment]
}

_environment_allowed_names := _members(_entry("by_environment", _environment))

# budget_class_exceeded

_budget_admits(name) if {
	index := data.capgate.catalogue.index
	some cost_class in _admitted
	_ = index.by_cost_class[cost_class][name]
}

_budget_admits_names := union({names |
	some cost_class in _admitted
	names := _members(_entry("by_cost_class", cost_class))
})

# tool_quarantined

# input.quarantined names the tools that run on an MCP server whose current definition
# of them a person has not accepted (the gateway reads it from its pins of upstream
# definitions). null or absent quarantines nothing; a value that is not a list
# quarantines every tool, as a task.needs that is not a list narrows to nothing.
default _is_quarantine_malformed := false

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

_not_quarantined_names := tool_names - _quarantined_names if not _is_quarantine_malformed

# Messages, for execute's reasons only: each names the facts its check read, as JSON.

_message(code, name, facts) := sprintf(_formats[code], array.concat(
	[json.marshal(name)],
	[json.marshal(facts[key]) | some key in _format_facts[code]],
))

_formats := {
	"role_not_granted": "tool %s is not granted to role %s",
	"not_needed_by_task": "tool %s is not offered by task type %s with task.needs %s",
	"connection_missing": "tool %s needs connection %s, which the tenant does not have",
	"tool_not_enabled_for_tenant": "tool %s needs connection %s, which the tenant has disabled",
	"connection_revoked": "tool %s needs connection %s, whose status is %s, not active",
	"environment_restricted": "tool %s is not available in environment %s",
	"budget_class_exceeded": "tool %s has cost class %s, which budget class %s does not admit",
	"tool_quarantined": "tool %s is quarantined: its MCP server's current definition of it is not one a person accepted",
}

_format_facts := {
	"role_not_granted": ["role"],
	"not_needed_by_task": ["task_type", "needs"],
	"connection_missing": ["alias"],
	"tool_not_enabled_for_tenant": ["alias"],
	"connection_revoked": ["alias", "status"],
	"environment_restricted": ["environment"],
	"budget_class_exceeded": ["cost_class", "budget_class"],
	"tool_quarantined": [],
}
