package capgate.compose_test

import data.capgate.compose
import data.capgate.fixtures_test

# Compose's decision with, beside it, the reasons capgate.explain gives for every
# hidden tool ({name: [{"code"}]}): what compose answered in one object before the
# reasons moved out of the agent's answer.
_answer := object.union(compose.decision, {"excluded": fixtures_test.compose_excluded})

test_allow_decision_holds_only_the_visible_names_and_the_digest if {
	decision := compose.decision with input as fixtures_test.compose_input
		with data.capgate.catalogue as fixtures_test.catalogue
	decision == {
		"visible": {"contact.read", "oracle.price", "quote.prepare_send"},
		"catalogue_digest": fixtures_test.digest,
	}
}

test_allow_sales_quote_sees_its_tools if {
	decision := _answer with input as fixtures_test.compose_input
		with data.capgate.catalogue as fixtures_test.catalogue
	decision.visible == {"contact.read", "oracle.price", "quote.prepare_send"}
	object.keys(decision.excluded) == {"payment.execute"}
	fixtures_test.codes(decision.excluded["payment.execute"]) == {
		"role_not_granted",
		"not_needed_by_task",
		"connection_missing",
		"budget_class_exceeded",
	}
}

test_allow_needs_narrows_the_task_type if {
	facts := object.union(fixtures_test.compose_input, {"task": {"needs": ["contact.read", "oracle.price"]}})
	decision := _answer with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	decision.visible == {"contact.read", "oracle.price"}
	decision.excluded["quote.prepare_send"] == [{"code": "not_needed_by_task"}]
}

test_allow_finance_pays_invoices if {
	facts := object.union(fixtures_test.compose_input, {
		"principal": {"role": "finance"},
		"task": {"type": "invoice_payment"},
		"connections": {"bank": "active"},
		"budget_class": "unlimited",
	})
	decision := _answer with input as facts with data.capgate.catalogue as fixtures_test.catalogue
	decision.visible == {"oracle.price", "payment.execute"}
	fixtures_test.codes(decision.excluded["contact.read"]) == {"role_not_granted", "not_needed_by_task"}
	fixtures_test.codes(decision.excluded["quote.prepare_send"]) == {"role_not_granted", "not_needed_by_task"}
}

# One fact changed per case; the value is each excluded tool's exact set of codes.
test_deny_excluded_matrix if {
	got := {note: codes |
		some note, case in _excluded_cases
		facts := object.union(fixtures_test.compose_input, case.patch)
		decision := _answer with input as facts with data.capgate.catalogue as fixtures_test.catalogue
		codes := {name: fixtures_test.codes(reasons) | some name, reasons in decision.excluded}
	}
	wrong := {note | some note, case in _excluded_cases; got[note] != case.excluded}
	wrong == set()
}

_payment_codes := {"role_not_granted", "not_needed_by_task", "connection_missing", "budget_class_exceeded"}

_excluded_cases := {
	"quote quarantined": {
		"patch": {"quarantined": ["quote.prepare_send"]},
		"excluded": {
			"quote.prepare_send": {"tool_quarantined"},
			"payment.execute": _payment_codes,
		},
	},
	"payment quarantined too": {
		"patch": {"quarantined": ["payment.execute", "oracle.price"]},
		"excluded": {
			"oracle.price": {"tool_quarantined"},
			"payment.execute": (_payment_codes | {"tool_quarantined"}),
		},
	},
	"quarantine malformed": {
		"patch": {"quarantined": "everything"},
		"excluded": {
			"contact.read": {"tool_quarantined"},
			"oracle.price": {"tool_quarantined"},
			"quote.prepare_send": {"tool_quarantined"},
			"payment.execute": (_payment_codes | {"tool_quarantined"}),
		},
	},
	"mailbox disabled": {
		"patch": {"connections": {"sales_mailbox": "disabled"}},
		"excluded": {
			"quote.prepare_send": {"tool_not_enabled_for_tenant"},
			"payment.execute": _payment_codes,
		},
	},
	"mailbox revoked": {
		"patch": {"connections": {"sales_mailbox": "revoked"}},
		"excluded": {
			"quote.prepare_send": {"connection_revoked"},
			"payment.execute": _payment_codes,
		},
	},
	"crm and mailbox gone": {
		"patch": {"connections": "none"},
		"excluded": {
			"contact.read": {"connection_missing"},
			"quote.prepare_send": {"connection_missing"},
			"payment.execute": _payment_codes,
		},
	},
	"development environment": {
		"patch": {"environment": "development"},
		"excluded": {
			"contact.read": {"environment_restricted"},
			"oracle.price": {"environment_restricted"},
			"quote.prepare_send": {"environment_restricted"},
			"payment.execute": (_payment_codes | {"environment_restricted"}),
		},
	},
	"frugal budget": {
		"patch": {"budget_class": "frugal"},
		"excluded": {
			"quote.prepare_send": {"budget_class_exceeded"},
			"payment.execute": _payment_codes,
		},
	},
	"support role": {
		"patch": {"principal": {"role": "support"}},
		"excluded": {
			"oracle.price": {"role_not_granted"},
			"quote.prepare_send": {"role_not_granted"},
			"payment.execute": _payment_codes,
		},
	},
}

