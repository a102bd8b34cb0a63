package capgate.execute_test

import data.capgate.compose
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

# Allowed calls, each changing the baseline; a case lists the obligation codes it expects.
test_allow_matrix if {
	got := {note: fixtures_test.summary(decision) |
		some note, case in _allow_cases
		facts := json.remove(object.union(fixtures_test.execute_input, case.patch), object.get(case, "remove", []))
		decision := execute.decision with input as facts
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {note: {"allow": true, "codes": set(), "obligations": case.obligations} | some note, case in _allow_cases}
	wrong := {note | some note, summary in got; summary != want[note]}
	wrong == set()
}

_oracle_call := {"call": {"tool": "oracle.price", "version": 2, "subject": null}}

_allow_cases := {
	"pure function: no approval, evidence, subject or connection needed": {
		"patch": object.union(_oracle_call, {"evidence": []}),
		"remove": ["approval", "connections"],
		"obligations": set(),
	},
	"approval present but not required is ignored": {
		"patch": object.union(_oracle_call, {"approval": {"digest": "sha256:bad", "expires_at": "yesterday"}}),
		"obligations": set(),
	},
	"approval null where none is required": {
		"patch": object.union(_oracle_call, {"approval": null}),
		"obligations": set(),
	},
	"read on a linked subject": {
		"patch": {"call": {"tool": "contact.read"}},
		"remove": ["approval"],
		"obligations": set(),
	},
	"subject among several linked resources": {
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
	"expiry with a time zone offset, later than now": {
		"patch": {"approval": {"expires_at": "2026-11-30T13:30:00+02:00"}},
		"obligations": {"pass_idempotency_key"},
	},
	"expiry one second after now": {
		"patch": {"approval": {"expires_at": "2026-11-30T11:00:01Z"}},
		"obligations": {"pass_idempotency_key"},
	},
	"expiry with lower-case t and z, as RFC 3339 allows": {
		"patch": {"approval": {"expires_at": "2026-11-30t11:00:01z"}},
		"obligations": {"pass_idempotency_key"},
	},
	"expiry with a fraction of a second": {
		"patch": {"approval": {"expires_at": "2026-11-30T11:00:00.25Z"}},
		"obligations": {"pass_idempotency_key"},
	},
	"extra evidence is harmless": {
		"patch": {"evidence": ["current_quote_revision", "verified_recipient", "other"]},
		"obligations": {"pass_idempotency_key"},
	},
	"needs names the tool": {
		"patch": {"task": {"needs": ["quote.prepare_send"]}},
		"obligations": {"pass_idempotency_key"},
	},
	"staging": {
		"patch": {"environment": "staging"},
		"obligations": {"pass_idempotency_key"},
	},
}

# One fact changed per case; each case asserts the exact set of codes.
test_deny_matrix if {
	got := {note: fixtures_test.summary(decision) |
		some note, case in _deny_cases
		facts := json.remove(object.union(fixtures_test.execute_input, case.patch), object.get(case, "remove", []))
		decision := execute.decision with input as facts
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {note: {"allow": false, "codes": case.codes, "obligations": set()} | some note, case in _deny_cases}
	wrong := {note | some note, summary in got; summary != want[note]}
	wrong == set()
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
	"connection revoked": {
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
		"remove": ["call/operation_id"],
		"codes": {"operation_id_missing"},
	},
	"operation id empty": {
		"patch": {"call": {"operation_id": ""}, "approval": {"operation_id": ""}},
		"codes": {"operation_id_missing"},
	},
	"a payment by a sales agent": {
		"patch": {"call": {"tool": "payment.execute", "version": 3}, "approval": {"tool": "payment.execute"}},
		"codes": {
			"role_not_granted",
			"not_needed_by_task",
			"connection_missing",
			"budget_class_exceeded",
			"evidence_missing",
			"subject_out_of_scope",
		},
	},
}

# Every reason code of docs/policy-interface.md (and operation_id_missing) is asserted
# exactly by at least one case of the deny matrix.
test_deny_matrix_covers_every_code if {
	covered := union({case.codes | some case in _deny_cases})
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
		"approval_required",
		"approval_mismatch",
		"approval_expired",
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
		"message": "the approval does not match the contract and the call in: digest, kind",
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
# facts, the compose reasons of a call are the tool's reasons in compose.excluded.
test_deny_execute_agrees_with_compose if {
	inputs := [
		fixtures_test.execute_input,
		object.union(fixtures_test.execute_input, {"principal": {"role": "support"}, "environment": "staging"}),
		object.union(fixtures_test.execute_input, {"connections": {"crm": "revoked"}, "budget_class": "frugal"}),
		object.union(fixtures_test.execute_input, {"task": {"type": "invoice_payment"}, "connections": "none"}),
	]
	every facts in inputs {
		excluded := compose.decision.excluded with input as facts with data.capgate.catalogue as fixtures_test.catalogue
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
