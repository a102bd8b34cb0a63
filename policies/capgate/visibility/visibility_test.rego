package capgate.visibility_test

import data.capgate.fixtures_test
import data.capgate.visibility

# Facts that keep a tool visible, one case per way of passing each check. A case
# names its tool when it is not quote.prepare_send.
test_allow_visible_matrix if {
	hidden := {note |
		some note, case in _allow_cases
		tool := object.get(case, "tool", "quote.prepare_send")
		facts := object.union(fixtures_test.compose_input, case.patch)
		not visibility.is_visible(tool) with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	}
	hidden == set()
	with_reasons := {note |
		some note, case in _allow_cases
		tool := object.get(case, "tool", "quote.prepare_send")
		facts := object.union(fixtures_test.compose_input, case.patch)
		visibility.reasons(tool) != set() with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	}
	with_reasons == set()
}

_allow_cases := {
	"quote for sales in production": {"patch": {}},
	"quote in staging": {"patch": {"environment": "staging"}},
	"needs names the tool": {"patch": {"task": {"needs": ["quote.prepare_send"]}}},
	"read for support": {
		"tool": "contact.read",
		"patch": {"principal": {"role": "support"}},
	},
	"pure function ignores connection states": {
		"tool": "oracle.price",
		"patch": {"connections": {"crm": "revoked", "sales_mailbox": "disabled"}},
	},
	"pure function with connections malformed": {
		"tool": "oracle.price",
		"patch": {"connections": "none"},
	},
	"payment for finance": {
		"tool": "payment.execute",
		"patch": _finance_patch,
	},
	"another tool quarantined": {"patch": {"quarantined": ["contact.read", "ghost"]}},
	"nothing quarantined": {"patch": {"quarantined": []}},
	"quarantine null": {"patch": {"quarantined": null}},
}

# One failing fact, one reason: each case asserts the exact set of codes. A case
# names its tool when it is not quote.prepare_send.
test_deny_reason_matrix if {
	got := {note: fixtures_test.codes(reasons) |
		some note, case in _deny_cases
		tool := object.get(case, "tool", "quote.prepare_send")
		facts := object.union(fixtures_test.compose_input, case.patch)
		reasons := visibility.reasons(tool) with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	}
	wrong := {note | some note, case in _deny_cases; got[note] != case.codes}
	wrong == set()
	visible := {note |
		some note, case in _deny_cases
		tool := object.get(case, "tool", "quote.prepare_send")
		facts := object.union(fixtures_test.compose_input, case.patch)
		visibility.is_visible(tool) with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	}
	visible == set()
}

