package capgate.execute_test

import data.capgate.execute
import data.capgate.fixtures_test

# The life-cycle checks: stage, approval at dispatch, proposal and budget. Each case
# changes one fact of a stage's baseline (_facts) and asserts the exact set of codes;
# test_deny_matrix runs them with the other checks' cases.
_life_cycle_deny_cases := {
	"stage missing": {
		"remove": ["stage"],
		"codes": {"stage_invalid"},
	},
	"stage unknown": {
		"patch": {"stage": "execute"},
		"codes": {"stage_invalid"},
	},
	"stage in capitals": {
		"patch": {"stage": "DISPATCH"},
		"codes": {"stage_invalid"},
	},
	"stage null": {
		"patch": {"stage": null},
		"codes": {"stage_invalid"},
	},
	"call of a tool that needs review": {
		"base": "call",
		"patch": {
			"call": {"tool": "quote.prepare_send", "operation_id": "send-017"},
			"budget": {"cost": 1},
			"evidence": ["current_quote_revision", "verified_recipient"],
		},
		"codes": {"review_required"},
	},
	"call of a write that needs approval": {
		"base": "call",
		"patch": _payment,
		"codes": {"review_required"},
	},
	"proposal of a tool that needs no review": {
		"base": "propose",
		"patch": {"call": {"tool": "contact.read"}},
		"codes": {"stage_invalid"},
	},
	"dispatch of a tool that needs no review": {
		"patch": {"call": {"tool": "contact.read"}, "budget": {"cost": 0}},
		"codes": {"stage_invalid"},
	},
	# The approval, at dispatch.
	"approval missing": {
		"remove": ["approval"],
		"codes": {"approval_required"},
	},
	"approval null": {
		"patch": {"approval": null},
		"codes": {"approval_required"},
	},
	"approval for other content": {
		"patch": {"approval": {"digest": fixtures_test.other_digest}},
		"codes": {"approval_mismatch"},
	},
	"call content changed after approval": {
		"patch": {"call": {"params_digest": fixtures_test.other_digest}},
		"codes": {"approval_mismatch"},
	},
	"approval of another kind": {
		"patch": {"approval": {"kind": "content_only"}},
		"codes": {"approval_mismatch"},
	},
	"approval kind null": {
		"patch": {"approval": {"kind": null}},
		"codes": {"approval_mismatch"},
	},
	"approval for another tool": {
		"patch": {"approval": {"tool": "contact.read"}},
		"codes": {"approval_mismatch"},
	},
	"approval for another operation": {
		"patch": {"approval": {"operation_id": "send-018"}},
		"codes": {"approval_mismatch"},
	},
	"same approval replayed under a new operation id": {
		"patch": {"call": {"operation_id": "send-099"}},
		"codes": {"approval_mismatch"},
	},
	"approval without an operation id": {
		"remove": ["approval/operation_id"],
		"codes": {"approval_mismatch"},
	},
	"approval given to another tenant": {
		"patch": {"approval": {"tenant": "globex"}},
		"codes": {"approval_mismatch"},
	},
	"approval used by another tenant": {
		"patch": {"principal": {"tenant": "globex"}},
		"codes": {"approval_mismatch"},
	},
	"approval and call digests both malformed": {
		"patch": {"approval": {"digest": "sha256:x"}, "call": {"params_digest": "sha256:x"}},
		"codes": {"approval_mismatch"},
	},
	"approval and call digests both missing": {
		"remove": ["approval/digest", "call/params_digest"],
		"codes": {"approval_mismatch"},
	},
	"approval expired": {
		"patch": {"approval": {"expires_at": "2026-11-30T10:59:59Z"}},
		"codes": {"approval_expired"},
	},
	"approval expiring exactly now": {
		"patch": {"approval": {"expires_at": "2026-11-30T11:00:00Z"}},
		"codes": {"approval_expired"},
	},
	"approval expired by its time zone": {
		"patch": {"approval": {"expires_at": "2026-11-30T12:30:00+02:00"}},
		"codes": {"approval_expired"},
	},
	"approval used already": {
		"patch": {"approval": {"used": true}},
		"codes": {"approval_used"},
	},
	"approval without used": {
		"remove": ["approval/used"],
		"codes": {"approval_used"},
	},
	"approval used null": {
		"patch": {"approval": {"used": null}},
		"codes": {"approval_used"},
	},
	"approval used the string false": {
		"patch": {"approval": {"used": "false"}},
		"codes": {"approval_used"},
	},
	"approval used 0": {
		"patch": {"approval": {"used": 0}},
		"codes": {"approval_used"},
	},
	# The proposal, at dispatch.
	"proposal pending": {
		"patch": {"proposal": {"status": "pending"}},
		"codes": {"proposal_not_approved"},
	},
	"proposal rejected": {
		"patch": {"proposal": {"status": "rejected"}},
		"codes": {"proposal_not_approved"},
	},
	"proposal blocked": {
		"patch": {"proposal": {"status": "blocked"}},
		"codes": {"proposal_not_approved"},
	},
	"proposal status in capitals": {
		"patch": {"proposal": {"status": "APPROVED"}},
		"codes": {"proposal_not_approved"},
	},
	"proposal status missing": {
		"remove": ["proposal/status"],
		"codes": {"proposal_not_approved"},
	},
	"proposal id missing": {
		"remove": ["proposal/id"],
		"codes": {"proposal_not_approved"},
	},
	"proposal id empty": {
		"patch": {"proposal": {"id": ""}},
		"codes": {"proposal_not_approved"},
	},
	"proposal missing": {
		"remove": ["proposal"],
		"codes": {"proposal_not_approved"},
	},
	# The budget, at dispatch and at call.
	"budget exhausted": {
		"patch": {"budget": {"remaining": 0}},
		"codes": {"budget_exhausted"},
	},
	"budget overspent": {
		"patch": {"budget": {"remaining": -4}},
		"codes": {"budget_exhausted"},
	},
	"budget remaining missing": {
		"remove": ["budget/remaining"],
		"codes": {"budget_exhausted"},
	},
	"budget remaining a string": {
		"patch": {"budget": {"remaining": "10"}},
		"codes": {"budget_exhausted"},
	},
	"budget remaining not whole": {
		"patch": {"budget": {"remaining": 1.5}},
		"codes": {"budget_exhausted"},
	},
	"budget reserved less than the cost": {
		"patch": {"budget": {"cost": 0}},
		"codes": {"budget_exhausted"},
	},
	"budget reserved more than the cost": {
		"patch": {"budget": {"cost": 2}},
		"codes": {"budget_exhausted"},
	},
	"budget cost missing": {
		"remove": ["budget/cost"],
		"codes": {"budget_exhausted"},
	},
	"budget missing": {
		"remove": ["budget"],
		"codes": {"budget_exhausted"},
	},
	"call: budget below the tool's cost": {
		"base": "call",
		"patch": object.union(_oracle_call, {"budget": {"remaining": 2}}),
		"codes": {"budget_exhausted"},
	},
	"call: budget overspent, even for a free tool": {
		"base": "call",
		"patch": {"budget": {"remaining": -1}},
		"codes": {"budget_exhausted"},
	},
	"call: budget reserved for another tool": {
		"base": "call",
		"patch": {"budget": {"cost": 3}},
		"codes": {"budget_exhausted"},
	},
	"call: budget missing": {
		"base": "call",
		"remove": ["budget"],
		"codes": {"budget_exhausted"},
	},
}

