# The call-time checks: each declared once and written once, here. A check is its
# declaration (an entry of the METADATA of declared: its title, the facts it reads,
# the codes it gives with their titles and message templates), the conditions under
# which it fails (_failed), the facts it reports (_call_facts) and, when it gives
# several codes or messages, which (_call_code, _call_case). execute.rego derives
# from these alone the allow, the reasons and explain's checks, all from one
# evaluation of _failed. Part of package capgate.execute.
package capgate.execute

import data.capgate.quorum

# METADATA
# title: The call-time checks, declared
# description: |
#   Every call-time check, in the order explain reports them after the tool's
#   compose checks. Each names the facts it reads and the codes it gives, each code
#   with its title and its message template ({tool} is the called tool, every other
#   {name} a fact, as compact JSON); a code with several messages names them by
#   case, and a code with `each` gives one reason for each element of that fact
#   (whose `fields`, for an element that is an object, a message may name too).
# custom:
#   checks:
#     - check: version
#       title: Version
#       description: The call names the catalogue's version of the tool.
#       facts: [call_version, contract_version]
#       codes:
#         version_mismatch:
#           title: Version mismatch
#           message: >-
#             the call names version {call_version} of tool {tool} but the catalogue
#             has version {contract_version}
#     - check: stage
#       title: Stage
#       description: A tool that needs no review is called; one that needs review is proposed, then dispatched.
#       facts: [stage, needs_review]
#       codes:
#         stage_invalid:
#           title: Stage invalid
#           messages:
#             unknown: the call's stage {stage} is not one of "call", "propose" and "dispatch"
#             exempt: tool {tool} needs no review, so it is called (stage "call"), never at stage {stage}
#         review_required:
#           title: Review required
#           message: 'tool {tool} needs review: propose it (stage "propose"), then dispatch it'
#     - check: approval
#       title: Approval
#       description: At dispatch, an approval is present and matches the contract and the call.
#       facts: [present, kind, mismatches]
#       codes:
#         approval_required:
#           title: Approval required
#           message: tool {tool} needs an approval of kind {kind} and the call carries none
#         approval_mismatch:
#           title: Approval mismatch
#           message: 'the approval does not match the contract and the call in: {mismatches}'
#     - check: approval_expiry
#       title: Approval expiry
#       description: At dispatch, the approval expires later than OPA's clock.
#       facts: [expires_at]
#       codes:
#         approval_expired:
#           title: Approval expired
#           message: the approval's expiry {expires_at} is not an RFC 3339 time later than now
#     - check: approval_quorum
#       title: Approval quorum
#       description: At dispatch, as many distinct reviewers as the quorum asks have approved, unexpired.
#       facts: [required, approvers]
#       codes:
#         approval_quorum_not_met:
#           title: Approval quorum not met
#           message: >-
#             tool {tool} needs {required} distinct approvals of this call and it has
#             {approvers}
#     - check: approval_use
#       title: Approval use
#       description: At dispatch, the approval has not been used.
#       facts: [used]
#       codes:
#         approval_used:
#           title: Approval used
#           message: 'the approval''s used is {used}, not false: an approval allows one dispatch only'
#     - check: proposal
#       title: Proposal
#       description: At dispatch, the proposal is approved, or dispatched and continued.
#       facts: [id, status]
#       codes:
#         proposal_not_approved:
#           title: Proposal not approved
#           message: >-
#             proposal {id} has status {status}: only an "approved" proposal is
#             dispatched, or a "dispatched" one continued after an unknown or
#             retryable outcome
#     - check: budget_units
#       title: Budget units
#       description: When something runs, the budget reserves the contract's cost and has that many units left.
#       facts: [remaining, reserved, cost, operation_status]
#       codes:
#         budget_exhausted:
#           title: Budget exhausted
#           messages:
#             cost: the contract of tool {tool} has no cost in whole units, 0 or more
#             reserved: the call reserved {reserved} units of budget and tool {tool} costs {cost}
#             remaining: the budget's remaining units {remaining} are neither null nor a whole number
#             short: the budget has {remaining} units left and tool {tool} costs {cost}
#     - check: limits
#       title: Limits
#       description: Each value the contract limits is at most its limit for the caller's role.
#       facts: [over]
#       codes:
#         value_over_limit:
#           title: Value over limit
#           each: over
#           fields: [value, max, role, actual]
#           message: >-
#             tool {tool} allows {value} up to {max} for role {role}, and the call's
#             {value} is {actual}
#     - check: evidence
#       title: Evidence
#       description: >-
#         The call brings every piece of evidence the contract requires, unexpired and
#         about what the contract says (about: the call's subject or one of its
#         values; absent, about anything).
#       facts: [required, about, missing]
#       codes:
#         evidence_missing:
#           title: Evidence missing
#           each: missing
#           messages:
#             missing: tool {tool} requires evidence {missing}, which the call does not bring
#             malformed: the contract of tool {tool} has no valid list of required evidence
#     - check: subject
#       title: Subject
#       description: A tool with a subject type acts only on a subject of that type linked to the task.
#       facts: [subject_type, subject]
#       codes:
#         subject_out_of_scope:
#           title: Subject out of scope
#           message: >-
#             tool {tool} acts only on a {subject_type} linked to the task, and the
#             call's subject {subject} is not one
#     - check: operation_id
#       title: Operation id
#       description: A tool that takes an idempotency key is called with an operation id.
#       facts: [idempotency, operation_id]
#       codes:
#         operation_id_missing:
#           title: Operation id missing
#           message: tool {tool} takes an idempotency key and the call has no operation_id
declared := rego.metadata.rule().custom.checks

