package capgate.explain_test

import data.capgate.compose
import data.capgate.execute
import data.capgate.explain
import data.capgate.fixtures_test
import data.capgate.visibility

_compose_checks := ["role", "task", "connection", "environment", "budget", "quarantine"]

_call_checks := [
	"version", "stage", "approval", "approval_expiry", "approval_quorum", "approval_use",
	"proposal", "budget_units", "limits", "evidence", "subject", "operation_id",
]

# A check has a code exactly when it fails.
_is_consistent(check) if {
	check.pass == true
	check.code == null
}

_is_consistent(check) if {
	check.pass == false
	is_string(check.code)
}

# True when every check passes, else false.
_passes_all(checks) if count(_failing(checks)) == 0

else := false

# The failing checks of an explanation, as {check: code}.
_failing(checks) := {check.check: check.code | some check in checks; check.pass == false}

test_allow_compose_explains_every_tool_with_every_check if {
	explained := explain.compose with input as fixtures_test.compose_input
		with data.capgate.catalogue as fixtures_test.catalogue
	explained.catalogue_digest == fixtures_test.digest
	object.keys(explained.tools) == fixtures_test.tool_names
	every tool in explained.tools {
		[check.check | some check in tool.checks] == _compose_checks
		every check in tool.checks {
			_is_consistent(check)
			is_object(check.facts)
		}
	}
	{name | some name, tool in explained.tools; tool.visible} == {"contact.read", "oracle.price", "quote.prepare_send"}
}

# Each row changes the baseline's facts; the value is each hidden tool's failing
# checks with their codes, and the facts of one check of one tool.
test_deny_compose_rows if {
	got := {note: [hidden, facts] |
		some note, row in _compose_rows
		explained := explain.compose with input as object.union(fixtures_test.compose_input, row.patch)
			with data.capgate.catalogue as fixtures_test.catalogue
		hidden := {name: _failing(tool.checks) | some name, tool in explained.tools; not tool.visible}
		facts := [check.facts | some check in explained.tools[row.tool].checks; check.check == row.check][0]
	}
	want := {note: [row.hidden, row.facts] | some note, row in _compose_rows}
	wrong := {note | some note, pair in got; pair != want[note]}
	wrong == set()
	count(got) == count(want)
}

_payment_hidden := {
	"role": "role_not_granted",
	"task": "not_needed_by_task",
	"connection": "connection_missing",
	"budget": "budget_class_exceeded",
}

_compose_rows := {
	"baseline": {
		"patch": {},
		"hidden": {"payment.execute": _payment_hidden},
		"tool": "payment.execute",
		"check": "connection",
		"facts": {"alias": "bank", "status": null},
	},
	"support, mailbox disabled": {
		"patch": {"principal": {"role": "support"}, "connections": {"sales_mailbox": "disabled"}},
		"hidden": {
			"oracle.price": {"role": "role_not_granted"},
			"quote.prepare_send": {"role": "role_not_granted", "connection": "tool_not_enabled_for_tenant"},
			"payment.execute": _payment_hidden,
		},
		"tool": "quote.prepare_send",
		"check": "connection",
		"facts": {"alias": "sales_mailbox", "status": "disabled"},
	},
	"needs, frugal, quarantined": {
		"patch": {"task": {"needs": ["contact.read"]}, "budget_class": "frugal", "quarantined": ["contact.read"]},
		"hidden": {
			"contact.read": {"quarantine": "tool_quarantined"},
			"oracle.price": {"task": "not_needed_by_task"},
			"quote.prepare_send": {"task": "not_needed_by_task", "budget": "budget_class_exceeded"},
			"payment.execute": _payment_hidden,
		},
		"tool": "quote.prepare_send",
		"check": "budget",
		"facts": {"budget_class": "frugal", "cost_class": "low"},
	},
	"staging": {
		"patch": {"environment": "staging"},
		"hidden": {"payment.execute": object.union(_payment_hidden, {"environment": "environment_restricted"})},
		"tool": "payment.execute",
		"check": "environment",
		"facts": {"environment": "staging"},
	},
	"mailbox revoked": {
		"patch": {"connections": {"sales_mailbox": "revoked"}},
		"hidden": {
			"quote.prepare_send": {"connection": "connection_revoked"},
			"payment.execute": _payment_hidden,
		},
		"tool": "contact.read",
		"check": "task",
		"facts": {"task_type": "customer_quote", "needs": null},
	},
}

# Compose inputs beside the rows': whole inputs, malformed facts, every tool visible.
_compose_inputs := [
	fixtures_test.compose_input,
	{},
	"not an object",
	object.union(fixtures_test.compose_input, {"principal": {"role": "finance"}, "budget_class": "unlimited"}),
	object.union(fixtures_test.compose_input, {"connections": {"crm": "disabled"}, "task": {"needs": []}}),
	object.union(fixtures_test.compose_input, {"quarantined": "everything"}),
]

# The verdict of explain is compose's, and is every check passing, on every facts.
test_allow_compose_verdict_is_the_decisions if every facts in _compose_inputs {
	visible := compose.decision.visible with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	explained := explain.compose.tools with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	object.keys(explained) == fixtures_test.tool_names
	{name | some name, tool in explained; tool.visible} == visible
	{name | some name, tool in explained; count(_failing(tool.checks)) == 0} == visible
}

