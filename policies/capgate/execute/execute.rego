# METADATA
# title: Execute
# description: |
#   May this exact call run now, at this stage of its life cycle? The called tool must
#   be in the catalogue, pass every compose check (re-derived through
#   capgate.visibility, so a tool hidden at compose time is never callable) and every
#   call-time check that applies at the stage: a tool that needs no review is called
#   ("call"); one that does is proposed ("propose", nothing runs) and, once a person
#   approved it, dispatched ("dispatch") under the facts of that moment. Query
#   data.capgate.execute.decision.
# custom:
#   reason_codes:
#     - unknown_tool
#     - version_mismatch
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
#     - tool_quarantined
#     - stage_invalid
#     - review_required
#     - approval_required
#     - approval_mismatch
#     - approval_expired
#     - approval_used
#     - proposal_not_approved
#     - budget_exhausted
#     - evidence_missing
#     - subject_out_of_scope
#     - operation_id_missing
#   obligation_codes:
#     - pass_idempotency_key
package capgate.execute

import data.capgate.provenance
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
# custom:
#   reason_codes:
#     - unknown_tool
#     - version_mismatch
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
#     - tool_quarantined
#     - stage_invalid
#     - review_required
#     - approval_required
#     - approval_mismatch
#     - approval_expired
#     - approval_used
#     - proposal_not_approved
#     - budget_exhausted
#     - evidence_missing
#     - subject_out_of_scope
#     - operation_id_missing
#   obligation_codes:
#     - pass_idempotency_key
decision := {
	"allow": allow,
	"reasons": reasons,
	"obligations": obligations,
	"catalogue_digest": provenance.catalogue_digest,
}

default allow := false

# Every check is granted positively here as well as having no reason against it, so
# a reason that failed to render can never turn into an allow.
allow if {
	_is_known_tool
	count(visibility.called_failed_checks) == 0
	_version_matches
	_stage_fits
	_approval_satisfied
	_proposal_satisfied
	_budget_satisfied
	_evidence_complete
	_subject_in_scope
	_has_idempotency_key
	count(reasons) == 0
}

obligations contains {"code": "pass_idempotency_key", "params": {"key": input.call.operation_id}} if {
	_needs_idempotency_key
	allow
	input.stage in _running_stages
}

# Reasons. unknown_tool stands alone: nothing else is derived for a tool the
# catalogue does not know. Each other reason first asks whether its check failed
# (the rule allow requires, or the compose checks' failed set), the cheapest way out
# on an allowed call; the rest of its body decides the reason as before.

reasons contains {"code": "unknown_tool", "message": message} if {
	not _is_known_tool
	message := sprintf("tool %s is not in the catalogue", [_quote(_name)])
}

# The compose checks, exactly as compose runs them.
reasons contains reason if {
	_is_known_tool
	some check in visibility.called_failed_checks
	reason := visibility.reason(check, _name)
}

reasons contains {"code": "version_mismatch", "message": message} if {
	not _version_matches
	_is_known_tool
	message := sprintf("the call names version %s of tool %s but the catalogue has version %s", [
		_quote(object.get(_call, "version", null)),
		_quote(_name),
		_quote(object.get(_contract, "version", null)),
	])
}

reasons contains {"code": "stage_invalid", "message": message} if {
	not _stage_fits
	_is_known_tool
	not _stage in _stages
	message := sprintf(`the call's stage %s is not one of "call", "propose" and "dispatch"`, [_quote(_stage)])
}

reasons contains {"code": "stage_invalid", "message": message} if {
	not _stage_fits
	_stage in _review_stages
	_is_known_tool
	not _needs_review
	message := sprintf(`tool %s needs no review, so it is called (stage "call"), never at stage %s`, [
		_quote(_name),
		_quote(_stage),
	])
}

reasons contains {"code": "review_required", "message": message} if {
	not _stage_fits
	_stage == "call"
	_needs_review
	message := sprintf(`tool %s needs review: propose it (stage "propose"), then dispatch it`, [_quote(_name)])
}

reasons contains {"code": "approval_required", "message": message} if {
	_is_reviewed_dispatch
	not _has_approval
	message := sprintf("tool %s needs an approval of kind %s and the call carries none", [
		_quote(_name),
		_quote(object.get(_contract, "approval", null)),
	])
}

reasons contains {"code": "approval_mismatch", "message": message} if {
	_is_reviewed_dispatch
	_has_approval
	count(_approval_mismatches) > 0
	fields := concat(", ", sort(_approval_mismatches))
	message := sprintf("the approval does not match the contract and the call in: %s", [fields])
}

reasons contains {"code": "approval_expired", "message": message} if {
	_is_reviewed_dispatch
	_has_approval
	not _is_approval_unexpired
	expires_at := _quote(object.get(input.approval, "expires_at", null))
	message := sprintf("the approval's expiry %s is not an RFC 3339 time later than now", [expires_at])
}

# An approval allows one dispatch: the gateway marks it used when it dispatches.
reasons contains {"code": "approval_used", "message": message} if {
	_is_reviewed_dispatch
	_has_approval
	not _is_approval_unused
	used := _quote(object.get(input.approval, "used", null))
	message := sprintf("the approval's used is %s, not false: an approval allows one dispatch only", [used])
}

