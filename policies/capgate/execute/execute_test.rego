package capgate.execute_test

import data.capgate.execute
import data.capgate.fixtures_test

# The baseline: an approved quote with all its evidence, sent on a linked opportunity.
test_allow_approved_quote_with_idempotency_key if {
	decision := execute.decision with input as fixtures_test.execute_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	decision == {
		"allow": true,
		"reasons": set(),
		"obligations": {{"code": "pass_idempotency_key", "params": {"key": "send-017"}}},
		"catalogue_digest": fixtures_test.digest,
	}
}

# The baseline of each stage (fixtures_test): the quote dispatched once approved, the
# same quote proposed, and a contact read, called directly.
_bases := {
	"dispatch": fixtures_test.execute_input,
	"propose": fixtures_test.propose_input,
	"call": fixtures_test.call_input,
}

# A case's input: its stage's baseline (dispatch unless it names another) with its
# patch merged in and its removals taken out.
_facts(case) := json.remove(
	object.union(_bases[object.get(case, "base", "dispatch")], object.get(case, "patch", {})),
	object.get(case, "remove", []),
)

# Allowed calls, each changing a baseline; a case lists the obligation codes it expects.
test_allow_matrix if {
	got := {note: fixtures_test.summary(decision) |
		some note, case in _allow_cases
		decision := execute.decision with input as _facts(case)
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {note: {"allow": true, "codes": set(), "obligations": case.obligations} | some note, case in _allow_cases}
	_failed_rows("_allow_cases (execute_test.rego)", got, want) == {}
}

_oracle_call := {"call": {"tool": "oracle.price", "version": 2, "subject": null}, "budget": {"cost": 3}}

# Facts under which finance may pay invoice inv-9; the approval is for that payment.
_payment := {
	"principal": {"role": "finance"},
	"task": {"type": "invoice_payment", "linked_resources": [{"type": "invoice", "id": "inv-9"}]},
	"connections": {"bank": "active"},
	"budget_class": "unlimited",
	"call": {"tool": "payment.execute", "version": 3, "subject": {"type": "invoice", "id": "inv-9"}},
	"approval": {"tool": "payment.execute"},
	"budget": {"cost": 20, "remaining": 500},
	"evidence": ["invoice_verified"],
}

_allow_cases := {
	# stage call: a tool that needs no review.
	"call: read on a linked subject": {
		"base": "call",
		"obligations": set(),
	},
	"call: pure function, no approval, evidence, subject or connection needed": {
		"base": "call",
		"patch": _oracle_call,
		"remove": ["connections"],
		"obligations": set(),
	},
	"call: an approval is not checked": {
		"base": "call",
		"patch": object.union(_oracle_call, {"approval": {"digest": "sha256:bad", "expires_at": "yesterday", "used": true}}),
		"obligations": set(),
	},
	"call: approval null": {
		"base": "call",
		"patch": object.union(_oracle_call, {"approval": null}),
		"obligations": set(),
	},
	"call: a proposal is not checked": {
		"base": "call",
		"patch": {"proposal": {"id": "pr-1", "status": "rejected"}},
		"obligations": set(),
	},
	"call: budget without a limit": {
		"base": "call",
		"patch": object.union(_oracle_call, {"budget": {"remaining": null}}),
		"obligations": set(),
	},
	"call: budget holding exactly the cost": {
		"base": "call",
		"patch": object.union(_oracle_call, {"budget": {"remaining": 3}}),
		"obligations": set(),
	},
	"call: a free tool with nothing left": {
		"base": "call",
		"patch": {"budget": {"remaining": 0}},
		"obligations": set(),
	},
	# stage propose: nothing runs, so neither approval nor budget is checked.
	"propose: the quote": {
		"base": "propose",
		"obligations": set(),
	},
	"propose: a used, expired approval is not checked": {
		"base": "propose",
		"patch": {"approval": object.union(fixtures_test.execute_input.approval, {
			"used": true,
			"expires_at": "2026-11-30T10:00:00Z",
		})},
		"obligations": set(),
	},
	"propose: an exhausted budget is not checked": {
		"base": "propose",
		"patch": {"budget": {"remaining": 0, "cost": 1}},
		"obligations": set(),
	},
	"propose: a malformed budget is not checked": {
		"base": "propose",
		"patch": {"budget": "plenty"},
		"obligations": set(),
	},
	"propose: a payment, a write that needs approval": {
		"base": "propose",
		"patch": _payment,
		"obligations": set(),
	},
	# stage dispatch: an approved proposal, its approval fresh and unused.
	"dispatch: a payment, a write that needs approval": {
		"patch": _payment,
		"obligations": set(),
	},
	"dispatch: budget without a limit": {
		"patch": {"budget": {"remaining": null}},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: budget holding exactly the cost": {
		"patch": {"budget": {"remaining": 1}},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: subject among several linked resources": {
		"patch": {
			"call": {"subject": {"id": "opp-18"}},
			"task": {"linked_resources": [
				{"type": "invoice", "id": "opp-18"},
				{"type": "opportunity", "id": "opp-17"},
				{"type": "opportunity", "id": "opp-18"},
			]},
		},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: expiry with a time zone offset, later than now": {
		"patch": {"approval": {"expires_at": "2026-11-30T13:30:00+02:00"}},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: expiry one second after now": {
		"patch": {"approval": {"expires_at": "2026-11-30T11:00:01Z"}},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: expiry with lower-case t and z, as RFC 3339 allows": {
		"patch": {"approval": {"expires_at": "2026-11-30t11:00:01z"}},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: expiry with a fraction of a second": {
		"patch": {"approval": {"expires_at": "2026-11-30T11:00:00.25Z"}},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: extra evidence is harmless": {
		"patch": {"evidence": ["current_quote_revision", "verified_recipient", "other"]},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: needs names the tool": {
		"patch": {"task": {"needs": ["quote.prepare_send"]}},
		"obligations": {"pass_idempotency_key"},
	},
	"dispatch: staging": {
		"patch": {"environment": "staging"},
		"obligations": {"pass_idempotency_key"},
	},
}

# One fact changed per case; each case asserts the exact set of codes. The cases of
# the life-cycle checks are in execute_life_cycle_test.rego.
_all_deny_cases := object.union(_deny_cases, _life_cycle_deny_cases)

test_deny_matrix if {
	got := {note: fixtures_test.summary(decision) |
		some note, case in _all_deny_cases
		decision := execute.decision with input as _facts(case)
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {note: {"allow": false, "codes": case.codes, "obligations": set()} | some note, case in _all_deny_cases}
	_failed_rows("_all_deny_cases (execute_test.rego)", got, want) == {}
}

_deny_cases := {
	"tool not in the catalogue": {
		"patch": {"call": {"tool": "quote.delete"}},
		"codes": {"unknown_tool"},
	},
	"tool name not a string": {
		"patch": {"call": {"tool": 7}},
		"codes": {"unknown_tool"},
	},
	"older version": {
		"patch": {"call": {"version": 2}},
		"codes": {"version_mismatch"},
	},
	"version as a string": {
		"patch": {"call": {"version": "1"}},
		"codes": {"version_mismatch"},
	},
	"version missing": {
		"remove": ["call/version"],
		"codes": {"version_mismatch"},
	},
	"role without the grant": {
		"patch": {"principal": {"role": "support"}},
		"codes": {"role_not_granted"},
	},
	"task type without the tool": {
		"patch": {"task": {"type": "invoice_payment"}},
		"codes": {"not_needed_by_task"},
	},
	"needs without the tool": {
		"patch": {"task": {"needs": ["contact.read"]}},
		"codes": {"not_needed_by_task"},
	},
	"connection absent": {
		"remove": ["connections/sales_mailbox"],
		"codes": {"connection_missing"},
	},
	"connection disabled": {
		"patch": {"connections": {"sales_mailbox": "disabled"}},
		"codes": {"tool_not_enabled_for_tenant"},
	},
	"connection revoked since the proposal": {
		"patch": {"connections": {"sales_mailbox": "revoked"}},
		"codes": {"connection_revoked"},
	},
	"environment not allowed": {
		"patch": {"environment": "development"},
		"codes": {"environment_restricted"},
	},
	"budget below the cost class": {
		"patch": {"budget_class": "frugal"},
		"codes": {"budget_class_exceeded"},
	},
	"upstream definition changed since the proposal": {
		"patch": {"quarantined": ["quote.prepare_send"]},
		"codes": {"tool_quarantined"},
	},
	"call: upstream definition not accepted": {
		"base": "call",
		"patch": {"quarantined": ["contact.read"]},
		"codes": {"tool_quarantined"},
	},
	# Evidence, subject and idempotency key, at every stage.
	"no evidence": {
		"patch": {"evidence": []},
		"codes": {"evidence_missing"},
	},
	"evidence missing a name": {
		"patch": {"evidence": ["verified_recipient"]},
		"codes": {"evidence_missing"},
	},
	"subject not linked to the task": {
		"patch": {"call": {"subject": {"id": "opp-99"}}},
		"codes": {"subject_out_of_scope"},
	},
	"subject of another type": {
		"patch": {
			"call": {"subject": {"type": "invoice"}},
			"task": {"linked_resources": [{"type": "invoice", "id": "opp-17"}]},
		},
		"codes": {"subject_out_of_scope"},
	},
	"no subject": {
		"patch": {"call": {"subject": null}},
		"codes": {"subject_out_of_scope"},
	},
	"no linked resources": {
		"patch": {"task": {"linked_resources": []}},
		"codes": {"subject_out_of_scope"},
	},
	"operation id missing": {
		"base": "propose",
		"remove": ["call/operation_id"],
		"codes": {"operation_id_missing"},
	},
	"operation id empty": {
		"patch": {"call": {"operation_id": ""}, "approval": {"operation_id": ""}},
		"codes": {"operation_id_missing"},
	},
	"a payment by a sales agent": {
		"patch": {
			"call": {"tool": "payment.execute", "version": 3},
			"approval": {"tool": "payment.execute"},
			"budget": {"cost": 20, "remaining": 500},
		},
		"codes": {
			"role_not_granted",
			"not_needed_by_task",
			"connection_missing",
			"budget_class_exceeded",
			"evidence_missing",
			"subject_out_of_scope",
		},
	},
	"everything the gateway supplies is stale": {
		"patch": {
			"connections": {"sales_mailbox": "revoked"},
			"approval": {"expires_at": "2026-11-30T10:00:00Z", "used": true},
			"proposal": {"status": "blocked"},
			"budget": {"remaining": 0},
			"evidence": [],
		},
		"codes": {
			"connection_revoked",
			"approval_expired",
			"approval_used",
			"proposal_not_approved",
			"budget_exhausted",
			"evidence_missing",
		},
	},
}

# Every reason code of docs/reason-codes.md for execute is asserted exactly by at
# least one case of the deny matrix.
test_deny_matrix_covers_every_code if {
	covered := union({case.codes | some case in _all_deny_cases})
	covered == {
		"unknown_tool",
		"version_mismatch",
		"role_not_granted",
		"not_needed_by_task",
		"connection_missing",
		"tool_not_enabled_for_tenant",
		"connection_revoked",
		"environment_restricted",
		"budget_class_exceeded",
		"tool_quarantined",
		"stage_invalid",
		"review_required",
		"approval_required",
		"approval_mismatch",
		"approval_expired",
		"approval_used",
		"proposal_not_approved",
		"budget_exhausted",
		"evidence_missing",
		"subject_out_of_scope",
		"operation_id_missing",
	}
}

# evidence_missing comes once per missing name, and each message names it.
test_deny_evidence_missing_names_each_item if {
	facts := object.union(fixtures_test.execute_input, {"evidence": []})
	decision := execute.decision with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	decision.reasons == {
		{
			"code": "evidence_missing",
			"message": `tool "quote.prepare_send" requires evidence "current_quote_revision", which the call does not bring`,
		},
		{
			"code": "evidence_missing",
			"message": `tool "quote.prepare_send" requires evidence "verified_recipient", which the call does not bring`,
		},
	}
}

# Several mismatched fields still make one approval_mismatch, naming them all.
test_deny_approval_mismatch_names_the_fields if {
	approval := {"kind": "other", "digest": fixtures_test.other_digest}
	facts := object.union(fixtures_test.execute_input, {"approval": approval})
	decision := execute.decision with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	decision.reasons == {{
		"code": "approval_mismatch",
		"message": `the approval does not match the contract and the call in: ["digest","kind"]`,
	}}
}

test_deny_unknown_tool_stands_alone if {
	facts := object.union(fixtures_test.execute_input, {"call": {"tool": "ghost"}, "evidence": [], "environment": "x"})
	decision := execute.decision with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	decision == {
		"allow": false,
		"reasons": {{"code": "unknown_tool", "message": `tool "ghost" is not in the catalogue`}},
		"obligations": set(),
		"catalogue_digest": fixtures_test.digest,
	}
}

# Execute re-derives visibility exactly as compose does: for every tool and set of
# facts, the compose reasons of a call are the tool's reasons in compose's explanation
# (capgate.explain, fixtures_test.compose_excluded).
test_deny_execute_agrees_with_compose if {
	inputs := [
		fixtures_test.execute_input,
		object.union(fixtures_test.execute_input, {"principal": {"role": "support"}, "environment": "staging"}),
		object.union(fixtures_test.execute_input, {"connections": {"crm": "revoked"}, "budget_class": "frugal"}),
		object.union(fixtures_test.execute_input, {"task": {"type": "invoice_payment"}, "connections": "none"}),
		object.union(fixtures_test.execute_input, {"quarantined": ["contact.read", "quote.prepare_send"]}),
		object.union(fixtures_test.execute_input, {"quarantined": "all"}),
	]
	every facts in inputs {
		excluded := fixtures_test.compose_excluded with input as facts with data.capgate.catalogue as fixtures_test.catalogue
		every name in fixtures_test.tool_names {
			call := object.union(facts, {"call": {"tool": name}})
			decision := execute.decision with input as call
				with data.capgate.catalogue as fixtures_test.catalogue
				with time.now_ns as fixtures_test.now_ns
			got := fixtures_test.codes(decision.reasons) & fixtures_test.visibility_codes
			got == fixtures_test.codes(object.get(excluded, name, set()))
		}
	}
}
