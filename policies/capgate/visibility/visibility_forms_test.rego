# METADATA
# title: The forms of the compose checks agree, and follow their declarations
# description: |
#   capgate.visibility derives every form of the compose checks from their one
#   declaration and definition (checks.rego): per tool (is_visible, checks; execute
#   asks these for the called tool, called_passes and called_failed_checks) and as
#   whole sets (visible_tools, tool_checks; compose and capgate.explain ask these).
#   These tests hold the derivation, not any one check: for every catalogue and
#   facts below, well formed or not, compose's visible set is exactly the tools
#   is_visible admits, explain reports for every tool exactly the checks, codes and
#   facts the per-tool form reports, the called form fails what the per-tool form
#   fails, and the checks table and the facts follow the declarations. A check added
#   to checks.rego is covered by them as it is.
package capgate.visibility_test

import data.capgate.compose
import data.capgate.explain
import data.capgate.fixtures_test
import data.capgate.visibility

# One test per catalogue, each comparing the two forms for every facts in the
# table; `wrong` names the facts they disagree on.

test_allow_compose_agrees_with_per_tool_checks_on_the_fixture if {
	wrong := {note |
		some note, facts in _facts
		not _agrees with input as facts
	} with data.capgate.catalogue as fixtures_test.catalogue
	wrong == set()
}

test_allow_compose_agrees_with_per_tool_checks_on_malformed_entries if {
	wrong := {note |
		some note, facts in _facts
		not _agrees with input as facts
	} with data.capgate.catalogue as _malformed_catalogue
	wrong == set()
}

test_allow_compose_agrees_with_per_tool_checks_on_a_malformed_index if every index in _malformed_indexes {
	wrong := {note |
		some note, facts in _facts
		not _agrees with input as facts
	} with data.capgate.catalogue as object.union(fixtures_test.catalogue, {"index": index})
	wrong == set()
}

test_allow_compose_agrees_with_per_tool_checks_on_missing_sections if {
	wrong := {note |
		some note, facts in _facts
		not _agrees with input as facts
	} with data.capgate.catalogue as _sections_missing
	wrong == set()
}

test_allow_compose_agrees_with_per_tool_checks_without_tools if {
	every catalogue in [{}, {"tools": ["contact.read"]}, object.union(fixtures_test.catalogue, {"tools": "all"})] {
		answers := {[visible, tools] |
			some facts in _facts
			visible := compose.decision.visible with input as facts
			tools := explain.compose.tools with input as facts
		} with data.capgate.catalogue as catalogue
		answers == {[set(), {}]}
		wrong := {note |
			some note, facts in _facts
			not _agrees with input as facts
		} with data.capgate.catalogue as catalogue
		wrong == set()
	}
}

# The per-call form (called_failed_checks, which execute asks once per call) fails
# exactly the checks the per-tool form fails for the tool the call names, on every
# catalogue above, for the catalogue's tools and for names it lacks.
test_allow_called_failed_checks_agree_with_per_tool_checks if {
	catalogues := array.concat(
		[fixtures_test.catalogue, _malformed_catalogue, _sections_missing],
		[object.union(fixtures_test.catalogue, {"index": index}) | some index in _malformed_indexes],
	)
	every catalogue in catalogues {
		wrong := {[note, name] |
			some note, facts in _facts
			some name in (object.keys(_catalogue_tools) | {"ghost", "no.such.tool"})
			not _call_agrees(name) with input as object.union(facts, {"call": {"tool": name}})
		} with data.capgate.catalogue as catalogue
		wrong == set()
	}
}

# Under an input whose call names the tool.
_call_agrees(name) if {
	visibility.called_failed_checks == visibility.failed_checks(name)
	visibility.called_passes == _is_empty(visibility.failed_checks(name))
}

_is_empty(s) if count(s) == 0

else := false

# The checks table holds exactly the declared checks, whatever the input and the
# catalogue (so called_passes counts declared checks only, and an entry that is
# not a comprehension shows here as an undefined table), and every check reports
# exactly the facts it declares and gives only the codes it declares.
test_allow_the_checks_follow_their_declarations if {
	declared := {declaration.check: declaration | some declaration in visibility.declared}
	count(declared) == count(visibility.declared)
	catalogues := [fixtures_test.catalogue, _malformed_catalogue, _sections_missing, {}]
	every catalogue in catalogues {
		wrong := {note |
			some note, facts in _facts
			not _follows(declared) with input as facts
		} with data.capgate.catalogue as catalogue
		wrong == set()
	}
}