reasons contains {"code": "proposal_not_approved", "message": message} if {
	_is_reviewed_dispatch
	not _is_proposal_approved
	message := sprintf(_proposal_format, [
		_quote(object.get(_proposal, "id", null)),
		_quote(object.get(_proposal, "status", null)),
	])
}

reasons contains {"code": "budget_exhausted", "message": _budget_message} if {
	not _budget_satisfied
	_is_known_tool
	_stage in _running_stages
	not _budget_fits
	not _is_charge_held
}

# One reason per required evidence name the call does not bring.
reasons contains {"code": "evidence_missing", "message": message} if {
	not _evidence_complete
	_is_known_tool
	some required in _missing_evidence
	message := sprintf("tool %s requires evidence %s, which the call does not bring", [_quote(_name), _quote(required)])
}

# A contract whose requires is not a list is itself missing evidence.
reasons contains {"code": "evidence_missing", "message": message} if {
	not _evidence_complete
	_is_known_tool
	not _has_requires_list
	message := sprintf("the contract of tool %s has no valid list of required evidence", [_quote(_name)])
}

reasons contains {"code": "subject_out_of_scope", "message": message} if {
	not _subject_in_scope
	_is_known_tool
	message := sprintf("tool %s acts only on a %s linked to the task, and the call's subject %s is not one", [
		_quote(_name),
		_quote(object.get(_contract, "subject_type", null)),
		_quote(object.get(_call, "subject", null)),
	])
}

# The pass_idempotency_key obligation needs the operation id, and an allow without
# a usable key must not happen.
reasons contains {"code": "operation_id_missing", "message": message} if {
	not _has_idempotency_key
	_is_known_tool
	message := sprintf("tool %s takes an idempotency key and the call has no operation_id", [_quote(_name)])
}

# The call and its contract, normalised: a call that is not an object is {}, and a
# catalogue entry that is not an object is no contract at all.

default _call := {}

_call := input.call if is_object(input.call)

_name := object.get(_call, "tool", null)

# Read straight from input.call.tool, which is undefined exactly when _name is null:
# the same contract, without asking _call and _name on every call.
_contract := contract if {
	tools := data.capgate.catalogue.tools
	is_object(tools)
	contract := tools[input.call.tool]
	is_object(contract)
}

_is_known_tool if is_object(_contract)

_quote(value) := json.marshal(value)

# version_mismatch

# A lookup in input.call is undefined whenever one in _call is: read the call directly.
_version_matches if {
	is_number(input.call.version)
	input.call.version == _contract.version
}

# approval_required, approval_mismatch, approval_expired, approval_used and
# proposal_not_approved: checked when a tool that needs review is dispatched, and
# only then. A call needs no approval (its tool needs no review, or review_required
# denies it) and a proposal has none yet.

_is_reviewed_dispatch if {
	input.stage == "dispatch"
	_needs_review
}

_has_approval if is_object(input.approval)

_approval_satisfied if input.stage in {"call", "propose"}

_approval_satisfied if {
	_stage == "dispatch"
	_has_approval
	count(_approval_mismatches) == 0
	_is_approval_unexpired
	_is_approval_unused
}

# Exactly false: true, a missing value or any other value reads as used.
_is_approval_unused if input.approval.used == false

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
_is_approval_unexpired if {
	is_string(input.approval.expires_at)
	regex.match(_rfc3339_date_time, input.approval.expires_at)
	time.parse_rfc3339_ns(upper(input.approval.expires_at)) > time.now_ns()
}

_rfc3339_date_time := concat("", [
	`^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])`,
	`[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?`,
	`([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`,
])

# evidence_missing

_evidence contains name if {
	is_array(input.evidence)
	some name in input.evidence
}

# Negate this rule, never `is_array(_contract.requires)` itself: OPA evaluates a
# call's reference arguments outside the `not`, so a missing field would leave the
# negation undefined instead of true.
_has_requires_list if is_array(_contract.requires)

_missing_evidence contains required if {
	_has_requires_list
	some required in _contract.requires
	not required in _evidence
}

# Exactly when _missing_evidence is empty, asked without building it: each required
# name in turn, so a contract that requires nothing needs no look at the evidence.
_evidence_complete if {
	requires := _contract.requires
	is_array(requires)
	every required in requires {
		required in _evidence
	}
}

# subject_out_of_scope: a tool with a subject_type acts only on a subject of that
# type that is one of the task's linked resources.

_subject_in_scope if _contract.subject_type == null

# Some linked resource, with a string type and id, is the call's subject.
_subject_in_scope if {
	input.call.subject.type == _contract.subject_type
	is_array(input.task.linked_resources)
	some resource in input.task.linked_resources
	is_string(resource.type)
	is_string(resource.id)
	resource.type == input.call.subject.type
	resource.id == input.call.subject.id
}

# operation_id_missing

_needs_idempotency_key if _contract.idempotency == "idempotent_with_key"

_has_idempotency_key if not _needs_idempotency_key

_has_idempotency_key if {
	is_string(input.call.operation_id)
	input.call.operation_id != ""
}
