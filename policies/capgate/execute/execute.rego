# METADATA
# title: Execute
# description: |
#   May this exact call run now, at this stage of its life cycle? The called tool must
#   be in the catalogue, pass every compose check (re-derived through
#   capgate.visibility, so a tool hidden at compose time is never callable) and every
#   call-time check that applies at the stage: a tool that needs no review is called
#   ("call"); one that does is proposed ("propose", nothing runs) and, once a person
#   approved it, dispatched ("dispatch") under the facts of that moment. Query
#   data.capgate.execute.decision. The compose checks are declared in
#   capgate.visibility, the call-time checks in declared (checks.rego), each with
#   its codes and message templates.
# schemas:
#   - input: schema.execute
package capgate.execute

import data.capgate.provenance
import data.capgate.reasons as rendering
import data.capgate.versions
import data.capgate.visibility

# METADATA
# title: Execute decision
# description: |
#   {"allow": bool, "reasons": [{"code", "message"}, ...], "obligations": [...],
#   "catalogue_digest": digest}. Always defined, whatever the input: anything missing
#   or malformed is a deny with a reason. Obligations are only attached to an allow
#   at stage "call" or "dispatch", never to a proposal, since nothing runs then.
#   catalogue_digest is the digest of the catalogue the decision was made under
#   (capgate.provenance), which the client checks.
# entrypoint: true
decision := {
	"allow": allow,
	"reasons": reasons,
	"obligations": obligations,
	"catalogue_digest": provenance.catalogue_digest,
}

# METADATA
# scope: document
# title: Allow
# description: |
#   True only for a tool the catalogue knows that passes every compose check and
#   every call-time check. The checks are evaluated once: allow and the reasons both
#   come from the tool's compose checks (visibility.called_passes, and
#   called_failed_checks) and the call-time checks that fail (_failed), and every
#   reason blocks an allow, so one that failed to render never turns into one.
default allow := false

allow if {
	_is_known_tool
	visibility.called_passes
	count(_failed) == 0
	count(reasons) == 0
}

# METADATA
# title: Obligations
# description: |
#   What the dispatcher must do when it carries out an allow, declared here. Only an
#   allow at stage "call" or "dispatch" carries any: nothing runs at "propose".
# custom:
#   obligations:
#     pass_idempotency_key:
#       title: Pass the idempotency key
#       params: [key]
obligations contains {"code": "pass_idempotency_key", "params": {"key": input.call.operation_id}} if {
	_contract.idempotency == "idempotent_with_key"
	allow
	input.stage in _running_stages
}

# METADATA
# scope: document
# title: Reasons
# description: |
#   {"code", "message"} for every failing check: unknown_tool alone for a tool the
#   catalogue does not know (nothing else is derived for it), else the reasons of
#   the tool's failing compose checks and of every failing call-time check but a
#   quiet one, each message the code's declared template filled with the check's
#   facts.
reasons contains {"code": "unknown_tool", "message": message} if {
	not _is_known_tool
	template := rendering.template(rendering.templates.unknown_tool, "call")
	message := rendering.message(template, {"tool": _name})
}

# The compose checks, exactly as compose runs them.
reasons contains visibility.reason(check, _name) if {
	not visibility.called_passes
	_is_known_tool
	some check in visibility.called_failed_checks
}

reasons contains reason if {
	_is_known_tool
	some check in _failed
	not check in _quiet
	some reason in _call_reasons[check]
}

# The reasons of a failing call-time check: its code, and the code's message (the
# one for the check's case, when it has several) filled with the check's facts; one
# for each element of the fact the code names under `each`, when that is a
# non-empty list.
_call_reasons[check] := {{"code": code, "message": rendering.message(template, values)} |
	spec := _call_codes[code]
	template := rendering.template(spec, object.get(_call_case, check, null))
	facts := object.union(object.get(_call_facts, check, {}), {"tool": _name})
	some values in rendering.each(object.get(spec, "each", null), facts)
} if {
	some check in _failed
	code := _code_of[check]
}

