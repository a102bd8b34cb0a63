package capgate.review_test

import data.capgate.fixtures_test
import data.capgate.review

# The baseline: a sales manager approving the quote a sales agent proposed.
test_allow_sales_manager_approves_the_quote if {
	decision := review.decision with input as fixtures_test.review_input
		with data.capgate.catalogue as fixtures_test.catalogue
	want := {
		"allow": true, "reasons": set(), "approvals_required": 1, "quorum_met": true,
		"catalogue_digest": fixtures_test.digest,
	}
	decision == want
}

# A case's input: the baseline with its patch merged in and its removals taken out.
_facts(case) := json.remove(
	object.union(fixtures_test.review_input, object.get(case, "patch", {})),
	object.get(case, "remove", []),
)

# A case's catalogue: the fixture with the case's JSON patch applied.
_catalogue(case) := json.patch(fixtures_test.catalogue, object.get(case, "catalogue", []))

test_allow_matrix if {
	got := {note: fixtures_test.review_summary(decision) |
		some note, case in _allow_cases
		decision := review.decision with input as _facts(case) with data.capgate.catalogue as _catalogue(case)
	}
	want := {note: {"allow": true, "codes": set()} | some note, _ in _allow_cases}
	_failed_rows("_allow_cases (review_test.rego)", got, want) == {}
}

# A payment proposed by a finance agent, reviewed by a controller.
_payment := {
	"reviewer": {"id": "carl", "role": "controller"},
	"proposal": {"tool": "payment.execute", "proposer": {"agent": "finance-bot", "role": "finance"}},
}

_allow_cases := {
	"approval": {},
	"rejection, which needs the same permission": {"patch": {"verdict": "rejected"}},
	"an agent reviewer acting for another person than the proposer's": {"patch": {
		"reviewer": {"id": "maria-assistant", "kind": "agent", "acts_for": "maria"},
		"proposal": {"proposer": {"acts_for": "bob"}},
	}},
	"an operator at the command line": {"patch": {"reviewer": {"kind": "operator", "authenticated_by": "os-user:maria"}}},
	"a controller approves a payment": {"patch": _payment},
	"a controller rejects a payment": {"patch": object.union(_payment, {"verdict": "rejected"})},
	"one of several reviewer roles": {
		"patch": {"reviewer": {"role": "controller"}},
		"catalogue": [{"op": "add", "path": "/tools/quote.prepare_send/reviewers/controller", "value": true}],
	},
	"a role that approves several kinds": {"catalogue": [{
		"op": "add",
		"path": "/roles/sales_manager/approves/content_only",
		"value": true,
	}]},
	"the reviewer named like the proposer's role": {"patch": {"reviewer": {"id": "sales"}}},
}

# One fact changed per case; each case asserts the exact set of codes.
test_deny_matrix if {
	got := {note: fixtures_test.review_summary(decision) |
		some note, case in _deny_cases
		decision := review.decision with input as _facts(case) with data.capgate.catalogue as _catalogue(case)
	}
	want := {note: {"allow": false, "codes": case.codes} | some note, case in _deny_cases}
	_failed_rows("_deny_cases (review_test.rego)", got, want) == {}
}