_follows(declared) if {
	object.keys(visibility._admits) == object.keys(declared)
	object.keys(visibility._excludes) - object.keys(declared) == set()
	every name in object.keys(_catalogue_tools) {
		every check in visibility.checks(name) {
			object.keys(check.facts) == {fact | some fact in declared[check.check].facts}
			_is_declared_code(check.code, declared[check.check].codes)
		}
	}
}

_is_declared_code(null, _)

_is_declared_code(code, codes) if codes[code]

# Both forms answer the same under the input and catalogue the caller mocks. Both
# must answer: an undefined answer counts as disagreement.
_agrees if {
	names := object.keys(_catalogue_tools)
	per_tool_visible := {name | some name in names; visibility.is_visible(name)}
	compose.decision.visible == per_tool_visible
	explained := explain.compose.tools
	object.keys(explained) == names
	every name in names {
		explained[name].checks == visibility.checks(name)
		explained[name].visible == _is_in(name, per_tool_visible)
		explained[name].visible == _verdict(explained[name].checks)
		_codes(explained[name].checks) == {reason.code | some reason in visibility.reasons(name)}
	}
}

_every_check_passes(checks) if every check in checks {
	check.pass == true
}

# `x == (y in s)` is rewritten by opa fmt (1.22.4) as `(x == y) in s`: ask a function.
_is_in(x, s) if x in s

else := false

_verdict(checks) if _every_check_passes(checks)

else := false

_codes(checks) := {check.code | some check in checks; check.pass == false}

_sections_missing := json.remove(fixtures_test.catalogue, ["roles", "task_types", "budget_classes"])

default _catalogue_tools := {}

_catalogue_tools := data.capgate.catalogue.tools if is_object(data.capgate.catalogue.tools)

# Indexes the compiler would never write: entries of the wrong type, grants that are
# not true, names the catalogue lacks, and no index at all.
_malformed_indexes := [
	{},
	"index",
	{
		"by_role": {"sales": ["contact.read"]},
		"by_task_type": "customer_quote",
		"by_connection": {"crm": null, "sales_mailbox": {"quote.prepare_send": false}},
		"no_connection": ["oracle.price"],
		"by_environment": {"production": {"contact.read": "yes", "ghost": true}},
		"by_cost_class": {"free": {"oracle.price": null}, "low": 7},
	},
	object.union(fixtures_test.catalogue.index, {"by_role": {"sales": {"ghost": true}}, "no_connection": "all"}),
]

# The fixture with every kind of malformed entry the catalogue compiler would never
# produce but the policy must still deny.
_malformed_catalogue := fixtures_test.reindex(object.union(fixtures_test.catalogue, {
	"tools": {
		"broken": "not a contract",
		"listish": ["roles", "environments"],
		"bare": {},
		"grants.not.true": _contract({"roles": {"sales": "yes"}, "environments": {"production": 1}}),
		"fields.wrong.type": _contract({"roles": ["sales"], "environments": "production"}),
		"fields.absent": json.remove(_contract({}), ["connection_alias", "cost_class"]),
		"alias.legacy": _contract({"connection_alias": "legacy", "cost_class": null}),
		"alias.list": _contract({"connection_alias": ["crm"], "cost_class": ["free"]}),
		"alias.number": _contract({"connection_alias": 7, "cost_class": "platinum"}),
		"for.auditor": _contract({"roles": {"auditor": true}}),
		"for.undeclared": _contract({"roles": {"admin": true}}),
	},
	"task_types": {"customer_quote": {"tools": {
		"ghost": true,
		"broken": true,
		"listish": true,
		"bare": true,
		"grants.not.true": true,
		"fields.wrong.type": true,
		"fields.absent": true,
		"alias.legacy": true,
		"alias.list": true,
		"alias.number": true,
		"for.auditor": true,
		"for.undeclared": true,
		"payment.execute": "yes",
	}}},
	"budget_classes": {"broken": {"admits": ["free"]}, "loose": {"admits": {"free": "yes", "low": 1}}},
	"roles": {"auditor": null},
}))

# A well-formed contract for a sales tool on the crm connection, with a change.
_contract(patch) := object.union(
	{
		"name": "synthetic",
		"version": 1,
		"mode": "read",
		"roles": {"sales": true},
		"connection_alias": "crm",
		"subject_type": null,
		"requires": [],
		"approval": "none",
		"execution_action": "synthetic",
		"recovery": "retry",
		"idempotency": "idempotent",
		"cost_class": "free",
		"environments": {"production": true},
	},
	patch,
)