_deny_cases := {
	"role without the grant": {
		"patch": {"principal": {"role": "support"}},
		"codes": {"role_not_granted"},
	},
	"role the catalogue does not declare": {
		"patch": {"principal": {"role": "admin"}},
		"codes": {"role_not_granted"},
	},
	"role not a string": {
		"patch": {"principal": {"role": ["sales"]}},
		"codes": {"role_not_granted"},
	},
	"task type without the tool": {
		"patch": {"task": {"type": "invoice_payment"}},
		"codes": {"not_needed_by_task"},
	},
	"unknown task type": {
		"patch": {"task": {"type": "other"}},
		"codes": {"not_needed_by_task"},
	},
	"needs without the tool": {
		"patch": {"task": {"needs": ["contact.read"]}},
		"codes": {"not_needed_by_task"},
	},
	"needs empty": {
		"tool": "oracle.price",
		"patch": {"task": {"needs": []}},
		"codes": {"not_needed_by_task"},
	},
	"needs not a list": {
		"patch": {"task": {"needs": "quote.prepare_send"}},
		"codes": {"not_needed_by_task"},
	},
	"needs cannot widen the task type": {
		"tool": "payment.execute",
		"patch": object.union(_finance_patch, {"task": {"type": "customer_quote", "needs": ["payment.execute"]}}),
		"codes": {"not_needed_by_task"},
	},
	"connection status null": {
		"patch": {"connections": {"sales_mailbox": null}},
		"codes": {"connection_revoked"},
	},
	"connection disabled": {
		"patch": {"connections": {"sales_mailbox": "disabled"}},
		"codes": {"tool_not_enabled_for_tenant"},
	},
	"connection revoked": {
		"patch": {"connections": {"sales_mailbox": "revoked"}},
		"codes": {"connection_revoked"},
	},
	"connection in an unknown state": {
		"patch": {"connections": {"sales_mailbox": "pending"}},
		"codes": {"connection_revoked"},
	},
	"connection status false": {
		"patch": {"connections": {"sales_mailbox": false}},
		"codes": {"connection_revoked"},
	},
	"connections not an object": {
		"tool": "contact.read",
		"patch": {"connections": ["crm"]},
		"codes": {"connection_missing"},
	},
	"environment not allowed": {
		"tool": "payment.execute",
		"patch": object.union(_finance_patch, {"environment": "staging"}),
		"codes": {"environment_restricted"},
	},
	"unknown environment": {
		"patch": {"environment": "dev"},
		"codes": {"environment_restricted"},
	},
	"budget below the cost class": {
		"patch": {"budget_class": "frugal"},
		"codes": {"budget_class_exceeded"},
	},
	"unknown budget class": {
		"tool": "oracle.price",
		"patch": {"budget_class": "gold"},
		"codes": {"budget_class_exceeded"},
	},
	"upstream definition not accepted": {
		"patch": {"quarantined": ["quote.prepare_send"]},
		"codes": {"tool_quarantined"},
	},
	"pure function quarantined among others": {
		"tool": "oracle.price",
		"patch": {"quarantined": [7, "oracle.price", {"name": "contact.read"}]},
		"codes": {"tool_quarantined"},
	},
	"quarantine not a list": {
		"patch": {"quarantined": "contact.read"},
		"codes": {"tool_quarantined"},
	},
	"quarantine an object": {
		"tool": "contact.read",
		"patch": {"quarantined": {"contact.read": false}},
		"codes": {"tool_quarantined"},
	},
	"quarantine false": {
		"patch": {"quarantined": false},
		"codes": {"tool_quarantined"},
	},
	"everything wrong at once": {
		"tool": "payment.execute",
		"patch": {"environment": "staging"},
		"codes": {
			"role_not_granted",
			"not_needed_by_task",
			"connection_missing",
			"environment_restricted",
			"budget_class_exceeded",
		},
	},
}

# Facts under which payment.execute is visible.
_finance_patch := {
	"principal": {"role": "finance"},
	"task": {"type": "invoice_payment"},
	"connections": {"bank": "active"},
	"budget_class": "unlimited",
}

test_deny_connection_missing_when_alias_absent if {
	facts := json.remove(fixtures_test.compose_input, ["connections/sales_mailbox"])
	reasons := visibility.reasons("quote.prepare_send") with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
	fixtures_test.codes(reasons) == {"connection_missing"}
}

test_deny_every_fact_missing if {
	reasons := visibility.reasons("quote.prepare_send") with input as {}
		with data.capgate.catalogue as fixtures_test.catalogue
	fixtures_test.codes(reasons) == {
		"role_not_granted", "not_needed_by_task", "connection_missing",
		"environment_restricted", "budget_class_exceeded",
	}
}

test_deny_input_not_an_object if {
	reasons := visibility.reasons("contact.read") with input as "sales"
		with data.capgate.catalogue as fixtures_test.catalogue
	fixtures_test.codes(reasons) == {
		"role_not_granted", "not_needed_by_task", "connection_missing",
		"environment_restricted", "budget_class_exceeded",
	}
}

