# Contract versions kept for the proposals made under them (data.capgate.catalogue
# .retained): a dispatch is decided under the version it was proposed under while
# the catalogue keeps it, and new work never is. The baseline is fixtures_test's
# approved quote dispatch, proposed under version 1.
package capgate.execute_test

import data.capgate.execute
import data.capgate.explain
import data.capgate.fixtures_test

# Version 2 of the quote email asks for a third piece of evidence; version 1, kept
# for the proposals made under it, asks for the two the fixture's call carries.
_kept_v1 := fixtures_test.catalogue.tools["quote.prepare_send"]

_bumped_v2 := object.union(_kept_v1, {
	"version": 2,
	"requires": ["current_quote_revision", "verified_recipient", "legal_ok"],
})

_versions_bumped := object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": _bumped_v2}})

_versions_keeping := object.union(_versions_bumped, {"retained": {"quote.prepare_send": {"1": _kept_v1}}})

_versions_at(version) := object.union(fixtures_test.execute_input, {"call": {"version": version}})

# Decided under today's contract: its version, and its new requirement, fail.
_under_today := {"version_mismatch", "evidence_missing"}

_version_rows := {
	"a proposal dispatches under the version it was proposed under": {
		"facts": fixtures_test.execute_input, "catalogue": _versions_keeping,
		"codes": set(),
	},
	"the same proposal once its version is not kept": {
		"facts": fixtures_test.execute_input, "catalogue": _versions_bumped,
		"codes": _under_today,
	},
	"a proposal made under today's version, under today's rules": {
		"facts": _versions_at(2), "catalogue": _versions_keeping,
		"codes": {"evidence_missing"},
	},
	"new work proposed under a kept version": {
		"facts": fixtures_test.propose_input, "catalogue": _versions_keeping,
		"codes": _under_today,
	},
	"a kept entry that is not a contract": {
		"facts": fixtures_test.execute_input,
		"catalogue": object.union(_versions_bumped, {"retained": {"quote.prepare_send": {"1": "v1"}}}),
		"codes": _under_today,
	},
	"a version never served": {"facts": _versions_at(7), "catalogue": _versions_keeping, "codes": _under_today},
	"version 0": {"facts": _versions_at(0), "catalogue": _versions_keeping, "codes": _under_today},
	"a version as a string": {"facts": _versions_at("1"), "catalogue": _versions_keeping, "codes": _under_today},
	# 1.5 reads kept version 1, whose version check denies it all the same.
	"a fractional version": {
		"facts": _versions_at(1.5), "catalogue": _versions_keeping,
		"codes": {"version_mismatch"},
	},
}

test_allow_only_a_dispatch_under_a_kept_version if {
	got := {note: fixtures_test.codes(decision.reasons) |
		some note, row in _version_rows
		decision := execute.decision with input as row.facts
			with data.capgate.catalogue as row.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	want := {note: row.codes | some note, row in _version_rows}
	_failed_rows("_version_rows (execute_versions_test.rego)", got, want) == {}
}

test_deny_a_call_stage_never_reads_a_kept_version if {
	facts := object.union(fixtures_test.execute_input, {"stage": "call"})
	decision := execute.decision with input as facts
		with data.capgate.catalogue as _versions_keeping
		with time.now_ns as fixtures_test.now_ns
	"version_mismatch" in fixtures_test.codes(decision.reasons)
}

test_allow_explain_names_the_version_that_decided if {
	answer := explain.execute with input as fixtures_test.execute_input
		with data.capgate.catalogue as _versions_keeping
		with time.now_ns as fixtures_test.now_ns
	[check] := [c | some c in answer.checks; c.check == "version"]
	check.pass
	check.facts == {"call_version": 1, "contract_version": 1}
}
