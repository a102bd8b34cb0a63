# What the life-cycle checks of execute (checks.rego: stage, proposal, budget_units)
# read: the stages, the facts the gateway supplies from its store for each, and
# the rules that decide from them. Part of package capgate.execute.
package capgate.execute

import data.capgate.bounds

# The stages of a call's life cycle.

default _stage := null

_stage := input.stage

_stages := {"call", "propose", "dispatch"}

# The stages after which something runs: the budget is checked and obligations given.
_running_stages := {"call", "dispatch"}

# proposal_not_approved: checked with the approval, at dispatch. "dispatched" is a proposal whose one operation
# already ran and ended unknown or retryable: the gateway continues that operation
# (looking it up before sending again), it does not approve it a second time.

default _proposal := {}

_proposal := input.proposal if is_object(input.proposal)

_is_proposal_approved if {
	is_string(_proposal.id)
	_proposal.id != ""
	_proposal.status in {"approved", "dispatched"}
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

_cost := _call_cost if {
	_is_whole(_call_cost)
	_call_cost >= 0
}

# The call's cost: the contract's fixed cost or, for a contract that counts one of
# the call's values (cost_value: an amount in cents, say), that value; a null one (an
# absent optional parameter) counts 0, as the gateway reserves nothing for it.

default _cost_value_name := null

_cost_value_name := _contract.cost_value

# null when the contract has neither (a malformed one): never whole, never afforded.
default _call_cost := null

_call_cost := _contract.cost if _cost_value_name == null

_call_cost := _counted if is_string(_cost_value_name)

default _counted := 0

_counted := value if {
	value := _values[_cost_value_name]
	value != null
}

# The values of the call a policy may read (the contract's values:), {} if none.

default _values := {}

_values := input.call.values if is_object(input.call.values)

# The contract's limits that apply to the caller's role and that the call's value
# exceeds. A value that is not a number, or a limit that is not one, is over it: a
# malformed fact never passes. A null value (an absent optional parameter) is not.
_over_limits contains {"value": limit.value, "actual": actual, "max": limit.max, "role": input.principal.role} if {
	some limit in _contract.limits
	limit.roles[input.principal.role] == true
	actual := object.get(_values, limit.value, null)
	actual != null
	not bounds.at_most(actual, limit.max)
}

_has_cost if is_number(_cost)

_is_budget_reserved if input.budget.cost == _cost

_has_whole_remaining if _is_whole(input.budget.remaining)

# Read straight from input.budget and the call's cost, without _cost and
# _is_budget_reserved (which the message reads), since execute asks it of every call
# that runs: the budget reserved the call's cost, a whole number, 0 or more, and
# its remaining is null or at least that cost.
_budget_fits if {
	input.budget.cost == _call_cost
	input.budget.remaining == null
	_is_whole(_call_cost)
	_call_cost >= 0
}

_budget_fits if {
	input.budget.cost == _call_cost
	_is_whole(_call_cost)
	_call_cost >= 0
	_is_whole(input.budget.remaining)
	input.budget.remaining >= _call_cost
}

# One operation is charged once. When the store already holds this operation id
# (running, or finished unknown, success or refused), this call reserves nothing: it
# waits for the running attempt, continues an unknown one (looking it up first), or
# returns the recorded outcome. Only a new operation ("none", or a missing or
# malformed fact: deny by default) and one whose earlier attempt was retryable
# (nothing happened, nothing is held) reserve the cost, so only they are checked.
_is_charge_held if input.operation.status in {"running", "unknown", "success", "refused"}