_deny_cases := {
	# unknown_tool, alone.
	"tool not in the catalogue": {
		"patch": {"proposal": {"tool": "quote.delete"}},
		"codes": {"unknown_tool"},
	},
	"tool not a string": {
		"patch": {"proposal": {"tool": 7}},
		"codes": {"unknown_tool"},
	},
	"tool missing": {
		"remove": ["proposal/tool"],
		"codes": {"unknown_tool"},
	},
	"proposal missing": {
		"remove": ["proposal"],
		"codes": {"unknown_tool"},
	},
	"unknown tool with everything else wrong": {
		"patch": {
			"reviewer": {"id": "sales-bot", "role": "admin", "tenant": "globex"},
			"proposal": {"tool": "ghost", "status": "approved"},
			"verdict": "maybe",
		},
		"codes": {"unknown_tool"},
	},
	"tool entry not an object": {
		"catalogue": [{"op": "replace", "path": "/tools/quote.prepare_send", "value": "contract"}],
		"codes": {"unknown_tool"},
	},
	# reviewer_not_permitted
	"a role the tool does not name as reviewer": {
		"patch": {"reviewer": {"role": "controller"}},
		"codes": {"reviewer_not_permitted"},
	},
	"the proposer's own role": {
		"patch": {"reviewer": {"role": "sales"}},
		"codes": {"reviewer_not_permitted"},
	},
	"a role the catalogue does not declare": {
		"patch": {"reviewer": {"role": "admin"}},
		"codes": {"reviewer_not_permitted"},
	},
	"a listed role the catalogue does not declare": {
		"patch": {"reviewer": {"role": "ghost"}},
		"catalogue": [{"op": "add", "path": "/tools/quote.prepare_send/reviewers/ghost", "value": true}],
		"codes": {"reviewer_not_permitted"},
	},
	"a listed role declared as null": {
		"catalogue": [{"op": "replace", "path": "/roles/sales_manager", "value": null}],
		"codes": {"reviewer_not_permitted"},
	},
	"a listed role that approves nothing": {
		"catalogue": [{"op": "replace", "path": "/roles/sales_manager/approves", "value": {}}],
		"codes": {"reviewer_not_permitted"},
	},
	"a listed role that approves another kind": {
		"catalogue": [{"op": "replace", "path": "/roles/sales_manager/approves", "value": {"content_only": true}}],
		"codes": {"reviewer_not_permitted"},
	},
	"a listed role without approves": {
		"catalogue": [{"op": "remove", "path": "/roles/sales_manager/approves"}],
		"codes": {"reviewer_not_permitted"},
	},
	"approves not exactly true": {
		"catalogue": [{"op": "replace", "path": "/roles/sales_manager/approves/exact_content_and_recipient", "value": "yes"}],
		"codes": {"reviewer_not_permitted"},
	},
	"approves a list": {
		"catalogue": [{"op": "replace", "path": "/roles/sales_manager/approves", "value": ["exact_content_and_recipient"]}],
		"codes": {"reviewer_not_permitted"},
	},
	"reviewers entry not exactly true": {
		"catalogue": [{"op": "replace", "path": "/tools/quote.prepare_send/reviewers/sales_manager", "value": "yes"}],
		"codes": {"reviewer_not_permitted"},
	},
	"reviewers a list": {
		"catalogue": [{"op": "replace", "path": "/tools/quote.prepare_send/reviewers", "value": ["sales_manager"]}],
		"codes": {"reviewer_not_permitted"},
	},
	"reviewers missing": {
		"catalogue": [{"op": "remove", "path": "/tools/quote.prepare_send/reviewers"}],
		"codes": {"reviewer_not_permitted"},
	},
	"tool approval missing": {
		"catalogue": [{"op": "remove", "path": "/tools/quote.prepare_send/approval"}],
		"codes": {"reviewer_not_permitted"},
	},
	"roles section missing": {
		"catalogue": [{"op": "remove", "path": "/roles"}],
		"codes": {"reviewer_not_permitted"},
	},
	"role not a string": {
		"patch": {"reviewer": {"role": ["sales_manager"]}},
		"codes": {"reviewer_not_permitted"},
	},
	"role a number indexing a list": {
		"patch": {"reviewer": {"role": 0}},
		"catalogue": [
			{"op": "replace", "path": "/tools/quote.prepare_send/reviewers", "value": [true]},
			{"op": "add", "path": "/roles/0", "value": {"approves": {"exact_content_and_recipient": true}}},
		],
		"codes": {"reviewer_not_permitted"},
	},
	"role missing": {
		"remove": ["reviewer/role"],
		"codes": {"reviewer_not_permitted"},
	},
	# self_review
	"the proposer reviews its own proposal": {
		"patch": {"reviewer": {"id": "sales-bot"}},
		"codes": {"self_review"},
	},
	"the proposer reviews from another tenant": {
		"patch": {"reviewer": {"id": "sales-bot", "tenant": "globex"}},
		"codes": {"self_review", "tenant_mismatch"},
	},
	"reviewer id missing": {
		"remove": ["reviewer/id"],
		"codes": {"self_review"},
	},
	"reviewer id empty": {
		"patch": {"reviewer": {"id": ""}},
		"codes": {"self_review"},
	},
	"reviewer id a number": {
		"patch": {"reviewer": {"id": 7}},
		"codes": {"self_review"},
	},
	"proposer agent missing": {
		"remove": ["proposal/proposer/agent"],
		"codes": {"self_review"},
	},
	"proposer missing": {
		"remove": ["proposal/proposer"],
		"codes": {"self_review"},
	},
	"proposer not an object": {
		"patch": {"proposal": {"proposer": "sales-bot"}},
		"codes": {"self_review"},
	},
	"both agents empty": {
		"patch": {"reviewer": {"id": ""}, "proposal": {"proposer": {"agent": ""}}},
		"codes": {"self_review"},
	},
	"the proposer under its name in capitals": {
		"patch": {"reviewer": {"id": "Sales-Bot", "display_name": "Sales Robot"}},
		"codes": {"self_review"},
	},
	"the person the proposing agent acts for": {
		"patch": {"reviewer": {"id": "ada"}, "proposal": {"proposer": {"acts_for": "ada"}}},
		"codes": {"self_review"},
	},
	"the person the proposing agent acts for, in other case": {
		"patch": {"reviewer": {"id": "ADA"}, "proposal": {"proposer": {"acts_for": "ada"}}},
		"codes": {"self_review"},
	},
	"an agent acting for the same person as the proposer": {
		"patch": {
			"reviewer": {"id": "ada-helper", "kind": "agent", "acts_for": "ada"},
			"proposal": {"proposer": {"acts_for": "ada"}},
		},
		"codes": {"self_review"},
	},
	"an agent acting for the proposing agent itself": {
		"patch": {"reviewer": {"id": "helper", "kind": "agent", "acts_for": "sales-bot"}},
		"codes": {"self_review"},
	},
	# reviewer_unauthenticated
	"no record of authentication": {
		"remove": ["reviewer/authenticated_by"],
		"codes": {"reviewer_unauthenticated"},
	},
	"authentication empty": {
		"patch": {"reviewer": {"authenticated_by": ""}},
		"codes": {"reviewer_unauthenticated"},
	},
	"authentication not a string": {
		"patch": {"reviewer": {"authenticated_by": true}},
		"codes": {"reviewer_unauthenticated"},
	},
	# tenant_mismatch
	"a reviewer of another tenant": {
		"patch": {"reviewer": {"tenant": "globex"}},
		"codes": {"tenant_mismatch"},
	},
	"reviewer tenant missing": {
		"remove": ["reviewer/tenant"],
		"codes": {"tenant_mismatch"},
	},
	"proposal tenant missing": {
		"remove": ["proposal/tenant"],
		"codes": {"tenant_mismatch"},
	},
	"both tenants missing": {
		"remove": ["reviewer/tenant", "proposal/tenant"],
		"codes": {"tenant_mismatch"},
	},
	"both tenants empty": {
		"patch": {"reviewer": {"tenant": ""}, "proposal": {"tenant": ""}},
		"codes": {"tenant_mismatch"},
	},
	"both tenants null": {
		"patch": {"reviewer": {"tenant": null}, "proposal": {"tenant": null}},
		"codes": {"tenant_mismatch"},
	},
	# proposal_not_pending
	"proposal approved already": {
		"patch": {"proposal": {"status": "approved"}},
		"codes": {"proposal_not_pending"},
	},
	"proposal rejected already": {
		"patch": {"proposal": {"status": "rejected"}},
		"codes": {"proposal_not_pending"},
	},
	"proposal dispatched": {
		"patch": {"proposal": {"status": "dispatched"}},
		"codes": {"proposal_not_pending"},
	},
	"proposal blocked": {
		"patch": {"proposal": {"status": "blocked"}},
		"codes": {"proposal_not_pending"},
	},
	"status in capitals": {
		"patch": {"proposal": {"status": "PENDING"}},
		"codes": {"proposal_not_pending"},
	},
	"status null": {
		"patch": {"proposal": {"status": null}},
		"codes": {"proposal_not_pending"},
	},
	"status missing": {
		"remove": ["proposal/status"],
		"codes": {"proposal_not_pending"},
	},
	# verdict_invalid
	"verdict approve": {
		"patch": {"verdict": "approve"},
		"codes": {"verdict_invalid"},
	},
	"verdict in capitals": {
		"patch": {"verdict": "APPROVED"},
		"codes": {"verdict_invalid"},
	},
	"verdict true": {
		"patch": {"verdict": true},
		"codes": {"verdict_invalid"},
	},
	"verdict a list": {
		"patch": {"verdict": ["approved"]},
		"codes": {"verdict_invalid"},
	},
	"verdict null": {
		"patch": {"verdict": null},
		"codes": {"verdict_invalid"},
	},
	"verdict missing": {
		"remove": ["verdict"],
		"codes": {"verdict_invalid"},
	},
	# Several at once.
	"reviewer not an object": {
		"patch": {"reviewer": "maria"},
		"codes": {"reviewer_not_permitted", "reviewer_unauthenticated", "self_review", "tenant_mismatch"},
	},
	"reviewer missing": {
		"remove": ["reviewer"],
		"codes": {"reviewer_not_permitted", "reviewer_unauthenticated", "self_review", "tenant_mismatch"},
	},
	"everything wrong at once": {
		"patch": {
			"reviewer": {"id": "sales-bot", "role": "sales", "tenant": "globex"},
			"proposal": {"status": "dispatched"},
			"verdict": "ok",
		},
		"codes": {
			"reviewer_not_permitted",
			"self_review",
			"tenant_mismatch",
			"proposal_not_pending",
			"verdict_invalid",
		},
	},
}

