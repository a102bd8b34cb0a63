# METADATA
# title: Link
# description: |
#   May this agent link this resource to this task, or unlink it? A task gains what
#   it may reach through its recorded links (a task type whose links are
#   "recorded"), so linking is itself a permission: the agent's role lists the
#   resource types it may link, and no agent changes the links of the task it works
#   in. The gateway links in the agent's own tenant only. Operators and services
#   that link through the library or the command line are trusted callers and are
#   not asked about here. Query data.capgate.link.decision. Its checks are declared,
#   with their codes and message templates, in declared.
# schemas:
#   - input: schema.link
package capgate.link

import data.capgate.provenance
import data.capgate.reasons as rendering

# METADATA
# title: Link decision
# description: |
#   {"allow": bool, "reasons": [{"code", "message"}, ...], "catalogue_digest":
#   digest}. Always defined, whatever the input: anything missing or malformed is a
#   deny with the reason of the check that reads it. catalogue_digest is the digest
#   of the catalogue the decision was made under (capgate.provenance), which the
#   client checks.
# entrypoint: true
decision := {
	"allow": allow,
	"reasons": reasons,
	"catalogue_digest": provenance.catalogue_digest,
}

# METADATA
# scope: document
# title: Allow
# description: |
#   True only when no check fails and every failing check rendered its reason (a
#   reason that failed to render never turns into an allow).
default allow := false

allow if {
	count(_failed) == 0
	count(reasons) == 0
}

# METADATA
# scope: document
# title: Reasons
# description: |
#   {"code", "message"} for every failing check: its declared code with its
#   message, for the check's case when it has several, filled with its facts.
reasons contains {"code": code, "message": message} if {
	some check in _failed
	some declaration in declared
	declaration.check == check
	some code, spec in declaration.codes
	message := rendering.message(rendering.template(spec, object.get(_case, check, null)), _facts[check])
}

# The facts, normalised: a principal, task, link or resource that is not an object
# is {}, so every check that reads it fails.

default _principal := {}

_principal := input.principal if is_object(input.principal)

default _link := {}

_link := input.link if is_object(input.link)

_task_id := object.get(_link, "task_id", null)

_action := object.get(_link, "action", null)

default _own_task_id := null

_own_task_id := input.task.id if is_object(input.task)
