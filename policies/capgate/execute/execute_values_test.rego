# The call's values (input.call.values): the limits a contract sets on them by role
# (value_over_limit) and a cost counted from one of them (cost_value). The baseline
# is fixtures_test's approved quote dispatch, its contract given an amount, a limit
# of 500000 for sales and one of 100 for finance (a role the caller is not in).
package capgate.execute_test

import data.capgate.execute
import data.capgate.explain
import data.capgate.fixtures_test

_limited := object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": {
	"values": {"amount_cents": {"type": "integer"}, "currency": {"type": "string"}},
	"limits": [
		{"value": "amount_cents", "max": 500000, "roles": {"sales": true}},
		{"value": "amount_cents", "max": 100, "roles": {"finance": true}},
	],
	"cost_value": null,
}}})

# The same contract counting its amount as the call's cost.
_counted := object.union(_limited, {"tools": {"quote.prepare_send": {"cost_value": "amount_cents"}}})

_with_values(values) := object.union(fixtures_test.execute_input, {"call": {"values": values}})

_value_codes(reasons) := {reason.code | some reason in reasons}

# Each row: the call's values, the catalogue (limited unless told), the budget it
# sends (the baseline's unless told) and the codes the decision gives ({} an allow).
_value_rows := {
	"within the sales limit": {"values": {"amount_cents": 400000, "currency": "EUR"}, "codes": set()},
	"exactly at the limit": {"values": {"amount_cents": 500000, "currency": "EUR"}, "codes": set()},
	"over the sales limit": {
		"values": {"amount_cents": 500001, "currency": "EUR"},
		"codes": {"value_over_limit"},
	},
	"an absent amount is over no limit": {"values": {"amount_cents": null, "currency": "EUR"}, "codes": set()},
	"a string amount is never within a limit": {
		"values": {"amount_cents": "400000", "currency": "EUR"},
		"codes": {"value_over_limit"},
	},
	"no values at all": {"values": {}, "codes": set()},
	"counted: the budget reserves the amount": {
		"values": {"amount_cents": 7, "currency": "EUR"},
		"catalogue": _counted, "budget": {"remaining": 10, "cost": 7},
		"codes": set(),
	},
	"counted: the budget reserved a fixed cost instead": {
		"values": {"amount_cents": 7, "currency": "EUR"},
		"catalogue": _counted, "budget": {"remaining": 10, "cost": 1},
		"codes": {"budget_exhausted"},
	},
	"counted: too little budget left for the amount": {
		"values": {"amount_cents": 11, "currency": "EUR"},
		"catalogue": _counted, "budget": {"remaining": 10, "cost": 11},
		"codes": {"budget_exhausted"},
	},
	"counted: an absent amount costs nothing": {
		"values": {"amount_cents": null, "currency": "EUR"},
		"catalogue": _counted, "budget": {"remaining": 0, "cost": 0},
		"codes": set(),
	},
	"counted: an amount that is no number is never afforded": {
		"values": {"amount_cents": "7", "currency": "EUR"},
		"catalogue": _counted, "budget": {"remaining": 10, "cost": "7"},
		"codes": {"budget_exhausted", "value_over_limit"},
	},
}

_value_row_input(row) := object.union(_with_values(row.values), {"budget": row.budget}) if row.budget

_value_row_input(row) := _with_values(row.values) if not row.budget

test_value_rows if {
	got := {note: _value_codes(decision.reasons) |
		some note, row in _value_rows
		decision := execute.decision with input as _value_row_input(row)
			with data.capgate.catalogue as object.get(row, "catalogue", _limited)
			with time.now_ns as fixtures_test.now_ns
	}
	wrong := {note: codes | some note, codes in got; codes != _value_rows[note].codes}
	wrong == {}
	count(got) == count(_value_rows)
}

test_over_limit_says_which_value_what_limit_and_which_role if {
	decision := execute.decision with input as _with_values({"amount_cents": 600000, "currency": "EUR"})
		with data.capgate.catalogue as _limited
		with time.now_ns as fixtures_test.now_ns
	decision.allow == false
	decision.reasons == {{
		"code": "value_over_limit",
		"message": concat("", [
			`tool "quote.prepare_send" allows "amount_cents" up to 500000 for role "sales", `,
			`and the call's "amount_cents" is 600000`,
		]),
	}}
}