test_deny_matrix_covers_every_code if {
	covered := union({case.codes | some case in _deny_cases})
	covered == {
		"unknown_tool",
		"reviewer_not_permitted",
		"reviewer_unauthenticated",
		"self_review",
		"tenant_mismatch",
		"proposal_not_pending",
		"verdict_invalid",
	}
}

_decision_keys := {"allow", "reasons", "approvals_required", "quorum_met", "catalogue_digest"}

# Whatever the input or the catalogue, the decision is a complete object; a deny
# carries at least one reason, each with a code and a message.
test_deny_malformed_input_is_a_complete_deny if {
	inputs := [{}, "approve pr-17", ["maria"], null, {"proposal": "pr-17"}, {"proposal": {"tool": null}}]
	every facts in inputs {
		decision := review.decision with input as facts with data.capgate.catalogue as fixtures_test.catalogue
		object.keys(decision) == _decision_keys
		decision.catalogue_digest == fixtures_test.digest
		fixtures_test.review_summary(decision) == {"allow": false, "codes": {"unknown_tool"}}
	}
	every case in _deny_cases {
		decision := review.decision with input as _facts(case) with data.capgate.catalogue as _catalogue(case)
		object.keys(decision) == _decision_keys
		decision.allow == false
		count(decision.reasons) > 0
		every reason in decision.reasons {
			object.keys(reason) == {"code", "message"}
			is_string(reason.message)
		}
	}
}

