package capgate.quorum_test

import data.capgate.quorum

_two_above := {"quorum": [{"approvals": 2, "value": "amount_cents", "above": 1000000}]}

test_a_contract_without_rules_needs_one if {
	quorum.required({}, {}) == 1
	quorum.required({"quorum": []}, {"amount_cents": 5}) == 1
}

test_two_approvers_above_the_threshold_only if {
	quorum.required(_two_above, {"amount_cents": 1000000}) == 1
	quorum.required(_two_above, {"amount_cents": 1000001}) == 2
	quorum.required(_two_above, {"amount_cents": null}) == 1
	quorum.required(_two_above, {}) == 1
}

test_a_value_that_is_not_a_number_never_lowers_the_quorum if {
	quorum.required(_two_above, {"amount_cents": "5"}) == 2
	quorum.required({"quorum": [{"approvals": 2, "value": "amount_cents", "above": "x"}]}, {"amount_cents": 5}) == 2
}

test_the_most_any_applying_rule_asks if {
	rules := {"quorum": [
		{"approvals": 2, "value": "amount_cents", "above": 100},
		{"approvals": 3, "value": "amount_cents", "above": 1000},
		{"approvals": 2, "value": null, "above": null},
	]}
	quorum.required(rules, {"amount_cents": 50}) == 2
	quorum.required(rules, {"amount_cents": 5000}) == 3
}

test_a_quorum_that_is_not_a_list_is_unreachable if {
	asked := quorum.required({"quorum": "two"}, {})
	asked > 64
}

test_met_counts_the_people_against_the_call_s_quorum if {
	quorum.met(_two_above, {"amount_cents": 5}, {"maria"})
	not quorum.met(_two_above, {"amount_cents": 2000000}, {"maria"})
	quorum.met(_two_above, {"amount_cents": 2000000}, {"maria", "omar"})
	quorum.met(_two_above, {"amount_cents": 2000000}, {"maria", "omar", "li"})
}

test_met_needs_a_set_of_people if {
	not quorum.met(_two_above, {"amount_cents": 5}, set())
	not quorum.met(_two_above, {"amount_cents": 5}, ["maria", "maria"])
	not quorum.met(_two_above, {"amount_cents": 5}, "maria")
	not quorum.met({"quorum": "two"}, {}, {"maria", "omar"})
}
