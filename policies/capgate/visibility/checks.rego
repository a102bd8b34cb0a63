# The compose checks: each declared once and written once, here. A check is its
# declaration (an entry of the METADATA of declared: its title, the facts it reads,
# the codes it gives with their titles and message templates), its entry in the
# _admits table (the index entries that admit a tool under the input), and what it
# reports (_facts, and _key and _code when those depend on the tool). visibility.rego
# derives everything else from these: the per-tool form, the called tool's (which
# execute asks) and the whole catalogue's (compose's visible set, explain), so a
# check added here is enforced by compose and execute, and explained, with nothing
# else to write. docs/policy-authoring.md walks through adding one. Part of package
# capgate.visibility.
package capgate.visibility

# METADATA
# title: The compose checks, declared
# description: |
#   Every compose check, in the order explain reports them. Each names the facts it
#   reads and the codes it gives, each code with its title and its message template:
#   {tool} is the tool's name and every other {name} the fact of that name, as
#   compact JSON. The gateway (gateway.model.reasons) renders compose's messages
#   from these templates and docs/reason-codes.md shows them.
# custom:
#   checks:
#     - check: role
#       title: Role
#       description: The principal's role is declared by the catalogue and granted the tool.
#       facts: [role]
#       codes:
#         role_not_granted:
#           title: Role not granted
#           message: tool {tool} is not granted to role {role}
#     - check: task
#       title: Task
#       description: The task type lists the tool, and task.needs, when given, names it.
#       facts: [task_type, needs]
#       codes:
#         not_needed_by_task:
#           title: Not needed by the task
#           message: tool {tool} is not offered by task type {task_type} with task.needs {needs}
#     - check: connection
#       title: Connection
#       description: The tool needs no connection, or the tenant's connection for its alias is active.
#       facts: [alias, status]
#       codes:
#         connection_missing:
#           title: Connection missing
#           message: tool {tool} needs connection {alias}, which the tenant does not have
#         tool_not_enabled_for_tenant:
#           title: Tool not enabled for the tenant
#           message: tool {tool} needs connection {alias}, which the tenant has disabled
#         connection_revoked:
#           title: Connection revoked
#           message: tool {tool} needs connection {alias}, whose status is {status}, not active
#     - check: environment
#       title: Environment
#       description: The tool is available in the input's environment.
#       facts: [environment]
#       codes:
#         environment_restricted:
#           title: Environment restricted
#           message: tool {tool} is not available in environment {environment}
#     - check: budget
#       title: Budget class
#       description: The input's budget class admits the tool's cost class.
#       facts: [budget_class, cost_class]
#       codes:
#         budget_class_exceeded:
#           title: Budget class exceeded
#           message: >-
#             tool {tool} has cost class {cost_class}, which budget class {budget_class}
#             does not admit
#     - check: quarantine
#       title: Quarantine
#       description: The tool's upstream definition is one a person accepted.
#       facts: [listed, list_malformed]
#       codes:
#         tool_quarantined:
#           title: Tool quarantined
#           message: >-
#             tool {tool} is quarantined: its MCP server's current definition of it is
#             not one a person accepted
declared := rego.metadata.rule().custom.checks

