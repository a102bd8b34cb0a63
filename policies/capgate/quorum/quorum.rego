# METADATA
# title: Quorum
# description: |
#   How many distinct reviewers must approve a call of a tool: the largest approvals
#   of the contract's quorum rules that apply to the call's values, else one. Written
#   once here; the review policy says it in its decision (the gateway keeps a
#   proposal pending until that many have approved) and execute checks it again at
#   dispatch (approval_quorum), against the approvals the store holds then.
package capgate.quorum

import data.capgate.bounds

# METADATA
# title: Approvals required
# description: |
#   The number of distinct reviewers a call of the tool whose compiled contract is
#   `contract` needs, given the call's declared values: one, or the most any
#   applying rule asks. A rule applies always when it names no value, else when the
#   call's value is over its threshold; a value or threshold that is not a number
#   applies it too, and a quorum that is not a list asks for more approvals than any
#   deployment has, so a malformed fact never lowers the count.
required(contract, values) := max(array.concat([1], asked)) if {
	rules := object.get(contract, "quorum", [])
	is_array(rules)
	asked := [rule.approvals | some rule in rules; _applies(rule, values)]
} else := _unreachable

# More than the 64 approvers an approval fact may list.
_unreachable := 65

_applies(rule, _) if rule.value == null

_applies(rule, values) if {
	is_string(rule.value)
	actual := object.get(values, rule.value, null)
	actual != null
	not bounds.at_most(actual, rule.above)
}

# METADATA
# title: Quorum met
# description: |
#   True when the set `people` (distinct, in lower case: whoever's approval the
#   caller counts) holds at least as many as the call needs. The one comparison of
#   a count against the quorum: review decides with it whether an approval completes
#   the proposal, and execute whether a dispatch may go.
met(contract, values, people) if {
	is_set(people)
	count(people) >= required(contract, values)
}