# A tool the catalogue does not have, or has in a malformed shape, is in no entry of
# the index, so it fails every check that reads the index; one it does not have is
# also not among the tools the quarantine check admits.
test_deny_tool_absent_or_malformed if {
	tools := object.union(fixtures_test.catalogue.tools, {"broken": "not a contract"})
	task_types := {"customer_quote": {"tools": {"broken": true, "ghost": true}}}
	catalogue := object.union(fixtures_test.catalogue, {"tools": tools, "task_types": task_types})
	every name, codes in {"broken": set(), "ghost": {"tool_quarantined"}} {
		reasons := visibility.reasons(name) with input as fixtures_test.compose_input
			with data.capgate.catalogue as catalogue
		fixtures_test.codes(reasons) == (_contract_codes | {"not_needed_by_task"}) | codes
		not visibility.is_visible(name) with input as fixtures_test.compose_input
			with data.capgate.catalogue as catalogue
	}
}

# The checks that read what the compiler indexes from a tool's contract.
_contract_codes := {"role_not_granted", "connection_missing", "environment_restricted", "budget_class_exceeded"}

# A contract compiled with a field missing is in no index entry for that field, so it
# fails the check that reads the entry.
test_deny_contract_field_missing if {
	cases := {
		"roles": {"role_not_granted"},
		"connection_alias": {"connection_missing"},
		"environments": {"environment_restricted"},
		"cost_class": {"budget_class_exceeded"},
	}
	every field, codes in cases {
		removed := json.remove(fixtures_test.catalogue, [sprintf("tools/quote.prepare_send/%s", [field])])
		catalogue := fixtures_test.reindex(removed)
		reasons := visibility.reasons("quote.prepare_send") with input as fixtures_test.compose_input
			with data.capgate.catalogue as catalogue
		fixtures_test.codes(reasons) == codes
	}
}

# A catalogue section missing fails every check that looks into it. The checks read
# the index, not the contracts or task types: per tool they pass for a name the
# index holds even without its contract, but for the quarantine check, which admits
# the catalogue's tools; execute, which asks them, denies such a tool as
# unknown_tool first. Compose lists catalogue tools only.
test_deny_catalogue_section_missing if {
	cases := {
		"roles": {"role_not_granted"},
		"budget_classes": {"budget_class_exceeded"},
		"index": (_contract_codes | {"not_needed_by_task"}),
		"task_types": set(),
		"tools": {"tool_quarantined"},
	}
	every section, codes in cases {
		catalogue := json.remove(fixtures_test.catalogue, [section])
		reasons := visibility.reasons("quote.prepare_send") with input as fixtures_test.compose_input
			with data.capgate.catalogue as catalogue
		fixtures_test.codes(reasons) == codes
	}
}

