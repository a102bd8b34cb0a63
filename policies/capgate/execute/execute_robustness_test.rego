package capgate.execute_test

import data.capgate.execute
import data.capgate.fixtures_test

# Malformed or missing facts: the decision is still complete, a deny, with reasons.
test_deny_malformed_input_matrix if {
	incomplete := {note |
		some note, case in _malformed_cases
		decision := execute.decision with input as case.input
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
		not _is_complete_deny(decision)
	}
	incomplete == set()
	got := {note: fixtures_test.summary(decision) |
		some note, case in _malformed_cases
		decision := execute.decision with input as case.input
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	codes := {note: summary.codes | some note, summary in got}
	want := {note: case.codes | some note, case in _malformed_cases}
	_failed_rows("_malformed_cases (execute_robustness_test.rego)", codes, want) == {}
}

_is_complete_deny(decision) if {
	object.keys(decision) == {"allow", "reasons", "obligations", "catalogue_digest"}
	decision.catalogue_digest == fixtures_test.digest
	decision.allow == false
	count(decision.reasons) > 0
	decision.obligations == set()
	every reason in decision.reasons {
		object.keys(reason) == {"code", "message"}
		is_string(reason.message)
	}
}

_base := fixtures_test.execute_input

_malformed_cases := {
	"empty input": {"input": {}, "codes": {"unknown_tool"}},
	"input not an object": {"input": "send the quote", "codes": {"unknown_tool"}},
	"call not an object": {"input": object.union(_base, {"call": "quote.prepare_send"}), "codes": {"unknown_tool"}},
	# The approval is bound to the principal's tenant, so it cannot match either.
	"principal missing": {
		"input": json.remove(_base, ["principal"]),
		"codes": {"role_not_granted", "approval_mismatch"},
	},
	"principal not an object": {
		"input": object.union(_base, {"principal": "sales"}),
		"codes": {"role_not_granted", "approval_mismatch"},
	},
	"task not an object": {
		"input": object.union(_base, {"task": "customer_quote"}),
		"codes": {"not_needed_by_task", "subject_out_of_scope"},
	},
	"needs not a list": {
		"input": object.union(_base, {"task": {"needs": {"quote.prepare_send": true}}}),
		"codes": {"not_needed_by_task"},
	},
	"linked resources not a list": {
		"input": object.union(_base, {"task": {"linked_resources": {"type": "opportunity", "id": "opp-17"}}}),
		"codes": {"subject_out_of_scope"},
	},
	"linked resource without an id": {
		"input": object.union(_base, {"task": {"linked_resources": [{"type": "opportunity"}]}}),
		"codes": {"subject_out_of_scope"},
	},
	"connections not an object": {
		"input": object.union(_base, {"connections": ["sales_mailbox"]}),
		"codes": {"connection_missing"},
	},
	"environment missing": {"input": json.remove(_base, ["environment"]), "codes": {"environment_restricted"}},
	"budget class not a string": {"input": object.union(_base, {"budget_class": 3}), "codes": {"budget_class_exceeded"}},
	"approval not an object": {"input": object.union(_base, {"approval": "yes"}), "codes": {"approval_required"}},
	"approval empty": {
		"input": json.patch(_base, [{"op": "replace", "path": "/approval", "value": {}}]),
		"codes": {"approval_mismatch", "approval_expired", "approval_used"},
	},
	"approval used a list": {
		"input": object.union(_base, {"approval": {"used": [false]}}),
		"codes": {"approval_used"},
	},
	"stage a list": {"input": object.union(_base, {"stage": ["dispatch"]}), "codes": {"stage_invalid"}},
	"stage an object": {"input": object.union(_base, {"stage": {"name": "dispatch"}}), "codes": {"stage_invalid"}},
	"stage a number": {"input": object.union(_base, {"stage": 3}), "codes": {"stage_invalid"}},
	"stage empty": {"input": object.union(_base, {"stage": ""}), "codes": {"stage_invalid"}},
	"proposal not an object": {
		"input": object.union(_base, {"proposal": "approved"}),
		"codes": {"proposal_not_approved"},
	},
	"proposal a list": {
		"input": object.union(_base, {"proposal": [{"id": "pr-17", "status": "approved"}]}),
		"codes": {"proposal_not_approved"},
	},
	"proposal status a list": {
		"input": object.union(_base, {"proposal": {"status": ["approved"]}}),
		"codes": {"proposal_not_approved"},
	},
	"proposal id a number": {
		"input": object.union(_base, {"proposal": {"id": 17}}),
		"codes": {"proposal_not_approved"},
	},
	"budget not an object": {"input": object.union(_base, {"budget": "plenty"}), "codes": {"budget_exhausted"}},
	"budget a list": {"input": object.union(_base, {"budget": [10, 1]}), "codes": {"budget_exhausted"}},
	"budget null": {"input": object.union(_base, {"budget": null}), "codes": {"budget_exhausted"}},
	"budget remaining an object": {
		"input": object.union(_base, {"budget": {"remaining": {"units": 10}}}),
		"codes": {"budget_exhausted"},
	},
	"budget remaining true": {
		"input": object.union(_base, {"budget": {"remaining": true}}),
		"codes": {"budget_exhausted"},
	},
	"budget cost a string": {"input": object.union(_base, {"budget": {"cost": "1"}}), "codes": {"budget_exhausted"}},
	"budget cost null": {"input": object.union(_base, {"budget": {"cost": null}}), "codes": {"budget_exhausted"}},
	"expiry not RFC 3339": {
		"input": object.union(_base, {"approval": {"expires_at": "tomorrow noon"}}),
		"codes": {"approval_expired"},
	},
	"expiry a date without a time": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01"}}),
		"codes": {"approval_expired"},
	},
	# Far in the future, but not strict RFC 3339: each reads as expired, although
	# Go's time parser accepts the first four.
	"expiry with a one-digit hour": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01T0:00:00Z"}}),
		"codes": {"approval_expired"},
	},
	"expiry with a +24:00 offset": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01T00:00:00+24:00"}}),
		"codes": {"approval_expired"},
	},
	"expiry with a +02:60 offset": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01T00:00:00+02:60"}}),
		"codes": {"approval_expired"},
	},
	"expiry with a comma fraction": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01T00:00:00,5Z"}}),
		"codes": {"approval_expired"},
	},
	"expiry without seconds": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01T00:00Z"}}),
		"codes": {"approval_expired"},
	},
	"expiry with a space for the T": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01 00:00:00Z"}}),
		"codes": {"approval_expired"},
	},
	"expiry without a time zone": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01T00:00:00"}}),
		"codes": {"approval_expired"},
	},
	"expiry on 30 February": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-02-30T00:00:00Z"}}),
		"codes": {"approval_expired"},
	},
	"expiry in month 13": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-13-01T00:00:00Z"}}),
		"codes": {"approval_expired"},
	},
	"expiry followed by a newline": {
		"input": object.union(_base, {"approval": {"expires_at": "2099-01-01T00:00:00Z\n"}}),
		"codes": {"approval_expired"},
	},
	"expiry a number": {
		"input": object.union(_base, {"approval": {"expires_at": 4102444800}}),
		"codes": {"approval_expired"},
	},
	"expiry missing": {"input": json.remove(_base, ["approval/expires_at"]), "codes": {"approval_expired"}},
	"evidence not a list": {
		"input": object.union(_base, {"evidence": "current_quote_revision"}),
		"codes": {"evidence_missing"},
	},
	"subject not an object": {
		"input": object.union(_base, {"call": {"subject": "opp-17"}}),
		"codes": {"subject_out_of_scope"},
	},
}