# Each check fails when one of its _failed conditions holds, and passes otherwise.
# A condition negates only a comparison or a rule: OPA evaluates a reference inside
# another (a key in brackets) or passed to a call outside the `not`, so a missing
# value there would leave the condition undefined instead of true, and the check
# passing; such a value is read through a rule with a default (_stage) or bound
# first. A condition that applies at one stage compares input.stage with it first,
# so that OPA's rule index skips it at every other stage. A check may fail quietly
# (_quiet): it denies, explain shows it, and another check's reason says why.

# version_mismatch

_failed contains "version" if not input.call.version == _contract.version

_failed contains "version" if {
	version := input.call.version
	not is_number(version)
}

_call_facts["version"] := {
	"call_version": object.get(_call, "version", null),
	"contract_version": object.get(_contract, "version", null),
}

# stage_invalid, review_required. A tool needs review (ToolContract.needs_review)
# when its mode is propose_write or its approval is anything but "none". Read in
# the safe direction: only a contract with approval "none" and mode read or write is
# exempt, so a missing approval, and a missing or unknown mode, need review.

_failed contains "stage" if {
	input.stage == "call"
	_needs_review
}

_failed contains "stage" if {
	input.stage == "propose"
	not _needs_review
}

_failed contains "stage" if {
	input.stage == "dispatch"
	not _needs_review
}

_failed contains "stage" if not _stage in _stages

_needs_review if not _contract.approval == "none"

_needs_review if {
	mode := object.get(_contract, "mode", null)
	not mode in {"read", "write"}
}

_call_facts["stage"] := {"stage": _stage, "needs_review": _needs_review_fact}

default _call_code["stage"] := "stage_invalid"

_call_code["stage"] := "review_required" if {
	_stage == "call"
	_needs_review
}

default _call_case["stage"] := "exempt"

_call_case["stage"] := "unknown" if not _stage in _stages

# approval_required, approval_mismatch, approval_expired, approval_used and
# proposal_not_approved: checked when a call is dispatched, and only then (a call
# needs no approval, a proposal has none yet); together, the approval the dispatch
# of a reviewed proposal needs. At the dispatch of a tool that needs no review they
# fail quietly: stage_invalid says why.

_failed contains "approval" if {
	input.stage == "dispatch"
	not _is_approval_matching
}

_is_approval_matching if {
	_has_approval
	count(_approval_mismatches) == 0
}

_call_facts["approval"] := {
	"present": _has_approval_fact,
	"kind": object.get(_contract, "approval", null),
	"mismatches": sort(_approval_mismatches),
}

default _call_code["approval"] := "approval_required"

_call_code["approval"] := "approval_mismatch" if _has_approval

_quiet contains "approval" if not _needs_review

_failed contains "approval_expiry" if {
	input.stage == "dispatch"
	_has_approval
	not _is_approval_unexpired
}