_code_of[check] := _call_code[check] if some check in _failed

_code_of[check] := _single_code[check] if {
	some check in _failed
	not _call_code[check]
}

_call_codes[code] := spec if {
	some declaration in declared
	some code, spec in declaration.codes
}

_single_code[declaration.check] := code if {
	some declaration in declared
	count(declaration.codes) == 1
	some code, _ in declaration.codes
}

# The call and its contract, normalised: a call that is not an object is {}, and a
# catalogue entry that is not an object is no contract at all.

default _call := {}

_call := input.call if is_object(input.call)

_name := object.get(_call, "tool", null)

# Read straight from input.call.tool, which is undefined exactly when _name is null:
# the same contract, without asking _call and _name on every call. At dispatch, a
# proposal made under an earlier version the catalogue keeps (retained) is decided
# under that version's contract; anything else under today's, whose version check
# then denies a call naming another version (version_mismatch).
_contract := versions.kept(data.capgate.catalogue, input.call.tool, input.call.version) if {
	input.stage == "dispatch"
} else := _current if {
	is_object(_current)
}

_current := contract if {
	tools := data.capgate.catalogue.tools
	is_object(tools)
	contract := tools[input.call.tool]
	is_object(contract)
}

_is_known_tool if is_object(_contract)

# METADATA
# title: Every check of the call
# description: |
#   [{"check", "pass", "code", "facts"}, ...]: for a tool the catalogue lacks, only
#   the tool check (unknown_tool); else the tool check, the tool's compose checks
#   (capgate.visibility.checks) and the call-time checks in their declared order,
#   each failing exactly when it is in the set of failing checks allow and the
#   reasons come from. code is null exactly when the check passes.
#   capgate.explain.execute answers with it.
checks := [_tool_check(false)] if {
	not _is_known_tool
} else := array.concat(
	array.concat([_tool_check(true)], visibility.checks(_name)),
	[_call_check[declaration.check] | some declaration in declared],
)

_tool_check(true) := {"check": "tool", "pass": true, "code": null, "facts": {"tool": _name}}

_tool_check(false) := {"check": "tool", "pass": false, "code": "unknown_tool", "facts": {"tool": _name}}

_call_check[check] := {"check": check, "pass": true, "code": null, "facts": _call_facts[check]} if {
	some declaration in declared
	check := declaration.check
	not check in _failed
}

_call_check[check] := {"check": check, "pass": false, "code": _code_of[check], "facts": _call_facts[check]} if {
	some check in _failed
}

# Facts as the checks report them: a missing value is null.

default _needs_review_fact := false

_needs_review_fact if _needs_review

default _has_approval_fact := false

_has_approval_fact if _has_approval

default _approval_fact := {}

_approval_fact := input.approval if _has_approval

default _operation_status := null

_operation_status := input.operation.status

_has_approval if is_object(input.approval)

_approval_mismatches contains "kind" if not _approval_kind_matches

_approval_mismatches contains "tool" if not _approval_tool_matches

_approval_mismatches contains "digest" if not _approval_digest_matches

_approval_mismatches contains "operation_id" if not _approval_operation_matches

_approval_mismatches contains "tenant" if not _approval_tenant_matches

_approval_kind_matches if {
	is_string(input.approval.kind)
	input.approval.kind == _contract.approval
}

_approval_tool_matches if input.approval.tool == _name

# An approval is for one operation of one tenant: the operation id is the idempotency
# key the tool receives, so an approved write happens at most once, and an approval
# cannot be replayed under a new operation id or by another tenant.
_approval_operation_matches if {
	is_string(input.approval.operation_id)
	input.approval.operation_id == _call.operation_id
}

_approval_tenant_matches if {
	is_string(input.approval.tenant)
	input.approval.tenant == input.principal.tenant
}

_approval_digest_matches if {
	regex.match(`^sha256:[0-9a-f]{64}$`, input.approval.digest)
	input.approval.digest == _call.params_digest
}