test_each_limit_exceeded_is_one_reason if {
	two := object.union(_limited, {"tools": {"quote.prepare_send": {"limits": [
		{"value": "amount_cents", "max": 500000, "roles": {"sales": true}},
		{"value": "amount_cents", "max": 1000, "roles": {"sales": true}},
	]}}})
	decision := execute.decision with input as _with_values({"amount_cents": 600000, "currency": "EUR"})
		with data.capgate.catalogue as two
		with time.now_ns as fixtures_test.now_ns
	count(decision.reasons) == 2
	_value_codes(decision.reasons) == {"value_over_limit"}
}

test_limits_that_are_not_a_list_deny if {
	broken := object.union(_limited, {"tools": {"quote.prepare_send": {"limits": "none"}}})
	decision := execute.decision with input as _with_values({"amount_cents": 1, "currency": "EUR"})
		with data.capgate.catalogue as broken
		with time.now_ns as fixtures_test.now_ns
	decision.allow == false
	_value_codes(decision.reasons) == {"value_over_limit"}
}

test_explain_reports_the_values_over_their_limits if {
	explained := explain.execute with input as _with_values({"amount_cents": 600000, "currency": "EUR"})
		with data.capgate.catalogue as _limited
		with time.now_ns as fixtures_test.now_ns
	some check in explained.checks
	check.check == "limits"
	check.pass == false
	check.code == "value_over_limit"
	check.facts == {"over": [{"value": "amount_cents", "actual": 600000, "max": 500000, "role": "sales"}]}
}

test_explain_reports_the_counted_cost if {
	explained := explain.execute with input as object.union(
		_with_values({"amount_cents": 7, "currency": "EUR"}),
		{"budget": {"remaining": 10, "cost": 7}},
	)
		with data.capgate.catalogue as _counted
		with time.now_ns as fixtures_test.now_ns
	some check in explained.checks
	check.check == "budget_units"
	check.pass == true
	check.facts.cost == 7
}

# A quorum of two approvers above 10,000.00 on the quote, checked again at dispatch.
_quorum_of_two := object.union(_limited, {"tools": {"quote.prepare_send": {
	"limits": [],
	"quorum": [{"approvals": 2, "value": "amount_cents", "above": 1000000}],
}}})

_dispatch_with(amount, approvers) := object.union(
	_with_values({"amount_cents": amount, "currency": "EUR"}),
	{"approval": {"approvers": approvers}},
)

test_dispatch_counts_distinct_unexpired_approvers_against_the_quorum if {
	fresh := "2026-11-30T12:00:00Z"
	gone := "2026-11-30T10:00:00Z"
	rows := {
		"under the threshold, one approver": {"amount": 5, "approvers": [], "codes": set()},
		"over it, one approver": {"amount": 2000000, "approvers": [], "codes": {"approval_quorum_not_met"}},
		"over it, the same reviewer twice": {
			"amount": 2000000,
			"approvers": [{"by": "founder", "expires_at": fresh}],
			"codes": {"approval_quorum_not_met"},
		},
		"over it, one person under two spellings": {
			"amount": 2000000,
			"approvers": [{"by": "Maria", "expires_at": fresh}, {"by": "maria", "expires_at": fresh}],
			"codes": {"approval_quorum_not_met"},
		},
		"over it, a second reviewer": {
			"amount": 2000000,
			"approvers": [{"by": "founder", "expires_at": fresh}, {"by": "maria", "expires_at": fresh}],
			"codes": set(),
		},
		"over it, the second approval expired": {
			"amount": 2000000,
			"approvers": [{"by": "maria", "expires_at": gone}],
			"codes": {"approval_quorum_not_met"},
		},
		"over it, an approver without a name": {
			"amount": 2000000,
			"approvers": [{"by": 7, "expires_at": fresh}],
			"codes": {"approval_quorum_not_met"},
		},
	}
	got := {note: _value_codes(decision.reasons) |
		some note, row in rows
		decision := execute.decision with input as _dispatch_with(row.amount, row.approvers)
			with data.capgate.catalogue as _quorum_of_two
			with time.now_ns as fixtures_test.now_ns
	}
	wrong := {note: codes | some note, codes in got; codes != rows[note].codes}
	wrong == {}
	count(got) == count(rows)
}

test_a_quorum_not_met_says_how_many_and_how_many_approved if {
	decision := execute.decision with input as _dispatch_with(2000000, [])
		with data.capgate.catalogue as _quorum_of_two
		with time.now_ns as fixtures_test.now_ns
	decision.reasons == {{
		"code": "approval_quorum_not_met",
		"message": `tool "quote.prepare_send" needs 2 distinct approvals of this call and it has 1`,
	}}
}