_call_facts["approval_expiry"] := {"expires_at": object.get(_approval_fact, "expires_at", null)}

_quiet contains "approval_expiry" if not _needs_review

# approval_quorum_not_met: the distinct reviewers whose approvals of this call are
# unexpired (the approval itself and every approver the store holds) are fewer than
# the contract's quorum for the call's values (capgate.quorum).
_failed contains "approval_quorum" if {
	input.stage == "dispatch"
	_has_approval
	_quorum > 1 # one approval: the approval checks above are the whole story
	not quorum.met(_contract, _values, _approvers)
}

_quorum := quorum.required(_contract, _values)

_call_facts["approval_quorum"] := {"required": _quorum, "approvers": count(_approvers)}

_quiet contains "approval_quorum" if not _needs_review

# An approval allows one dispatch: the gateway marks it used when it dispatches.
# Exactly false: true, a missing value or any other value reads as used.
_failed contains "approval_use" if {
	input.stage == "dispatch"
	_has_approval
	not input.approval.used == false
}

_call_facts["approval_use"] := {"used": object.get(_approval_fact, "used", null)}

_quiet contains "approval_use" if not _needs_review

_failed contains "proposal" if {
	input.stage == "dispatch"
	not _is_proposal_approved
}

_call_facts["proposal"] := {
	"id": object.get(_proposal, "id", null),
	"status": object.get(_proposal, "status", null),
}

_quiet contains "proposal" if not _needs_review

# budget_exhausted: checked when something runs, at "call" and "dispatch"
# (life_cycle.rego: what fits).

_failed contains "budget_units" if {
	input.stage == "call"
	not _budget_fits
	not _is_charge_held
}

_failed contains "budget_units" if {
	input.stage == "dispatch"
	not _budget_fits
	not _is_charge_held
}

_call_facts["budget_units"] := {
	"remaining": object.get(_budget, "remaining", null),
	"reserved": object.get(_budget, "cost", null),
	"cost": _call_cost,
	"operation_status": _operation_status,
}

# The message names the first fault: the contract's cost, then the amount reserved,
# then the remaining units (by then not null, since a null remaining fits), then
# too few of them.
default _call_case["budget_units"] := "short"

_call_case["budget_units"] := "cost" if {
	not _has_cost
} else := "reserved" if {
	not _is_budget_reserved
} else := "remaining" if {
	not _has_whole_remaining
}

# value_over_limit: one reason per limit of the contract that applies to the
# caller's role and that the call's value exceeds (life_cycle.rego: _over_limits).

_failed contains "limits" if count(_over_limits) > 0

_failed contains "limits" if {
	limits := object.get(_contract, "limits", [])
	not is_array(limits)
}

_call_facts["limits"] := {"over": sort(_over_limits)}

# evidence_missing: one reason per required name the call does not bring, unexpired
# and about what the contract's requires_about says (execute.rego: what brings it);
# a contract whose requires is not a list is itself missing evidence.

_failed contains "evidence" if {
	requires := object.get(_contract, "requires", null)
	not is_array(requires)
}

_failed contains "evidence" if {
	some required in _contract.requires
	not _is_evidence_brought(required)
}

_call_facts["evidence"] := {
	"required": object.get(_contract, "requires", null),
	"about": _requires_about,
	"missing": sort(_missing_evidence),
}

default _call_case["evidence"] := "malformed"

_call_case["evidence"] := "missing" if is_array(_contract.requires)

# subject_out_of_scope: a tool with a subject_type (a missing one counts as set)
# acts only on a subject of that type that is one of the task's linked resources.

_failed contains "subject" if {
	not _contract.subject_type == null
	not _is_subject_linked
}

_call_facts["subject"] := {
	"subject_type": object.get(_contract, "subject_type", null),
	"subject": object.get(_call, "subject", null),
}

# operation_id_missing: the pass_idempotency_key obligation needs the operation id,
# and an allow without a usable key must not happen.

_failed contains "operation_id" if {
	_contract.idempotency == "idempotent_with_key"
	not _has_operation_id
}

_call_facts["operation_id"] := {
	"idempotency": object.get(_contract, "idempotency", null),
	"operation_id": object.get(_call, "operation_id", null),
}