# Undefined when expires_at is missing, not a string or not strict RFC 3339, so a
# malformed expiry reads as expired. The shape is checked before parsing because
# Go's parser is more lenient than RFC 3339 (a one-digit hour, a +24:00 or +02:60
# offset, a comma before the fraction) and refuses the lower-case "t" and "z" that
# RFC 3339 section 5.6 allows; the parser then checks the calendar (no 30 February).
_is_approval_unexpired if _is_unexpired(input.approval.expires_at)

_is_unexpired(expires_at) if {
	is_string(expires_at)
	regex.match(_rfc3339_date_time, expires_at)
	time.parse_rfc3339_ns(upper(expires_at)) > time.now_ns()
}

# The distinct people who approved this call and whose approval is unexpired, in
# lower case: each approver the store holds for the proposal (the gateway names
# the person an agent reviewer acts for), or the approval's own reviewer when it
# lists none.
_approvers contains lower(input.approval.approved_by) if {
	is_string(input.approval.approved_by)
	not _lists_approvers
	_is_approval_unexpired
}

_approvers contains lower(approver.by) if {
	some approver in input.approval.approvers
	is_string(approver.by)
	_is_unexpired(approver.expires_at)
}

_lists_approvers if count(input.approval.approvers) > 0

_rfc3339_date_time := concat("", [
	`^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])`,
	`[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?`,
	`([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`,
])

# The evidence the call brings, and the required names it lacks. input.evidence
# holds the names of the pieces that never expire, input.evidence_about every piece
# with its subject and expiry (null: never).
_evidence contains name if {
	is_array(input.evidence)
	some name in input.evidence
}

_evidence_about contains piece if {
	is_array(input.evidence_about)
	some piece in input.evidence_about
	is_object(piece)
}

_missing_evidence contains required if {
	is_array(_contract.requires)
	some required in _contract.requires
	not _is_evidence_brought(required)
}

# What each required name must be about, by name ({"about": "subject"} or
# {"about": <value>, "type": <its evidence's type>}); a name absent is about anything.
default _requires_about := {}

_requires_about := _contract.requires_about if is_object(_contract.requires_about)

# Evidence about anything: a name that never expires, or any unexpired piece of it.
_is_evidence_brought(name) if {
	not _requires_about[name]
	name in _evidence
}

_is_evidence_brought(name) if {
	not _requires_about[name]
	some piece in _evidence_about
	piece.name == name
	_is_piece_unexpired(piece.expires_at)
}

# Evidence about something: an unexpired piece of that name about exactly the call's
# subject, or about exactly the call's value (a string) as its evidence's type. A
# binding the call cannot fill (no subject, a null or absent value, a malformed
# binding) has no target, so nothing brings it.
_is_evidence_brought(name) if {
	target := _evidence_target[name]
	some piece in _evidence_about
	piece.name == name
	piece.subject == target
	_is_piece_unexpired(piece.expires_at)
}

_evidence_target[name] := {"type": subject.type, "id": subject.id} if {
	some name, binding in _requires_about
	binding.about == "subject"
	subject := input.call.subject
	is_string(subject.type)
	is_string(subject.id)
}

_evidence_target[name] := {"type": binding.type, "id": value} if {
	some name, binding in _requires_about
	is_string(binding.about)
	binding.about != "subject"
	is_string(binding.type)
	value := input.call.values[binding.about]
	is_string(value)
	value != ""
}

# A piece's expiry: null never expires, anything else as an approval's expiry.
_is_piece_unexpired(null)

_is_piece_unexpired(expires_at) if _is_unexpired(expires_at)

# Some linked resource, with a string type and id, is the call's subject, of the
# contract's subject_type.
_is_subject_linked if {
	input.call.subject.type == _contract.subject_type
	is_array(input.task.linked_resources)
	some resource in input.task.linked_resources
	is_string(resource.type)
	is_string(resource.id)
	resource.type == input.call.subject.type
	resource.id == input.call.subject.id
}

_has_operation_id if {
	is_string(input.call.operation_id)
	input.call.operation_id != ""
}