# Without a usable catalogue every call is an unknown tool.
test_deny_catalogue_missing_or_malformed if {
	catalogues := [
		{},
		"catalogue",
		{"tools": []},
		{"tools": {"quote.prepare_send": "contract"}},
		{"tools": {"quote.prepare_send": null}},
	]
	every catalogue in catalogues {
		decision := execute.decision with input as fixtures_test.execute_input
			with data.capgate.catalogue as catalogue
			with time.now_ns as fixtures_test.now_ns
		decision.allow == false
		fixtures_test.codes(decision.reasons) == {"unknown_tool"}
		decision.obligations == set()
	}
}

# A contract with a field missing denies with the reason of the check that reads it.
test_deny_contract_field_missing if {
	got := {field: fixtures_test.summary(decision) |
		some field, _ in _contract_field_codes
		removed := json.remove(fixtures_test.catalogue, [sprintf("tools/quote.prepare_send/%s", [field])])
		catalogue := fixtures_test.reindex(removed)
		decision := execute.decision with input as fixtures_test.execute_input
			with data.capgate.catalogue as catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {field: {"allow": false, "codes": codes, "obligations": set()} | some field, codes in _contract_field_codes}
	got == want
}

_contract_field_codes := {
	"version": {"version_mismatch"},
	"roles": {"role_not_granted"},
	"connection_alias": {"connection_missing"},
	"environments": {"environment_restricted"},
	"cost_class": {"budget_class_exceeded"},
	"cost": {"budget_exhausted"},
	"approval": {"approval_mismatch"},
	"requires": {"evidence_missing"},
	"subject_type": {"subject_out_of_scope"},
}

# A contract whose approval setting is unknown needs review, and its dispatch an
# approval.
test_deny_unknown_approval_setting_requires_approval if {
	tool := object.union(fixtures_test.catalogue.tools["contact.read"], {"approval": "two_person"})
	catalogue := object.union(fixtures_test.catalogue, {"tools": {"contact.read": tool}})
	facts := json.remove(
		object.union(fixtures_test.execute_input, {"call": {"tool": "contact.read"}, "budget": {"cost": 0}}),
		["approval"],
	)
	decision := execute.decision with input as facts
		with data.capgate.catalogue as catalogue
		with time.now_ns as fixtures_test.now_ns
	fixtures_test.codes(decision.reasons) == {"approval_required"}
}

# A contract's cost must be a whole number of units, 0 or more; anything else can
# never be afforded, whatever the call reserves.
test_deny_contract_cost_malformed if {
	costs := ["1", 1.5, -1, null, true, [1], {"units": 1}]
	got := {cost: fixtures_test.codes(decision.reasons) |
		some cost in costs
		patch := {"op": "add", "path": "/tools/quote.prepare_send/cost", "value": cost}
		catalogue := json.patch(fixtures_test.catalogue, [patch])
		facts := object.union(fixtures_test.execute_input, {"budget": {"cost": cost}})
		decision := execute.decision with input as facts
			with data.capgate.catalogue as catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	got == {cost: {"budget_exhausted"} | some cost in costs}
}

# A free tool with a contract cost of 0 is affordable with nothing left, and a
# proposal never reads the cost.
test_allow_cost_zero_and_proposal_without_cost if {
	free := object.union(fixtures_test.catalogue.tools["quote.prepare_send"], {"cost": 0})
	catalogue := object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": free}})
	facts := object.union(fixtures_test.execute_input, {"budget": {"remaining": 0, "cost": 0}})
	decision := execute.decision with input as facts
		with data.capgate.catalogue as catalogue
		with time.now_ns as fixtures_test.now_ns
	decision.allow == true
	no_cost := json.remove(fixtures_test.catalogue, ["tools/quote.prepare_send/cost"])
	proposed := execute.decision with input as fixtures_test.propose_input
		with data.capgate.catalogue as no_cost
		with time.now_ns as fixtures_test.now_ns
	proposed.allow == true
}

# A null approval setting is not "none": it needs an approval, and a null kind does
# not match it.
test_deny_null_approval_setting_is_not_matched_by_null_kind if {
	tool := object.union(fixtures_test.catalogue.tools["quote.prepare_send"], {"approval": null})
	catalogue := object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": tool}})
	facts := object.union(fixtures_test.execute_input, {"approval": {"kind": null}})
	decision := execute.decision with input as facts
		with data.capgate.catalogue as catalogue
		with time.now_ns as fixtures_test.now_ns
	fixtures_test.summary(decision) == {"allow": false, "codes": {"approval_mismatch"}, "obligations": set()}
}

# Only idempotent_with_key contracts carry the key obligation.
test_allow_obligation_only_for_keyed_idempotency if every idempotency in ["idempotent", "not_idempotent"] {
	tool := object.union(fixtures_test.catalogue.tools["quote.prepare_send"], {"idempotency": idempotency})
	catalogue := object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": tool}})
	decision := execute.decision with input as fixtures_test.execute_input
		with data.capgate.catalogue as catalogue
		with time.now_ns as fixtures_test.now_ns
	decision.allow == true
	decision.obligations == set()
}

# The clock is OPA's: the same approval allows before its expiry and denies after.
test_deny_same_approval_after_expiry if {
	before := execute.decision with input as fixtures_test.execute_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	before.allow == true
	after := execute.decision with input as fixtures_test.execute_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns + (((2 * 60) * 60) * 1000000000)
	fixtures_test.codes(after.reasons) == {"approval_expired"}
}

# allow needs both layers: no failing check and an empty set of reasons. Each
# layer alone must deny, so a reason that failed to render never becomes an allow.
test_deny_failing_checks_deny_without_reasons if {
	allowed := {note |
		some note, case in _all_deny_cases
		execute.allow with input as _facts(case)
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
			with execute.reasons as set()
	}
	allowed == set()
	malformed := {note |
		some note, case in _malformed_cases
		execute.allow with input as case.input
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
			with execute.reasons as set()
	}
	malformed == set()
}

test_deny_any_reason_blocks_allow if {
	decision := execute.decision with input as fixtures_test.execute_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
		with execute.reasons as {{"code": "anything", "message": "a reason from elsewhere"}}
	decision.allow == false
	decision.obligations == set()
}
