# The link checks, each declared once and written once, here: its declaration (in
# the METADATA of declared), the condition under which it fails (_failed), the facts
# its message names (_facts) and, for a code with several messages, which (_case).
# link.rego derives the allow and the reasons from these. Part of package
# capgate.link.
package capgate.link

# METADATA
# title: The link checks, declared
# description: |
#   The declaration of every check made when an agent links a resource to a task,
#   or unlinks it: the facts it reads and the code it gives, with the code's title
#   and message templates ({name} a fact, as compact JSON), by case when the message
#   says which condition failed.
# custom:
#   checks:
#     - check: linker
#       title: Linker
#       description: |
#         The agent's role is declared, and lists the resource's type among those it
#         may link (its links).
#       facts: [role, resource_type, links]
#       codes:
#         link_not_permitted:
#           title: Link not permitted
#           messages:
#             undeclared: the agent's role {role} is not declared in the catalogue
#             unlisted: >-
#               role {role} may not link resources of type {resource_type} (it may
#               link: {links})
#     - check: own_task
#       title: Another task
#       description: |
#         The task whose links change is not the one the agent works in: an agent
#         never changes what its own task may reach.
#       facts: [agent, task]
#       codes:
#         link_own_task:
#           title: Link to own task
#           message: >-
#             agent {agent} works in task {task}, and may not change the links of
#             the task it works in
#     - check: action
#       title: Action
#       description: The action is "link" or "unlink".
#       facts: [action]
#       codes:
#         link_action_invalid:
#           title: Link action invalid
#           message: "the action {action} is neither \"link\" nor \"unlink\""
declared := rego.metadata.rule().custom.checks

# Each check fails when it cannot be shown to pass.

_failed contains "linker" if not _may_link

_facts["linker"] := {"role": _role, "resource_type": _resource_type, "links": _role_links}

default _case["linker"] := "unlisted"

_case["linker"] := "undeclared" if not _is_role_declared

_failed contains "own_task" if not _is_other_task

_facts["own_task"] := {"agent": object.get(_principal, "agent", null), "task": _task_id}

_failed contains "action" if not _is_action_valid

_facts["action"] := {"action": _action}

# link_not_permitted: the catalogue declares the role, and its links name the
# resource's type ({type: true}). Both names must be strings, so that neither can
# index into a list.

_role := object.get(_principal, "role", null)

default _resource := {}

_resource := _link.resource if is_object(_link.resource)

_resource_type := object.get(_resource, "type", null)

_is_role_declared if {
	is_string(_role)
	is_object(data.capgate.catalogue.roles[_role])
}

_may_link if {
	_is_role_declared
	is_string(_resource_type)
	data.capgate.catalogue.roles[_role].links[_resource_type] == true
}

# The types the role may link, sorted, for the message ([] for an undeclared role).
default _role_links := []

_role_links := sort([kind | some kind, listed in data.capgate.catalogue.roles[_role].links; listed == true]) if {
	_is_role_declared
}

# link_own_task: both task ids are named, and differ. A missing id on either side
# cannot be shown to differ, so it fails.
_is_other_task if {
	_is_named(_task_id)
	_is_named(_own_task_id)
	_task_id != _own_task_id
}

_is_named(name) if {
	is_string(name)
	name != ""
}

# link_action_invalid

_is_action_valid if _action in {"link", "unlink"}
