package capgate.provenance_test

import data.capgate.compose
import data.capgate.execute
import data.capgate.fixtures_test
import data.capgate.provenance
import data.capgate.review

test_allow_catalogue_digest_is_read_from_data if {
	provenance.catalogue_digest == fixtures_test.digest with data.capgate.catalogue as fixtures_test.catalogue
}

test_deny_catalogue_digest_missing_or_malformed_is_null if {
	metas := [null, {}, {"digest": ""}, {"digest": 7}, {"digest": ["sha256:0"]}, "sha256:0"]
	every meta in metas {
		# json.patch replaces meta whole; object.union would merge {} into it.
		catalogue := json.patch(fixtures_test.catalogue, [{"op": "replace", "path": "/meta", "value": meta}])
		provenance.catalogue_digest == null with data.capgate.catalogue as catalogue
	}
}

# Every decision carries the digest of the catalogue it was made under, whatever the
# input, so the client can check every single one.
test_allow_every_decision_carries_the_catalogue_digest if {
	inputs := [fixtures_test.execute_input, fixtures_test.review_input, {}, "not an object"]
	every facts in inputs {
		composed := compose.decision with input as facts with data.capgate.catalogue as fixtures_test.catalogue
		composed.catalogue_digest == fixtures_test.digest
		executed := execute.decision with input as facts
			with data.capgate.catalogue as fixtures_test.catalogue
			with time.now_ns as fixtures_test.now_ns
		executed.catalogue_digest == fixtures_test.digest
		reviewed := review.decision with input as facts with data.capgate.catalogue as fixtures_test.catalogue
		reviewed.catalogue_digest == fixtures_test.digest
	}
}

test_allow_the_digest_follows_the_catalogue_served if {
	other := object.union(fixtures_test.catalogue, {"meta": {"digest": fixtures_test.other_digest}})
	composed := compose.decision with input as fixtures_test.compose_input with data.capgate.catalogue as other
	composed.catalogue_digest == fixtures_test.other_digest
	executed := execute.decision with input as fixtures_test.execute_input
		with data.capgate.catalogue as other
		with time.now_ns as fixtures_test.now_ns
	executed.catalogue_digest == fixtures_test.other_digest
	reviewed := review.decision with input as fixtures_test.review_input with data.capgate.catalogue as other
	reviewed.catalogue_digest == fixtures_test.other_digest
}

test_deny_review_without_catalogue_has_null_digest if {
	decision := review.decision with input as fixtures_test.review_input with data.capgate.catalogue as {}
	decision.catalogue_digest == null
	decision.allow == false
}
