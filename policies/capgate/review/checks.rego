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
#     - check: agent
#       title: Another agent
#       description: The reviewer and the proposer are named, and are different agents, whatever their tenants.
#       facts: [reviewer, proposer, proposal]
#       codes:
#         self_review:
#           title: Self-review
#           messages:
#             same: agent {reviewer} proposed {proposal} and may not review it
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

_failed contains "agent" if not _is_other_agent

_facts["agent"] := {
	"reviewer": object.get(_reviewer, "agent", null),
	"proposer": object.get(_proposer, "agent", null),
	"proposal": _proposal_id,
}

default _case["agent"] := "unnamed"

_case["agent"] := "same" if {
	_is_named(_reviewer.agent)
	_reviewer.agent == _proposer.agent
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

# tenant_mismatch

_is_same_tenant if {
	_is_named(_reviewer.tenant)
	_reviewer.tenant == _proposal.tenant
}

# proposal_not_pending

_is_pending if _proposal.status == "pending"

# verdict_invalid

_is_verdict_valid if _verdict in {"approved", "rejected"}