# Which check applies at which stage: each row changes one fact of every stage's
# baseline (a contact read at call, the quote at propose and dispatch) and gives the
# exact codes at each stage.
test_deny_stage_check_matrix if {
	got := {note: codes |
		some note, row in _stage_rows
		codes := {stage: fixtures_test.codes(decision.reasons) |
			some stage, base in _bases
			facts := json.remove(object.union(base, object.get(row, "patch", {})), object.get(row, "remove", []))
			decision := execute.decision with input as facts
				with data.capgate.catalogue as fixtures_test.catalogue
				with time.now_ns as fixtures_test.now_ns
		}
	}
	want := {note: object.union(_no_codes, row.codes) | some note, row in _stage_rows}
	_failed_rows("_stage_rows (execute_life_cycle_test.rego)", got, want) == {}
}

_no_codes := {"call": set(), "propose": set(), "dispatch": set()}

# A dispatched proposal whose one operation ended unknown or retryable is continued
# under the same approval (the gateway looks it up before sending again), so its
# dispatch is asked with status "dispatched" and allowed like an approved one.
test_allow_dispatch_continues_a_dispatched_proposal if {
	facts := object.union(_bases.dispatch, {"proposal": {"status": "dispatched"}})
	decision := execute.decision with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	decision.allow == true
	fixtures_test.codes(decision.reasons) == set()
}

