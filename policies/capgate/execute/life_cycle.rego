# The life-cycle checks of execute (stage_invalid, review_required,
# proposal_not_approved, budget_exhausted): the facts the gateway supplies from its
# store for each stage, and the rules that read them. Part of package
# capgate.execute; its reasons are listed in execute.rego, with every other.
package capgate.execute

# stage_invalid, review_required. A tool needs review (ToolContract.needs_review)
# when its mode is propose_write or its approval is anything but "none". Read in the
# safe direction: only a contract with approval "none" and mode read or write is
# exempt, so a missing approval, and a missing or unknown mode, need review.

default _stage := null

_stage := input.stage

_stages := {"call", "propose", "dispatch"}

# The stages at which a tool that needs review is asked about.
_review_stages := {"propose", "dispatch"}

# The stages after which something runs: the budget is checked and obligations given.
_running_stages := {"call", "dispatch"}

_is_review_exempt if {
	_contract.approval == "none"
	_contract.mode in {"read", "write"}
}

_needs_review if {
	_is_known_tool
	not _is_review_exempt
}

_stage_fits if {
	input.stage == "call"
	not _needs_review
}

_stage_fits if {
	input.stage in _review_stages
	_needs_review
}

# proposal_not_approved: checked with the approval, when a tool that needs review is
# dispatched (_is_reviewed_dispatch). "dispatched" is a proposal whose one operation
# already ran and ended unknown or retryable: the gateway continues that operation
# (looking it up before sending again), it does not approve it a second time.

default _proposal := {}

_proposal := input.proposal if is_object(input.proposal)

_is_proposal_approved if {
	is_string(_proposal.id)
	_proposal.id != ""
	_proposal.status in {"approved", "dispatched"}
}

_proposal_format := concat("", [
	`proposal %s has status %s: only an "approved" proposal is dispatched, `,
	`or a "dispatched" one continued after an unknown or retryable outcome`,
])

_proposal_satisfied if input.stage in {"call", "propose"}

_proposal_satisfied if {
	_stage == "dispatch"
	_is_proposal_approved
}

# budget_exhausted: checked when something runs. The gateway sends the tenant's (or
# task's) remaining units before this call, null for no limit, and the contract's
# cost, which it reserves atomically after an allow. A contract without a cost that
# is a whole number of units, 0 or more, can never be afforded; nor can a budget that
# is missing, reserved another amount, or whose remaining is neither null nor a whole
# number.

default _budget := {}

_budget := input.budget if is_object(input.budget)

_is_whole(value) if {
	is_number(value)
	floor(value) == value
}

_cost := cost if {
	cost := _contract.cost
	_is_whole(cost)
	cost >= 0
}

_has_cost if is_number(_cost)

# The checks read input.budget, undefined wherever _budget's fields are.
_is_budget_reserved if input.budget.cost == _cost

_has_whole_remaining if _is_whole(input.budget.remaining)

_budget_fits if {
	_is_budget_reserved
	input.budget.remaining == null
}

_budget_fits if {
	_is_budget_reserved
	_has_whole_remaining
	input.budget.remaining >= _cost
}

_budget_satisfied if input.stage == "propose"

_budget_satisfied if {
	input.stage in _running_stages
	_budget_fits
}

# One operation is charged once. When the store already holds this operation id
# (running, or finished unknown, success or refused), this call reserves nothing: it
# waits for the running attempt, continues an unknown one (looking it up first), or
# returns the recorded outcome. Only a new operation ("none", or a missing or
# malformed fact: deny by default) and one whose earlier attempt was retryable
# (nothing happened, nothing is held) reserve the cost, so only they are checked.
_budget_satisfied if {
	input.stage in _running_stages
	_is_charge_held
}

_is_charge_held if input.operation.status in {"running", "unknown", "success", "refused"}

# The budget's fields as JSON for messages; never read by a check, where a missing
# remaining must not pass for null. The message names the first fault: the
# contract's cost, then the amount reserved, then the remaining units (by then not
# null, since a null remaining fits), then too few of them.
_reserved_text := _quote(object.get(_budget, "cost", null))

_remaining_text := _quote(object.get(_budget, "remaining", null))

_budget_message := sprintf("the contract of tool %s has no cost in whole units, 0 or more", [_quote(_name)]) if {
	not _has_cost
} else := sprintf("the call reserved %s units of budget and tool %s costs %s", [
	_reserved_text,
	_quote(_name),
	_quote(_cost),
]) if {
	not _is_budget_reserved
} else := sprintf("the budget's remaining units %s are neither null nor a whole number", [_remaining_text]) if {
	not _has_whole_remaining
} else := sprintf("the budget has %s units left and tool %s costs %s", [_remaining_text, _quote(_name), _quote(_cost)])
