# Evidence with a subject and an expiry (issue 21): a requirement about the call's
# subject or one of its values is met only by an unexpired piece of that name about
# exactly that; a requirement about anything by a name that never expires or any
# unexpired piece of it. The baseline is fixtures_test's bound quote dispatch.
package capgate.execute_test

import data.capgate.execute
import data.capgate.explain
import data.capgate.fixtures_test

_soon := "2026-11-30T12:00:00Z"

_gone := "2026-11-30T10:59:59Z"

_piece(name, subject, expires_at) := {"name": name, "subject": subject, "expires_at": expires_at}

_quote_revision := _piece("current_quote_revision", fixtures_test.opportunity, null)

_with_pieces(pieces) := object.union(fixtures_test.bound_input, {"evidence_about": pieces})

_evidence_codes(reasons) := {reason.code | some reason in reasons}

# The missing names of a decision's evidence check, as explain reports them.
_missing(checks) := check.facts.missing if {
	some check in checks
	check.check == "evidence"
}

# Each row: the input (bound_input changed) and the evidence names the call lacks.
_evidence_rows := {
	"both pieces, about the recipient and the opportunity": {"input": fixtures_test.bound_input, "missing": []},
	"verified for another address": {
		"input": _with_pieces([
			_piece("verified_recipient", fixtures_test.other_recipient, _soon),
			_quote_revision,
		]),
		"missing": ["verified_recipient"],
	},
	"verified for this address and another": {
		"input": _with_pieces([
			_piece("verified_recipient", fixtures_test.other_recipient, _soon),
			_piece("verified_recipient", fixtures_test.recipient, null),
			_quote_revision,
		]),
		"missing": [],
	},
	"verified, but expired": {
		"input": _with_pieces([_piece("verified_recipient", fixtures_test.recipient, _gone), _quote_revision]),
		"missing": ["verified_recipient"],
	},
	"verified, expiry not a time": {
		"input": _with_pieces([_piece("verified_recipient", fixtures_test.recipient, "tomorrow"), _quote_revision]),
		"missing": ["verified_recipient"],
	},
	"verified, expiry missing": {
		"input": _with_pieces([
			{"name": "verified_recipient", "subject": fixtures_test.recipient},
			_quote_revision,
		]),
		"missing": ["verified_recipient"],
	},
	"verified about nothing in particular": {
		"input": _with_pieces([_piece("verified_recipient", null, null), _quote_revision]),
		"missing": ["verified_recipient"],
	},
	"the names alone, as before subjects": {
		"input": object.union(_with_pieces([]), {"evidence": ["current_quote_revision", "verified_recipient"]}),
		"missing": ["current_quote_revision", "verified_recipient"],
	},
	"the digest, but typed as another kind": {
		"input": _with_pieces([
			_piece("verified_recipient", {"type": "value", "id": fixtures_test.digest}, null),
			_quote_revision,
		]),
		"missing": ["verified_recipient"],
	},
	"the quote revision of another opportunity": {
		"input": _with_pieces([
			_piece("verified_recipient", fixtures_test.recipient, _soon),
			_piece("current_quote_revision", {"type": "opportunity", "id": "opp-18"}, null),
		]),
		"missing": ["current_quote_revision"],
	},
	"the call names no recipient (a null value)": {
		"input": object.union(fixtures_test.bound_input, {"call": {"values": {"recipient_digest": null}}}),
		"missing": ["verified_recipient"],
	},
	"the call has no values": {
		"input": json.remove(fixtures_test.bound_input, ["call/values"]),
		"missing": ["verified_recipient"],
	},
	"the call has no subject": {
		"input": json.remove(fixtures_test.bound_input, ["call/subject"]),
		"missing": ["current_quote_revision"],
	},
	"evidence_about is not a list": {
		"input": object.union(fixtures_test.bound_input, {"evidence_about": "all of it"}),
		"missing": ["current_quote_revision", "verified_recipient"],
	},
	"a piece that is not an object": {
		"input": _with_pieces(["verified_recipient", _quote_revision]),
		"missing": ["verified_recipient"],
	},
}

test_evidence_about_rows if {
	got := {note: _missing(explained.checks) |
		some note, row in _evidence_rows
		explained := explain.execute with input as row.input
			with data.capgate.catalogue as fixtures_test.bound_catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	wrong := {note: missing | some note, missing in got; missing != _evidence_rows[note].missing}
	wrong == {}
	count(got) == count(_evidence_rows)
}

# The decision agrees with explain: evidence_missing exactly when a name is
# missing, and an allow when nothing is.
test_evidence_about_decisions if {
	got := {note: [denied, decision.allow] |
		some note, row in _evidence_rows
		decision := execute.decision with input as row.input
			with data.capgate.catalogue as fixtures_test.bound_catalogue
			with time.now_ns as fixtures_test.now_ns
		denied := "evidence_missing" in _evidence_codes(decision.reasons)
	}
	want := {note: [count(row.missing) > 0, count(row.missing) == 0] | some note, row in _evidence_rows}
	wrong := {note: answer | some note, answer in got; answer != want[note]}
	wrong == {}
}

# Requirements about anything (no requires_about): a name that never expires, or an
# unexpired piece of the name, whatever it is about.
test_evidence_about_anything_rows if {
	rows := {
		"the names": {"evidence": ["current_quote_revision", "verified_recipient"], "pieces": [], "missing": []},
		"unexpired pieces about anything": {
			"evidence": [],
			"pieces": [
				_piece("verified_recipient", fixtures_test.other_recipient, _soon),
				_piece("current_quote_revision", null, null),
			],
			"missing": [],
		},
		"an expired piece is not evidence": {
			"evidence": ["current_quote_revision"],
			"pieces": [_piece("verified_recipient", null, _gone)],
			"missing": ["verified_recipient"],
		},
		"neither": {"evidence": [], "pieces": [], "missing": ["current_quote_revision", "verified_recipient"]},
	}
	got := {note: _missing(explained.checks) |
		some note, row in rows
		explained := explain.execute with input as object.union(
			fixtures_test.execute_input,
			{"evidence": row.evidence, "evidence_about": row.pieces},
		)
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
	}
	wrong := {note: missing | some note, missing in got; missing != rows[note].missing}
	wrong == {}
	count(got) == count(rows)
}

test_deny_a_malformed_binding_is_never_met if {
	broken := object.union(fixtures_test.bound_catalogue, {"tools": {"quote.prepare_send": {"requires_about": {
		"verified_recipient": "recipient_digest",
		"current_quote_revision": {"about": "subject", "type": "opportunity"},
	}}}})
	decision := execute.decision with input as fixtures_test.bound_input
		with data.capgate.catalogue as broken
		with time.now_ns as fixtures_test.now_ns
	decision.allow == false
	decision.reasons == {{
		"code": "evidence_missing",
		"message": `tool "quote.prepare_send" requires evidence "verified_recipient", which the call does not bring`,
	}}
}

test_explain_reports_what_each_requirement_is_about if {
	explained := explain.execute with input as _with_pieces([_quote_revision])
		with data.capgate.catalogue as fixtures_test.bound_catalogue
		with time.now_ns as fixtures_test.now_ns
	some check in explained.checks
	check.check == "evidence"
	check.pass == false
	check.code == "evidence_missing"
	check.facts == {
		"required": ["current_quote_revision", "verified_recipient"],
		"about": {
			"verified_recipient": {"about": "recipient_digest", "type": "email_digest"},
			"current_quote_revision": {"about": "subject", "type": "opportunity"},
		},
		"missing": ["verified_recipient"],
	}
}