# Without a usable catalogue every proposal is for an unknown tool.
test_deny_catalogue_missing_or_malformed if {
	catalogues := [{}, "catalogue", {"tools": []}, {"tools": {"quote.prepare_send": null}}]
	every catalogue in catalogues {
		decision := review.decision with input as fixtures_test.review_input with data.capgate.catalogue as catalogue
		fixtures_test.review_summary(decision) == {"allow": false, "codes": {"unknown_tool"}}
	}
}

# Each message names the facts involved; reviewer_not_permitted says which of its
# conditions failed first: the role undeclared, not a reviewer, or not approving.
test_deny_messages_name_the_facts if {
	got := {note: decision.reasons |
		some note, case in _messages
		decision := review.decision with input as _facts(case) with data.capgate.catalogue as _catalogue(case)
	}
	want := {note: {{"code": case.code, "message": case.message}} | some note, case in _messages}
	_failed_rows("_messages (review_test.rego)", got, want) == {}
}

_messages := {
	"role undeclared": {
		"patch": {"reviewer": {"role": "admin"}},
		"code": "reviewer_not_permitted",
		"message": `the reviewer's role "admin" is not declared in the catalogue`,
	},
	"role not a reviewer": {
		"patch": {"reviewer": {"role": "controller"}},
		"code": "reviewer_not_permitted",
		"message": `role "controller" is not among the reviewers of tool "quote.prepare_send"`,
	},
	"role not approving": {
		"catalogue": [{"op": "replace", "path": "/roles/sales_manager/approves", "value": {}}],
		"code": "reviewer_not_permitted",
		"message": concat("", [
			`role "sales_manager" does not approve "exact_content_and_recipient", `,
			`the approval tool "quote.prepare_send" needs`,
		]),
	},
	"self review": {
		"patch": {"reviewer": {"id": "sales-bot"}},
		"code": "self_review",
		"message": concat("", [
			`reviewer "sales-bot" may not review "pr-17": it is, or acts for the same person as, `,
			`its proposer "sales-bot" (acting for: reviewer null, proposer null)`,
		]),
	},
	"proposer unnamed": {
		"remove": ["proposal/proposer"],
		"code": "self_review",
		"message": `the reviewer "maria" or the proposer null is not named, so the review may be a self-review`,
	},
	"tenant": {
		"patch": {"reviewer": {"tenant": "globex"}},
		"code": "tenant_mismatch",
		"message": `a reviewer of tenant "globex" may not review proposal "pr-17" of tenant "acme"`,
	},
	"status": {
		"patch": {"proposal": {"status": "approved"}},
		"code": "proposal_not_pending",
		"message": `proposal "pr-17" has status "approved", and only a "pending" proposal is reviewed`,
	},
	"verdict": {
		"patch": {"verdict": "approve"},
		"code": "verdict_invalid",
		"message": `the verdict "approve" is neither "approved" nor "rejected"`,
	},
	"unknown tool": {
		"patch": {"proposal": {"tool": "ghost"}},
		"code": "unknown_tool",
		"message": `proposal "pr-17" is for tool "ghost", which is not in the catalogue`,
	},
}

# allow needs both layers: no failing check and an empty set of reasons. Each
# layer alone must deny, so a reason that failed to render never becomes an allow.
test_deny_failing_checks_deny_without_reasons if {
	allowed := {note |
		some note, case in _deny_cases
		review.allow with input as _facts(case)
			with data.capgate.catalogue as _catalogue(case)
			with review.reasons as set()
	}
	allowed == set()
}

test_deny_any_reason_blocks_allow if {
	decision := review.decision with input as fixtures_test.review_input
		with data.capgate.catalogue as fixtures_test.catalogue
		with review.reasons as {{"code": "anything", "message": "a reason from elsewhere"}}
	decision.allow == false
}