# compose_codes names exactly the tools compose hides, each with the codes of the
# checks it fails in explain.compose, sorted: on every row and input, and on
# catalogue data with no index or no tools.
test_allow_compose_codes_are_explains_failing_codes if {
	inputs := array.concat(
		[object.union(fixtures_test.compose_input, row.patch) | some row in _compose_rows],
		_compose_inputs,
	)
	catalogues := [
		fixtures_test.catalogue,
		object.remove(fixtures_test.catalogue, ["index"]),
		object.union(fixtures_test.catalogue, {"tools": "not an object"}),
	]
	wrong := {[i, j] |
		some i, facts in inputs
		some j, catalogue in catalogues
		not _codes_agree with input as facts with data.capgate.catalogue as catalogue
	}
	wrong == set()
}

_codes_agree if {
	codes := explain.compose_codes
	explained := explain.compose
	codes.catalogue_digest == explained.catalogue_digest
	codes.hidden == {name: sort([check.code | some check in tool.checks; check.pass == false]) |
		some name, tool in explained.tools
		not tool.visible
	}
	object.keys(codes.hidden) == object.keys(explained.tools) - compose.decision.visible
}

# The codes of the rows' hidden tools, sorted.
test_deny_compose_codes_rows if {
	got := {note: codes.hidden |
		some note, row in _compose_rows
		codes := explain.compose_codes with input as object.union(fixtures_test.compose_input, row.patch)
			with data.capgate.catalogue as fixtures_test.catalogue
	}
	want := {note: {name: sort([code | some code in failing]) | some name, failing in row.hidden} |
		some note, row in _compose_rows
	}
	got == want
	got.baseline == {"payment.execute": [
		"budget_class_exceeded", "connection_missing",
		"not_needed_by_task", "role_not_granted",
	]}
}

test_allow_execute_explains_an_allowed_dispatch if {
	explained := explain.execute with input as fixtures_test.execute_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	explained.allow == true
	explained.catalogue_digest == fixtures_test.digest
	[check.check | some check in explained.checks] == array.concat(array.concat(["tool"], _compose_checks), _call_checks)
	_failing(explained.checks) == {}
}

# Each row changes the dispatch's facts (or is a whole input); the value is the
# failing checks with their codes. Every row is also checked against execute.
test_deny_execute_rows if {
	got := {note: _failing(explained.checks) |
		some note, row in _execute_rows
		explained := explain.execute with input as _row_input(row)
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {note: row.failing | some note, row in _execute_rows}
	wrong := {note | some note, failing in got; failing != want[note]}
	wrong == set()
	count(got) == count(want)
}

_row_input(row) := row.input

_row_input(row) := object.union(fixtures_test.execute_input, row.patch) if not row.input

_execute_rows := {
	"unknown tool": {"patch": {"call": {"tool": "ghost"}}, "failing": {"tool": "unknown_tool"}},
	"input not an object": {"input": "dispatch", "failing": {"tool": "unknown_tool"}},
	"old version, support role": {
		"patch": {"call": {"version": 7}, "principal": {"role": "support"}},
		"failing": {"version": "version_mismatch", "role": "role_not_granted"},
	},
	"called without review": {
		"patch": {"stage": "call"},
		"failing": {"stage": "review_required"},
	},
	# The approval and the proposal are read at dispatch, the budget at call and
	# dispatch: at a stage that is none of them, only the stage fails.
	"stage unknown": {
		"patch": {"stage": "run"},
		"failing": {"stage": "stage_invalid"},
	},
	"no approval, pending proposal": {
		"patch": {"approval": null, "proposal": {"status": "pending"}},
		"failing": {"approval": "approval_required", "proposal": "proposal_not_approved"},
	},
	"approval for another tenant, expired and used": {
		"patch": {"approval": {"tenant": "other", "expires_at": "2026-11-30T10:00:00Z", "used": true}},
		"failing": {"approval": "approval_mismatch", "approval_expiry": "approval_expired", "approval_use": "approval_used"},
	},
	"budget spent, evidence short, subject elsewhere, no key": {
		"patch": {
			"budget": {"remaining": 0},
			"evidence": [],
			"call": {"subject": {"type": "opportunity", "id": "opp-99"}, "operation_id": ""},
			"approval": {"operation_id": ""},
		},
		"failing": {
			"budget_units": "budget_exhausted", "evidence": "evidence_missing",
			"subject": "subject_out_of_scope", "operation_id": "operation_id_missing",
		},
	},
}

# The verdict of explain is execute's allow and every check passing; every reason
# code of the decision is the code of a failing check.
test_allow_execute_verdict_is_the_decisions if {
	inputs := array.concat([_row_input(row) | some row in _execute_rows], [
		fixtures_test.execute_input, fixtures_test.propose_input, fixtures_test.call_input,
		object.union(fixtures_test.call_input, {"stage": "dispatch"}),
		object.union(fixtures_test.call_input, {"budget": {"remaining": 0, "cost": 0}, "operation": {"status": "running"}}),
		{},
	])
	wrong := {facts |
		some facts in inputs
		not _agrees with input as facts
	} with data.capgate.catalogue as fixtures_test.catalogue
		with time.now_ns as fixtures_test.now_ns
	wrong == set()
}

_agrees if {
	explained := explain.execute
	decision := execute.decision
	explained.allow == decision.allow
	explained.allow == _passes_all(explained.checks)
	every code in fixtures_test.codes(decision.reasons) {
		code in {check.code | some check in explained.checks}
	}
}

# The templates explain's compose answer carries are the compose checks' declared
# ones, one for every code they declare, whatever the input.
test_compose_carries_the_declared_templates if {
	explained := explain.compose with input as {} with data.capgate.catalogue as fixtures_test.catalogue
	count(explained.templates) == 8
	explained.templates.role_not_granted == "tool {tool} is not granted to role {role}"
	every declaration in visibility.declared {
		every code, spec in declaration.codes {
			explained.templates[code] == spec.message
		}
	}
}
