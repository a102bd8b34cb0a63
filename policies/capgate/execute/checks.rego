# Every check execute makes of a call, one entry per check, for capgate.explain: the
# same conditions that allow requires, with the code each gives when it fails and
# the facts it read. Part of package capgate.execute; its reasons are listed in
# execute.rego, with every other.
package capgate.execute

import data.capgate.visibility

# METADATA
# title: Every check of the call
# description: |
#   [{"check", "pass", "code", "facts"}, ...]: for a tool the catalogue lacks, only
#   the tool check (unknown_tool); else the tool check, the tool's compose checks
#   (capgate.visibility.checks) and the call-time checks (version, stage, approval,
#   approval_expiry, approval_use, proposal, budget_units, evidence, subject,
#   operation_id). Each passes exactly when the condition allow requires of it holds,
#   so allow is true only when every check passes. code is null exactly when the
#   check passes. capgate.explain.execute answers with it.
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
checks := [_unknown_tool_check] if {
	not _is_known_tool
} else := array.concat(
	array.concat([_tool_check], visibility.checks(_name)),
	[_call_check(check, code, facts) | some [check, code, facts] in _call_checks],
)

_unknown_tool_check := {"check": "tool", "pass": false, "code": "unknown_tool", "facts": {"tool": _name}}

_tool_check := {"check": "tool", "pass": true, "code": null, "facts": {"tool": _name}}

_call_check(check, _, facts) := {"check": check, "pass": true, "code": null, "facts": facts} if {
	not check in _failed
}

_call_check(check, code, facts) := {"check": check, "pass": false, "code": code, "facts": facts} if {
	check in _failed
}

# Each call-time check: its name, its code when it fails and the facts it read.
_call_checks := [
	["version", "version_mismatch", {
		"call_version": object.get(_call, "version", null),
		"contract_version": object.get(_contract, "version", null),
	}],
	["stage", _stage_code, {"stage": _stage, "needs_review": _needs_review_fact}],
	["approval", _approval_code, {
		"present": _has_approval_fact,
		"mismatches": sort(_approval_mismatches),
	}],
	["approval_expiry", "approval_expired", {"expires_at": object.get(_approval_fact, "expires_at", null)}],
	["approval_use", "approval_used", {"used": object.get(_approval_fact, "used", null)}],
	["proposal", "proposal_not_approved", {
		"id": object.get(_proposal, "id", null),
		"status": object.get(_proposal, "status", null),
	}],
	["budget_units", "budget_exhausted", {
		"remaining": object.get(_budget, "remaining", null),
		"reserved": object.get(_budget, "cost", null),
		"cost": object.get(_contract, "cost", null),
		"operation_status": _operation_status,
	}],
	["evidence", "evidence_missing", {
		"required": object.get(_contract, "requires", null),
		"missing": sort(_missing_evidence),
	}],
	["subject", "subject_out_of_scope", {
		"subject_type": object.get(_contract, "subject_type", null),
		"subject": object.get(_call, "subject", null),
	}],
	["operation_id", "operation_id_missing", {
		"idempotency": object.get(_contract, "idempotency", null),
		"operation_id": object.get(_call, "operation_id", null),
	}],
]

# The call-time checks that fail: each one's condition is the one allow requires.
_failed contains "version" if not _version_matches

_failed contains "stage" if not _stage_fits

_failed contains "approval" if not _is_approval_given

_failed contains "approval_expiry" if not _is_approval_fresh

_failed contains "approval_use" if not _is_approval_spare

_failed contains "proposal" if not _proposal_satisfied

_failed contains "budget_units" if not _budget_satisfied

_failed contains "evidence" if not _evidence_complete

_failed contains "subject" if not _subject_in_scope

_failed contains "operation_id" if not _has_idempotency_key

# _approval_satisfied, split into the three checks explain reports: each passes at
# stages "call" and "propose", and at "dispatch" the three together are exactly
# _approval_satisfied.
_is_approval_given if _stage in {"call", "propose"}

_is_approval_given if {
	_has_approval
	count(_approval_mismatches) == 0
}

_is_approval_fresh if _stage in {"call", "propose"}

_is_approval_fresh if not _has_approval

_is_approval_fresh if _is_approval_unexpired

_is_approval_spare if _stage in {"call", "propose"}

_is_approval_spare if not _has_approval

_is_approval_spare if _is_approval_unused

default _approval_code := "approval_required"

_approval_code := "approval_mismatch" if _has_approval

default _stage_code := "stage_invalid"

_stage_code := "review_required" if {
	_stage == "call"
	_needs_review
}

default _needs_review_fact := false

_needs_review_fact if _needs_review

default _has_approval_fact := false

_has_approval_fact if _has_approval

default _operation_status := null

_operation_status := input.operation.status

default _approval_fact := {}

_approval_fact := input.approval if _has_approval