# With no facts at all every tool is hidden, each with every reason that applies.
test_deny_empty_input_hides_everything if {
	decision := _answer with input as {} with data.capgate.catalogue as fixtures_test.catalogue
	decision.visible == set()
	got := {name: fixtures_test.codes(reasons) | some name, reasons in decision.excluded}
	got == {
		"contact.read": _no_facts_codes,
		"oracle.price": _no_facts_codes - {"connection_missing"}, # a pure function needs no connection
		"payment.execute": _no_facts_codes,
		"quote.prepare_send": _no_facts_codes,
	}
}

_no_facts_codes := {
	"role_not_granted",
	"not_needed_by_task",
	"connection_missing",
	"environment_restricted",
	"budget_class_exceeded",
}

test_deny_input_not_an_object if {
	decision := _answer with input as ["sales"] with data.capgate.catalogue as fixtures_test.catalogue
	decision.visible == set()
	object.keys(decision.excluded) == fixtures_test.tool_names
}

# Without a usable catalogue nothing is visible and the answer is still complete.
test_deny_catalogue_missing_or_malformed if {
	catalogues := [{}, "catalogue", {"tools": []}, {"tools": "all"}, {"tools": {}}]
	every catalogue in catalogues {
		decision := _answer with input as fixtures_test.compose_input with data.capgate.catalogue as catalogue
		decision == {"visible": set(), "excluded": {}, "catalogue_digest": null}
		compose.decision == {"visible": set(), "catalogue_digest": null} with input as fixtures_test.compose_input
			with data.capgate.catalogue as catalogue
	}
}

test_deny_malformed_tool_entry_is_excluded if {
	tools := object.union(fixtures_test.catalogue.tools, {"broken": ["not", "a", "contract"]})
	catalogue := object.union(fixtures_test.catalogue, {"tools": tools})
	decision := _answer with input as fixtures_test.compose_input with data.capgate.catalogue as catalogue
	decision.visible == {"contact.read", "oracle.price", "quote.prepare_send"}
	fixtures_test.codes(decision.excluded.broken) == {
		"role_not_granted",
		"not_needed_by_task",
		"connection_missing",
		"environment_restricted",
		"budget_class_exceeded",
	}
}

# Every tool is either visible or excluded with at least one reason, never both.
test_allow_every_tool_answered_once if {
	inputs := [
		fixtures_test.compose_input,
		{},
		object.union(fixtures_test.compose_input, {"principal": {"role": "finance"}, "budget_class": "unlimited"}),
		object.union(fixtures_test.compose_input, {"connections": {"crm": "disabled"}, "task": {"needs": []}}),
	]
	every facts in inputs {
		decision := _answer with input as facts with data.capgate.catalogue as fixtures_test.catalogue
		excluded := object.keys(decision.excluded)
		decision.visible | excluded == fixtures_test.tool_names
		decision.visible & excluded == set()
		every reasons in decision.excluded {
			count(reasons) > 0
		}
	}
}