_stage_rows := {
	"nothing changed": {"codes": {}},
	"approval missing": {
		"remove": ["approval"],
		"codes": {"dispatch": {"approval_required"}},
	},
	"approval for other content": {
		"patch": {"approval": {"digest": fixtures_test.other_digest}},
		"codes": {"dispatch": {"approval_mismatch"}},
	},
	"approval expired": {
		"patch": {"approval": {"expires_at": "2026-11-30T10:00:00Z"}},
		"codes": {"dispatch": {"approval_expired"}},
	},
	"approval used": {
		"patch": {"approval": {"used": true}},
		"codes": {"dispatch": {"approval_used"}},
	},
	"proposal pending": {
		"patch": {"proposal": {"status": "pending"}},
		"codes": {"dispatch": {"proposal_not_approved"}},
	},
	"proposal missing": {
		"remove": ["proposal"],
		"codes": {"dispatch": {"proposal_not_approved"}},
	},
	"budget overspent": {
		"patch": {"budget": {"remaining": -1}},
		"codes": {"call": {"budget_exhausted"}, "dispatch": {"budget_exhausted"}},
	},
	"budget missing": {
		"remove": ["budget"],
		"codes": {"call": {"budget_exhausted"}, "dispatch": {"budget_exhausted"}},
	},
	"no evidence (a contact read requires none)": {
		"patch": {"evidence": []},
		"codes": {"propose": {"evidence_missing"}, "dispatch": {"evidence_missing"}},
	},
	"subject not linked": {
		"patch": {"call": {"subject": {"id": "opp-99"}}},
		"codes": {
			"call": {"subject_out_of_scope"},
			"propose": {"subject_out_of_scope"},
			"dispatch": {"subject_out_of_scope"},
		},
	},
	"version unknown": {
		"patch": {"call": {"version": 99}},
		"codes": {
			"call": {"version_mismatch"},
			"propose": {"version_mismatch"},
			"dispatch": {"version_mismatch"},
		},
	},
	"connections revoked": {
		"patch": {"connections": {"crm": "revoked", "sales_mailbox": "revoked"}},
		"codes": {
			"call": {"connection_revoked"},
			"propose": {"connection_revoked"},
			"dispatch": {"connection_revoked"},
		},
	},
	"role no longer granted": {
		"patch": {"principal": {"role": "finance"}},
		"codes": {
			"call": {"role_not_granted"},
			"propose": {"role_not_granted"},
			"dispatch": {"role_not_granted"},
		},
	},
	# A contact read takes no idempotency key; the approval names the operation.
	"operation id missing": {
		"remove": ["call/operation_id"],
		"codes": {
			"propose": {"operation_id_missing"},
			"dispatch": {"operation_id_missing", "approval_mismatch"},
		},
	},
	"stage missing": {
		"remove": ["stage"],
		"codes": {
			"call": {"stage_invalid"},
			"propose": {"stage_invalid"},
			"dispatch": {"stage_invalid"},
		},
	},
}

# Whether a tool needs review is read from its contract as ToolContract.needs_review
# does (mode propose_write, or an approval other than "none"), in the safe direction
# for a contract Python would refuse: a missing or unknown mode needs review too.
test_allow_needs_review_follows_the_contract if {
	got := {note: [call_codes, propose_codes] |
		some note, case in _review_settings
		contract := json.remove(
			object.union(fixtures_test.catalogue.tools["contact.read"], object.get(case, "patch", {})),
			object.get(case, "remove", []),
		)
		catalogue := json.patch(fixtures_test.catalogue, [{"op": "add", "path": "/tools/contact.read", "value": contract}])
		call := execute.decision with input as fixtures_test.call_input
			with data.capgate.catalogue as catalogue
			with time.now_ns as fixtures_test.now_ns
		propose := execute.decision with input as object.union(fixtures_test.call_input, {"stage": "propose"})
			with data.capgate.catalogue as catalogue
			with time.now_ns as fixtures_test.now_ns
		call_codes := fixtures_test.codes(call.reasons)
		propose_codes := fixtures_test.codes(propose.reasons)
	}
	want := {note: _stage_codes(case.needs_review) | some note, case in _review_settings}
	_failed_rows("_review_settings (execute_life_cycle_test.rego)", got, want) == {}
}

_stage_codes(true) := [{"review_required"}, set()]

_stage_codes(false) := [set(), {"stage_invalid"}]