# A grant must be exactly true.
test_deny_grant_not_true if {
	tool := object.union(fixtures_test.catalogue.tools["quote.prepare_send"], {
		"roles": {"sales": "yes"},
		"environments": {"production": 1},
	})
	catalogue := fixtures_test.reindex(object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": tool}}))
	reasons := visibility.reasons("quote.prepare_send") with input as fixtures_test.compose_input
		with data.capgate.catalogue as catalogue
	fixtures_test.codes(reasons) == {"role_not_granted", "environment_restricted"}
}

test_deny_messages_name_the_facts if {
	facts := object.union(fixtures_test.compose_input, {
		"principal": {"role": "support"},
		"connections": {"sales_mailbox": "disabled"},
		"budget_class": "frugal",
	})
	reasons := visibility.reasons("quote.prepare_send") with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
	messages := {reason.code: reason.message | some reason in reasons}
	messages.role_not_granted == `tool "quote.prepare_send" is not granted to role "support"`
	messages.tool_not_enabled_for_tenant == concat("", [
		`tool "quote.prepare_send" needs connection "sales_mailbox", `,
		`which the tenant has disabled`,
	])
	messages.budget_class_exceeded == concat("", [
		`tool "quote.prepare_send" has cost class "low", `,
		`which budget class "frugal" does not admit`,
	])
}

test_deny_quarantine_message_names_the_tool if {
	facts := object.union(fixtures_test.compose_input, {"quarantined": ["quote.prepare_send"]})
	reasons := visibility.reasons("quote.prepare_send") with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
	reasons == {{
		"code": "tool_quarantined",
		"message": concat("", [
			`tool "quote.prepare_send" is quarantined: its MCP server's current definition `,
			"of it is not one a person accepted",
		]),
	}}
}

test_deny_message_names_task_type_and_needs if {
	narrowed := object.union(fixtures_test.compose_input, {"task": {"needs": ["contact.read"]}})
	reasons := visibility.reasons("quote.prepare_send") with input as narrowed
		with data.capgate.catalogue as fixtures_test.catalogue
	reasons == {{
		"code": "not_needed_by_task",
		"message": `tool "quote.prepare_send" is not offered by task type "customer_quote" with task.needs ["contact.read"]`,
	}}
}

test_deny_messages_name_connection_status_and_environment if {
	facts := object.union(fixtures_test.compose_input, {
		"connections": {"crm": "revoked", "sales_mailbox": "paused"},
		"environment": "development",
	})
	got := {name: {reason.code: reason.message | some reason in visibility.reasons(name)} |
		some name in ["contact.read", "quote.prepare_send", "payment.execute"]
	} with input as facts
		with data.capgate.catalogue as fixtures_test.catalogue
	got["contact.read"].connection_revoked == concat("", [
		`tool "contact.read" needs connection "crm", `,
		`whose status is "revoked", not active`,
	])
	got["quote.prepare_send"].connection_revoked == concat("", [
		`tool "quote.prepare_send" needs connection "sales_mailbox", `,
		`whose status is "paused", not active`,
	])
	got["payment.execute"].connection_missing == concat("", [
		`tool "payment.execute" needs connection "bank", `,
		`which the tenant does not have`,
	])
	got["contact.read"].environment_restricted == `tool "contact.read" is not available in environment "development"`
}

# is_visible and an empty reasons set always agree, whatever the facts.
test_allow_visibility_agrees_with_reasons if {
	inputs := [
		fixtures_test.compose_input,
		{},
		object.union(fixtures_test.compose_input, {"principal": {"role": "finance"}, "budget_class": "unlimited"}),
		object.union(fixtures_test.compose_input, {"connections": {"crm": "revoked"}, "environment": "staging"}),
	]
	every facts in inputs {
		visible := {name | some name in fixtures_test.tool_names; visibility.is_visible(name)} with input as facts
			with data.capgate.catalogue as fixtures_test.catalogue
		hidden := {name | some name in fixtures_test.tool_names; count(visibility.reasons(name)) > 0} with input as facts
			with data.capgate.catalogue as fixtures_test.catalogue
		visible == fixtures_test.tool_names - hidden
	}
}

# A check declared without an entry in the checks table admits no tool: compose
# hides every tool, execute denies every call with its code, explain fails it.
test_deny_a_check_declared_without_logic_fails_every_tool if {
	undefined := {
		"check": "undefined",
		"title": "Undefined",
		"facts": [],
		"codes": {"undefined_check": {"title": "Undefined", "message": "tool {tool} fails a check with no logic"}},
	}
	declared := array.concat(visibility.declared, [undefined])
	visibility.visible_tools == set() with input as fixtures_test.compose_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with visibility.declared as declared
	reasons := visibility.reasons("contact.read") with input as fixtures_test.compose_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with visibility.declared as declared
	reasons == {{"code": "undefined_check", "message": `tool "contact.read" fails a check with no logic`}}
	call := object.union(fixtures_test.compose_input, {"call": {"tool": "contact.read"}})
	not visibility.called_passes with input as call
		with data.capgate.catalogue as fixtures_test.catalogue
		with visibility.declared as declared
	checks := visibility.checks("contact.read") with input as fixtures_test.compose_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with visibility.declared as declared
	checks[count(checks) - 1] == {"check": "undefined", "pass": false, "code": "undefined_check", "facts": {}}
}

# With fewer than three checks, compose intersects the ones there are.
test_allow_compose_with_fewer_checks_than_it_intersects if {
	declared := [declaration | some declaration in visibility.declared; declaration.check in {"role", "task"}]
	visible := visibility.visible_tools with input as fixtures_test.compose_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with visibility.declared as declared
	visible == {"contact.read", "oracle.price", "quote.prepare_send"}
}