# The logic of every check, in one table: for each check, the index entries (objects
# keyed by tool name, from data.capgate.catalogue.index) that admit a tool under the
# input. A tool passes a check when one of its entries holds it, so a check whose
# facts are missing or malformed, with no entry, admits no tool. Each value is a
# comprehension, defined whatever the input; should the table be undefined, every
# check fails. Execute reads it on every call, so each entry is read straight from
# the input and the data, once. _excludes names the entries that hold tools a check
# fails whatever admits them.
_admits := {
	# role_not_granted: a role counts only when the catalogue declares it, as well
	# as the index granting it.
	"role": [entry |
		is_string(input.principal.role)
		_ = data.capgate.catalogue.roles[input.principal.role]
		entry := data.capgate.catalogue.index.by_role[input.principal.role]
	],
	# not_needed_by_task: task.needs narrows the task type's list when present;
	# null or absent means no narrowing, a value that is not a list narrows to
	# nothing.
	"task": array.concat(
		[entry |
			not input.task.needs != null
			entry := data.capgate.catalogue.index.by_task_type[input.task.type]
		],
		[{name: true | some name in input.task.needs; _ = listed[name]} |
			is_array(input.task.needs)
			listed := data.capgate.catalogue.index.by_task_type[input.task.type]
		],
	),
	# connection_missing, tool_not_enabled_for_tenant, connection_revoked: the tools
	# that need no connection, and those indexed under an alias the tenant has
	# active.
	"connection": array.concat(
		[entry | entry := data.capgate.catalogue.index.no_connection],
		[entry |
			is_object(input.connections)
			some alias, status in input.connections
			status == "active"
			entry := data.capgate.catalogue.index.by_connection[alias]
		],
	),
	# environment_restricted
	"environment": [entry | entry := data.capgate.catalogue.index.by_environment[input.environment]],
	# budget_class_exceeded: the tools of every cost class the budget class admits
	# (maps to true).
	"budget": [entry |
		admits := data.capgate.catalogue.budget_classes[input.budget_class].admits
		is_object(admits)
		some cost_class, admitted in admits
		admitted == true
		entry := data.capgate.catalogue.index.by_cost_class[cost_class]
	],
	# tool_quarantined: every tool of the catalogue, unless input.quarantined is
	# malformed, less the ones it lists (_excludes).
	"quarantine": [data.capgate.catalogue.tools | not _is_quarantine_malformed],
}

_excludes := {"quarantine": [{name: true | some name in input.quarantined}]}

# What each check reports, by the check's name: its facts, what explain shows and
# the messages name, _facts(check, key); when they, or the code, depend on the tool,
# _key(check, name) gives what they depend on (the same for many tools, so that
# explain builds each report once), and _code(check, key) the code of a check that
# declares several.

_facts("role", _) := {"role": _role}

_facts("task", _) := {"task_type": _task_type, "needs": _task_needs}

# The contract's alias names the connection in the facts and picks the code; it
# never decides the check. A status other than active or disabled reads as revoked;
# a connection the tenant lacks, or an active one the index does not hold the tool
# under, is missing.
_key("connection", name) := object.get(_tools, [name, "connection_alias"], null)

_facts("connection", key) := {"alias": key, "status": object.get(_connections, [key], null)}

_code("connection", key) := "tool_not_enabled_for_tenant" if {
	_connections[key] == "disabled"
} else := "connection_revoked" if {
	_ = _connections[key]
	_connections[key] != "active"
} else := "connection_missing"

_facts("environment", _) := {"environment": _environment}

_key("budget", name) := object.get(_tools, [name, "cost_class"], null)

_facts("budget", key) := {"budget_class": _budget_class, "cost_class": key}

# input.quarantined names the tools that run on an MCP server whose current
# definition of them a person has not accepted (the gateway reads it from its pins
# of upstream definitions). null or absent quarantines nothing; a value that is not
# a list quarantines every tool, as a task.needs that is not a list narrows to
# nothing.
_key("quarantine", name) := name in _quarantined_names

_facts("quarantine", key) := {"listed": key, "list_malformed": _is_quarantine_malformed}

default _is_quarantine_malformed := false

_is_quarantine_malformed if {
	input.quarantined != null
	not is_array(input.quarantined)
}

_quarantined_names contains name if {
	is_array(input.quarantined)
	some name in input.quarantined
}

# The facts as the checks report them: a fact that is missing is null.

default _role := null

_role := input.principal.role

default _task_type := null

_task_type := input.task.type

default _task_needs := null

_task_needs := input.task.needs

default _connections := {}

_connections := input.connections if is_object(input.connections)

default _environment := null

_environment := input.environment

default _budget_class := null

_budget_class := input.budget_class
