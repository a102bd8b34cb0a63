# METADATA
# title: Review
# description: |
#   May this person give this verdict on this proposal? A proposal is reviewed by
#   someone in a role the tool names among its reviewers and that approves the
#   tool's kind of approval, of the proposal's tenant, who did not propose it, while
#   it is pending. A rejection needs the same permission as an approval. Query
#   data.capgate.review.decision.
# custom:
#   reason_codes:
#     - unknown_tool
#     - reviewer_not_permitted
#     - self_review
#     - tenant_mismatch
#     - proposal_not_pending
#     - verdict_invalid
package capgate.review

import data.capgate.provenance

# METADATA
# title: Review decision
# description: |
#   {"allow": bool, "reasons": [{"code", "message"}, ...], "catalogue_digest": digest}.
#   Always defined, whatever the input: anything missing or malformed is a deny with
#   the reason of the check that reads it. unknown_tool stands alone, as in execute.
#   catalogue_digest is the digest of the catalogue the decision was made under
#   (capgate.provenance), which the client checks.
# entrypoint: true
# custom:
#   reason_codes:
#     - unknown_tool
#     - reviewer_not_permitted
#     - self_review
#     - tenant_mismatch
#     - proposal_not_pending
#     - verdict_invalid
decision := {
	"allow": allow,
	"reasons": reasons,
	"catalogue_digest": provenance.catalogue_digest,
}

default allow := false

# Every check is granted positively as well as having no reason against it, so a
# reason that failed to render can never turn into an allow.
allow if {
	_is_known_tool
	_is_reviewer_permitted
	_is_other_agent
	_is_same_tenant
	_is_pending
	_is_verdict_valid
	count(reasons) == 0
}

# Reasons. unknown_tool stands alone: nothing else is derived for a proposal whose
# tool the catalogue does not know.

reasons contains {"code": "unknown_tool", "message": message} if {
	not _is_known_tool
	message := sprintf("proposal %s is for tool %s, which is not in the catalogue", [_quote(_proposal_id), _quote(_name)])
}

reasons contains {"code": "reviewer_not_permitted", "message": _permission_message} if {
	_is_known_tool
	not _is_reviewer_permitted
}

reasons contains {"code": "self_review", "message": _self_review_message} if {
	_is_known_tool
	not _is_other_agent
}

reasons contains {"code": "tenant_mismatch", "message": message} if {
	_is_known_tool
	not _is_same_tenant
	message := sprintf("a reviewer of tenant %s may not review proposal %s of tenant %s", [
		_quote(object.get(_reviewer, "tenant", null)),
		_quote(_proposal_id),
		_quote(object.get(_proposal, "tenant", null)),
	])
}

reasons contains {"code": "proposal_not_pending", "message": message} if {
	_is_known_tool
	not _is_pending
	message := sprintf(`proposal %s has status %s, and only a "pending" proposal is reviewed`, [
		_quote(_proposal_id),
		_quote(object.get(_proposal, "status", null)),
	])
}

reasons contains {"code": "verdict_invalid", "message": message} if {
	_is_known_tool
	not _is_verdict_valid
	message := sprintf(`the verdict %s is neither "approved" nor "rejected"`, [_quote(_verdict)])
}

# The facts, normalised: a reviewer, proposal or proposer that is not an object is
# {}, so every check that reads it fails.

default _reviewer := {}

_reviewer := input.reviewer if is_object(input.reviewer)

default _proposal := {}

_proposal := input.proposal if is_object(input.proposal)

default _proposer := {}

_proposer := _proposal.proposer if is_object(_proposal.proposer)

_proposal_id := object.get(_proposal, "id", null)

_name := object.get(_proposal, "tool", null)

default _verdict := null

_verdict := input.verdict

default _tools := {}

_tools := data.capgate.catalogue.tools if is_object(data.capgate.catalogue.tools)

_contract := _tools[_name] if is_object(_tools[_name])

_is_known_tool if is_object(_contract)

_quote(value) := json.marshal(value)

# reviewer_not_permitted: the tool names the reviewer's role among its reviewers
# ({role: true}), and the catalogue declares the role as approving the tool's kind
# of approval (roles[role].approves[kind] == true). Both names must be strings, so
# that neither can index into a list.

_role := object.get(_reviewer, "role", null)

_is_role_declared if {
	is_string(_role)
	is_object(data.capgate.catalogue.roles[_role])
}

_is_reviewer_listed if {
	is_string(_role)
	_contract.reviewers[_role] == true
}

_does_role_approve if {
	is_string(_role)
	is_string(_contract.approval)
	data.capgate.catalogue.roles[_role].approves[_contract.approval] == true
}

_is_reviewer_permitted if {
	_is_reviewer_listed
	_does_role_approve
}

_permission_message := sprintf("the reviewer's role %s is not declared in the catalogue", [_quote(_role)]) if {
	not _is_role_declared
} else := sprintf("role %s is not among the reviewers of tool %s", [_quote(_role), _quote(_name)]) if {
	not _is_reviewer_listed
} else := sprintf("role %s does not approve %s, the approval tool %s needs", [
	_quote(_role),
	_quote(object.get(_contract, "approval", null)),
	_quote(_name),
])

# self_review: the reviewer and the proposer are named, and are different agents,
# whatever their tenants.

_is_named(agent) if {
	is_string(agent)
	agent != ""
}

_is_other_agent if {
	_is_named(_reviewer.agent)
	_is_named(_proposer.agent)
	_reviewer.agent != _proposer.agent
}

_self_review_message := sprintf("agent %s proposed %s and may not review it", [
	_quote(_reviewer.agent),
	_quote(_proposal_id),
]) if {
	_is_named(_reviewer.agent)
	_reviewer.agent == _proposer.agent
} else := sprintf("the reviewer %s or the proposer %s is not named, so the review may be a self-review", [
	_quote(object.get(_reviewer, "agent", null)),
	_quote(object.get(_proposer, "agent", null)),
])

# tenant_mismatch

_is_same_tenant if {
	_is_named(_reviewer.tenant)
	_reviewer.tenant == _proposal.tenant
}

# proposal_not_pending

_is_pending if _proposal.status == "pending"

# verdict_invalid

_is_verdict_valid if _verdict in {"approved", "rejected"}
