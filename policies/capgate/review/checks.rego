# The review checks: each declared once and written once, here. A check is its
# declaration (an entry of the METADATA of declared: its title, the facts it reads,
# the code it gives with its title and message templates), the condition under
# which it fails (_failed), the facts its message names (_facts) and, when its code
# has several messages, which (_case). review.rego derives the allow and the
# reasons from these. Part of package capgate.review.
package capgate.review

# METADATA
# title: The review checks, declared
# description: |
#   The declaration of every check a review makes after the tool check
#   (capgate.reasons): the facts it reads and the code it gives, with the code's
#   title and message templates ({name} a fact, as compact JSON), by case when the
#   message says which condition failed.
# custom:
#   checks:
#     - check: reviewer
#       title: Reviewer
#       description: The reviewer's role is declared, reviews the tool and approves its kind of approval.
#       facts: [role, tool, approval]
#       codes:
#         reviewer_not_permitted:
#           title: Reviewer not permitted
#           messages:
#             undeclared: the reviewer's role {role} is not declared in the catalogue
#             unlisted: role {role} is not among the reviewers of tool {tool}
#             kind: role {role} does not approve {approval}, the approval tool {tool} needs
#     - check: authenticated
#       title: Authenticated
#       description: The reviewer is an identity a front authenticated, and says how.
#       facts: [reviewer, authenticated_by]
#       codes:
#         reviewer_unauthenticated:
#           title: Reviewer unauthenticated
#           message: >-
#             the reviewer {reviewer} comes with no record of how it was authenticated
#             ({authenticated_by}), so its verdict is not taken
#     - check: identity
#       title: Another identity
#       description: |
#         The reviewer and the proposer are named, and no identity is both: neither the
#         reviewer's id nor the person it acts for is the proposing agent or the person
#         that agent acts for, compared without regard to case, whatever the tenants
#         and display names.
#       facts: [reviewer, reviewer_acts_for, proposer, proposer_acts_for, proposal]
#       codes:
#         self_review:
#           title: Self-review
#           messages:
#             same: >-
#               reviewer {reviewer} may not review {proposal}: it is, or acts for the
#               same person as, its proposer {proposer} (acting for: reviewer
#               {reviewer_acts_for}, proposer {proposer_acts_for})
#             unnamed: >-
#               the reviewer {reviewer} or the proposer {proposer} is not named, so the
#               review may be a self-review
#     - check: tenant
#       title: Tenant
#       description: The reviewer is of the proposal's tenant.
#       facts: [reviewer_tenant, proposal, proposal_tenant]
#       codes:
#         tenant_mismatch:
#           title: Tenant mismatch
#           message: >-
#             a reviewer of tenant {reviewer_tenant} may not review proposal {proposal}
#             of tenant {proposal_tenant}
#     - check: pending
#       title: Pending
#       description: The proposal is pending.
#       facts: [proposal, status]
#       codes:
#         proposal_not_pending:
#           title: Proposal not pending
#           message: "proposal {proposal} has status {status}, and only a \"pending\" proposal is reviewed"
#     - check: verdict
#       title: Verdict
#       description: The verdict is "approved" or "rejected".
#       facts: [verdict]
#       codes:
#         verdict_invalid:
#           title: Verdict invalid
#           message: "the verdict {verdict} is neither \"approved\" nor \"rejected\""
declared := rego.metadata.rule().custom.checks

# Each check fails when it cannot be shown to pass.

_failed contains "reviewer" if not _is_reviewer_permitted

_facts["reviewer"] := {"role": _role, "tool": _name, "approval": object.get(_contract, "approval", null)}

default _case["reviewer"] := "kind"

_case["reviewer"] := "undeclared" if {
	not _is_role_declared
} else := "unlisted" if {
	not _is_reviewer_listed
}

_failed contains "authenticated" if not _is_authenticated

_facts["authenticated"] := {
	"reviewer": object.get(_reviewer, "id", null),
	"authenticated_by": object.get(_reviewer, "authenticated_by", null),
}

_failed contains "identity" if not _is_other_identity

_facts["identity"] := {
	"reviewer": object.get(_reviewer, "id", null),
	"reviewer_acts_for": object.get(_reviewer, "acts_for", null),
	"proposer": object.get(_proposer, "agent", null),
	"proposer_acts_for": object.get(_proposer, "acts_for", null),
	"proposal": _proposal_id,
}

default _case["identity"] := "unnamed"

_case["identity"] := "same" if {
	_is_named(_reviewer.id)
	_is_named(_proposer.agent)
	count(_reviewer_identities & _proposer_identities) > 0
}

_failed contains "tenant" if not _is_same_tenant

_facts["tenant"] := {
	"reviewer_tenant": object.get(_reviewer, "tenant", null),
	"proposal": _proposal_id,
	"proposal_tenant": object.get(_proposal, "tenant", null),
}

_failed contains "pending" if not _is_pending

_facts["pending"] := {"proposal": _proposal_id, "status": object.get(_proposal, "status", null)}

_failed contains "verdict" if not _is_verdict_valid

_facts["verdict"] := {"verdict": _verdict}

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

# A name is a non-empty string.
_is_named(name) if {
	is_string(name)
	name != ""
}

# self_review: the identities each side stands for (its id and the person it acts
# for, when named), lower-cased so that "Ada" and "ada" are one identity. Refusing
# a review that only looks like a self-review is the safe side.
_is_other_identity if {
	_is_named(_reviewer.id)
	_is_named(_proposer.agent)
	count(_reviewer_identities & _proposer_identities) == 0
}

_reviewer_identities := _identities([object.get(_reviewer, "id", null), object.get(_reviewer, "acts_for", null)])

_proposer_identities := _identities([object.get(_proposer, "agent", null), object.get(_proposer, "acts_for", null)])

_identities(names) := {lower(name) | some name in names; _is_named(name)}

# reviewer_unauthenticated: a front records how it established the identity.
_is_authenticated if _is_named(_reviewer.authenticated_by)

# tenant_mismatch

_is_same_tenant if {
	_is_named(_reviewer.tenant)
	_reviewer.tenant == _proposal.tenant
}

# proposal_not_pending

_is_pending if _proposal.status == "pending"

# verdict_invalid

_is_verdict_valid if _verdict in {"approved", "rejected"}