_review_settings := {
	"read, no approval": {"patch": {"mode": "read", "approval": "none"}, "needs_review": false},
	"write, no approval": {"patch": {"mode": "write", "approval": "none"}, "needs_review": false},
	"propose_write, no approval": {"patch": {"mode": "propose_write", "approval": "none"}, "needs_review": true},
	"read with an approval": {"patch": {"approval": "exact_content_and_recipient"}, "needs_review": true},
	"write with an approval": {
		"patch": {"mode": "write", "approval": "exact_content_and_recipient"},
		"needs_review": true,
	},
	"approval unknown": {"patch": {"approval": "two_person"}, "needs_review": true},
	"approval null": {"patch": {"approval": null}, "needs_review": true},
	"approval missing": {"remove": ["approval"], "needs_review": true},
	"mode unknown": {"patch": {"mode": "delete"}, "needs_review": true},
	"mode null": {"patch": {"mode": null}, "needs_review": true},
	"mode missing": {"remove": ["mode"], "needs_review": true},
}

# An idempotency key is passed only when something runs: at call and at dispatch,
# never for a proposal.
test_allow_obligation_only_when_something_runs if {
	keyed := object.union(fixtures_test.catalogue.tools["contact.read"], {"idempotency": "idempotent_with_key"})
	catalogue := object.union(fixtures_test.catalogue, {"tools": {"contact.read": keyed}})
	inputs := {
		"call": fixtures_test.call_input,
		"propose": fixtures_test.propose_input,
		"dispatch": fixtures_test.execute_input,
	}
	got := {stage: [decision.allow, decision.obligations] |
		some stage, facts in inputs
		decision := execute.decision with input as facts
			with data.capgate.catalogue as catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	got == {
		"call": [true, {{"code": "pass_idempotency_key", "params": {"key": "read-017"}}}],
		"propose": [true, set()],
		"dispatch": [true, {{"code": "pass_idempotency_key", "params": {"key": "send-017"}}}],
	}
}

# One budget_exhausted reason, whose message tells what is wrong with the budget.
test_deny_budget_message_names_the_fault if {
	got := {note: decision.reasons |
		some note, case in _budget_messages
		catalogue := json.patch(fixtures_test.catalogue, object.get(case, "catalogue", []))
		decision := execute.decision with input as _facts(case)
			with data.capgate.catalogue as catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {note: {{"code": "budget_exhausted", "message": case.message}} | some note, case in _budget_messages}
	_failed_rows("_budget_messages (execute_life_cycle_test.rego)", got, want) == {}
}

_budget_messages := {
	"too little left": {
		"patch": {"budget": {"remaining": 0}},
		"message": `the budget has 0 units left and tool "quote.prepare_send" costs 1`,
	},
	"another amount reserved": {
		"patch": {"budget": {"cost": 5}},
		"message": `the call reserved 5 units of budget and tool "quote.prepare_send" costs 1`,
	},
	"nothing reserved": {
		"remove": ["budget"],
		"message": `the call reserved null units of budget and tool "quote.prepare_send" costs 1`,
	},
	"remaining malformed": {
		"patch": {"budget": {"remaining": "ten"}},
		"message": `the budget's remaining units "ten" are neither null nor a whole number`,
	},
	"contract without a cost": {
		"catalogue": [{"op": "remove", "path": "/tools/quote.prepare_send/cost"}],
		"message": `the contract of tool "quote.prepare_send" has no cost in whole units, 0 or more`,
	},
}

# The budget is checked only when the call would reserve the cost: a new operation,
# or one whose earlier attempt was retryable. An operation the store already holds
# (running, unknown, success, refused) was charged (or is held) once already.
test_allow_budget_not_checked_for_an_operation_already_charged if {
	spent := {"budget": {"remaining": -1}}
	every status in {"running", "unknown", "success", "refused"} {
		every stage in {"call", "dispatch"} {
			facts := object.union(object.union(_bases[stage], spent), {"operation": {"status": status}})
			decision := execute.decision with input as facts
				with data.capgate.catalogue as fixtures_test.catalogue
				with time.now_ns as fixtures_test.now_ns
			decision.allow == true
		}
	}
}

test_deny_budget_checked_for_a_new_or_retryable_operation if {
	spent := {"budget": {"remaining": -1}}
	every status in {"none", "retryable", "later", null} {
		every stage in {"call", "dispatch"} {
			facts := object.union(object.union(_bases[stage], spent), {"operation": {"status": status}})
			decision := execute.decision with input as facts
				with data.capgate.catalogue as fixtures_test.catalogue
				with time.now_ns as fixtures_test.now_ns
			"budget_exhausted" in fixtures_test.codes(decision.reasons)
		}
	}
}
