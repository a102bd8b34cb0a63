# A proposal is reviewed under the contract version it was proposed under while the
# catalogue keeps it (data.capgate.catalogue.retained), else under today's.
package capgate.review_test

import data.capgate.fixtures_test
import data.capgate.review

# Version 2 of the quote email is reviewed by controllers; version 1 was reviewed by
# sales managers, as the fixture's reviewer is.
_review_v1 := fixtures_test.catalogue.tools["quote.prepare_send"]

_review_bumped := object.union(fixtures_test.catalogue, {"tools": {"quote.prepare_send": object.union(
	_review_v1,
	{"version": 2, "reviewers": {"controller": true, "sales_manager": false}},
)}})

_review_keeping := object.union(_review_bumped, {"retained": {"quote.prepare_send": {"1": _review_v1}}})

_review_at(version) := object.union(fixtures_test.review_input, {"proposal": {"version": version}})

test_allow_a_proposal_is_reviewed_under_its_kept_version if {
	decision := review.decision with input as _review_at(1) with data.capgate.catalogue as _review_keeping
	fixtures_test.review_summary(decision) == {"allow": true, "codes": set()}
}

test_deny_under_todays_contract_once_its_version_is_not_kept if {
	decision := review.decision with input as _review_at(1) with data.capgate.catalogue as _review_bumped
	fixtures_test.review_summary(decision) == {"allow": false, "codes": {"reviewer_not_permitted"}}
}

test_deny_a_proposal_of_todays_version_by_todays_reviewers_only if {
	decision := review.decision with input as _review_at(2) with data.capgate.catalogue as _review_keeping
	fixtures_test.review_summary(decision) == {"allow": false, "codes": {"reviewer_not_permitted"}}
}

test_deny_a_version_the_catalogue_neither_has_nor_keeps_reads_today if every version in [5, "1", null] {
	facts := _review_at(version)
	decision := review.decision with input as facts with data.capgate.catalogue as _review_keeping
	decision.allow == false
}