_base := fixtures_test.compose_input

# Facts: the baseline, every fact changed alone (to another valid value, to one the
# catalogue does not know, to the wrong type, or removed), and inputs with nothing.
# object.union merges objects, so a patch can only add to the baseline's objects.
_facts := {
	"baseline": _base,
	"finance paying": object.union(_base, {
		"principal": {"role": "finance"},
		"task": {"type": "invoice_payment"},
		"connections": {"bank": "active"},
		"budget_class": "unlimited",
	}),
	"role support": object.union(_base, {"principal": {"role": "support"}}),
	"role undeclared": object.union(_base, {"principal": {"role": "admin"}}),
	"role declared as null": object.union(_base, {"principal": {"role": "auditor"}}),
	"role a list": object.union(_base, {"principal": {"role": ["sales"]}}),
	"role null": object.union(_base, {"principal": {"role": null}}),
	"role missing": json.remove(_base, ["principal/role"]),
	"principal not an object": object.union(_base, {"principal": "sales"}),
	"principal missing": json.remove(_base, ["principal"]),
	"task type other": object.union(_base, {"task": {"type": "invoice_payment"}}),
	"task type unknown": object.union(_base, {"task": {"type": "other"}}),
	"task type a list": object.union(_base, {"task": {"type": ["customer_quote"]}}),
	"task type missing": json.remove(_base, ["task/type"]),
	"task not an object": object.union(_base, {"task": "customer_quote"}),
	"task missing": json.remove(_base, ["task"]),
	"needs some": object.union(_base, {"task": {"needs": ["contact.read", "ghost", "payment.execute", 7]}}),
	"needs empty": object.union(_base, {"task": {"needs": []}}),
	"needs a string": object.union(_base, {"task": {"needs": "contact.read"}}),
	"needs an object": object.union(_base, {"task": {"needs": {"contact.read": true}}}),
	"needs false": object.union(_base, {"task": {"needs": false}}),
	"needs missing": json.remove(_base, ["task/needs"]),
	"connections in every state": object.union(_base, {"connections": {
		"crm": "disabled",
		"sales_mailbox": "revoked",
		"bank": "pending",
		"legacy": null,
	}}),
	"connections null and false": object.union(_base, {"connections": {
		"crm": null,
		"sales_mailbox": false,
		"legacy": "disabled",
	}}),
	"connection status not a string": object.union(_base, {"connections": {
		"crm": {"status": "active"},
		"legacy": ["disabled"],
	}}),
	"connections empty": object.union(json.remove(_base, ["connections"]), {"connections": {}}),
	"connections a list": object.union(_base, {"connections": ["crm", "sales_mailbox"]}),
	"connections missing": json.remove(_base, ["connections"]),
	"environment staging": object.union(_base, {"environment": "staging"}),
	"environment unknown": object.union(_base, {"environment": "dev"}),
	"environment a number": object.union(_base, {"environment": 1}),
	"environment missing": json.remove(_base, ["environment"]),
	"budget frugal": object.union(_base, {"budget_class": "frugal"}),
	"budget unknown": object.union(_base, {"budget_class": "gold"}),
	"budget admits a list": object.union(_base, {"budget_class": "broken"}),
	"budget admits not true": object.union(_base, {"budget_class": "loose"}),
	"budget a list": object.union(_base, {"budget_class": ["standard"]}),
	"budget missing": json.remove(_base, ["budget_class"]),
	"quarantined some": object.union(_base, {"quarantined": ["quote.prepare_send", "ghost", "broken"]}),
	"quarantined all": object.union(_base, {"quarantined": object.keys(fixtures_test.catalogue.tools)}),
	"quarantined with non-names": object.union(_base, {"quarantined": [7, null, ["contact.read"], "alias.list"]}),
	"quarantined empty": object.union(_base, {"quarantined": []}),
	"quarantined null": object.union(_base, {"quarantined": null}),
	"quarantined a string": object.union(_base, {"quarantined": "contact.read"}),
	"quarantined an object": object.union(_base, {"quarantined": {"contact.read": true}}),
	"quarantined and role undeclared": object.union(_base, {
		"principal": {"role": "admin"},
		"quarantined": ["contact.read"],
	}),
	"empty input": {},
	"input a string": "sales",
	"input a list": ["sales"],
}
