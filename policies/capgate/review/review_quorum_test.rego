package capgate.review_test

import data.capgate.fixtures_test
import data.capgate.review

# A quorum of two above 10,000.00: the decision says how many must approve, from the
# proposal's values, and whether this verdict completes them (capgate.quorum holds
# every case of the count itself).
_two_above_rule := {"approvals": 2, "value": "amount_cents", "above": 1000000}

_two_above := object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": {"quorum": [_two_above_rule]}}})

_small := object.union(fixtures_test.review_input, {"proposal": {"values": {"amount_cents": 5}}})

_large := object.union(_small, {"proposal": {"values": {"amount_cents": 1000001}}})

_standing(facts, people) := object.union(facts, {"proposal": {"approvers": people}})

# An agent reviewer acting for the baseline's reviewer (maria).
_assistant := object.union(_large, {"reviewer": {"id": "maria-assistant", "kind": "agent", "acts_for": "maria"}})

# Each case: the review input, and the quorum part of its decision under the
# two-above catalogue.
_quorum_cases := {
	"below the threshold, one approval does": {"input": _small, "want": [1, true]},
	"above it, one approval is short": {"input": _large, "want": [2, false]},
	"a second distinct approver meets it": {"input": _standing(_large, ["omar"]), "want": [2, true]},
	"more than enough meets it": {"input": _standing(_large, ["omar", "li"]), "want": [2, true]},
	# The same person approving again, in whatever case, is one approval.
	"the reviewer's own standing approval": {"input": _standing(_large, ["maria"]), "want": [2, false]},
	"the same in upper case": {"input": _standing(_large, ["MARIA", "maria"]), "want": [2, false]},
	# An agent reviewer counts as the person it acts for.
	"an assistant after its person": {"input": _standing(_assistant, ["Maria"]), "want": [2, false]},
	"an assistant after another person": {"input": _standing(_assistant, ["omar"]), "want": [2, true]},
	# A rejection never approves, whatever stood before.
	"a rejection": {"input": object.union(_standing(_large, ["omar"]), {"verdict": "rejected"}), "want": [2, false]},
	"a rejection below the threshold": {"input": object.union(_small, {"verdict": "rejected"}), "want": [1, false]},
	# Standing approvers that are not names are not people.
	"approvers that are not names": {"input": _standing(_large, [null, 7, {"by": "omar"}]), "want": [2, false]},
	"approvers that are not a list": {"input": _standing(_large, "omar"), "want": [2, false]},
}

test_quorum_matrix if {
	got := {note: [decision.approvals_required, decision.quorum_met] |
		some note, case in _quorum_cases
		decision := review.decision with input as case.input with data.capgate.catalogue as _two_above
	}
	want := {note: case.want | some note, case in _quorum_cases}
	_failed_rows("_quorum_cases (review_quorum_test.rego)", got, want) == {}
}
