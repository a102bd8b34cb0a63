# METADATA
# title: Review
# description: |
#   May this person give this verdict on this proposal? A proposal is reviewed by
#   someone in a role the tool names among its reviewers and that approves the
#   tool's kind of approval, of the proposal's tenant, who did not propose it, while
#   it is pending. A rejection needs the same permission as an approval. Query
#   data.capgate.review.decision. Its checks are declared, with their codes and
#   message templates, in declared.
# schemas:
#   - input: schema.review
package capgate.review

import data.capgate.provenance
import data.capgate.quorum
import data.capgate.reasons as rendering
import data.capgate.versions

# METADATA
# title: Review decision
# description: |
#   {"allow": bool, "reasons": [{"code", "message"}, ...], "approvals_required": n,
#   "quorum_met": bool, "catalogue_digest": digest}: n distinct reviewers must
#   approve the proposal, and quorum_met says whether they have once this verdict is
#   recorded (the gateway approves the proposal then, and keeps it pending before).
#   Always defined, whatever the input: anything missing or malformed is a deny with
#   the reason of the check that reads it. unknown_tool stands alone, as in execute.
#   catalogue_digest is the digest of the catalogue the decision was made under
#   (capgate.provenance), which the client checks.
# entrypoint: true
decision := {
	"allow": allow,
	"reasons": reasons,
	"approvals_required": _approvals_required,
	"quorum_met": _quorum_met,
	"catalogue_digest": provenance.catalogue_digest,
}

# How many distinct reviewers must approve the proposal (capgate.quorum): the
# gateway keeps it pending until then. One for a tool the catalogue lacks, which
# is denied anyway.
default _approvals_required := 1

_approvals_required := quorum.required(_contract, _proposal_values)

# Whether the people whose approval of the proposal stands, with this reviewer's
# when the verdict is an approval, are as many as the quorum asks (capgate.quorum,
# the count execute checks again at dispatch). False for a rejection, whatever
# stood before: a rejection never approves.
default _quorum_met := false

_quorum_met if {
	_verdict == "approved"
	quorum.met(_contract, _proposal_values, _approving_people)
}

# Who has approved, in lower case: each person the gateway lists as standing (it
# names the person an agent reviewer acts for), and the person this reviewer is.
_approving_people contains lower(person) if {
	some person in _proposal.approvers
	is_string(person)
}

_approving_people contains lower(_reviewer.acts_for) if is_string(_reviewer.acts_for)

_approving_people contains lower(_reviewer.id) if {
	not is_string(_reviewer.acts_for)
	is_string(_reviewer.id)
}

default _proposal_values := {}

_proposal_values := input.proposal.values if is_object(input.proposal.values)

# METADATA
# scope: document
# title: Allow
# description: |
#   True only when the catalogue knows the proposal's tool and no check fails. allow
#   and the reasons both come from the set of checks that fail (checks.rego), each
#   decided once; every reason blocks an allow, so one that failed to render never
#   turns into one.
default allow := false

allow if {
	_is_known_tool
	count(_failed) == 0
	count(reasons) == 0
}

# METADATA
# scope: document
# title: Reasons
# description: |
#   {"code", "message"} for every failing check: unknown_tool alone for a proposal
#   whose tool the catalogue does not know, else each failing check's code with its
#   declared message, for the check's case when it has several, filled with the
#   check's facts.
reasons contains {"code": "unknown_tool", "message": message} if {
	not _is_known_tool
	template := rendering.template(rendering.templates.unknown_tool, "proposal")
	message := rendering.message(template, {"tool": _name, "proposal": _proposal_id})
}

reasons contains {"code": code, "message": message} if {
	_is_known_tool
	some check in _failed
	some declaration in declared
	declaration.check == check
	some code, spec in declaration.codes
	message := rendering.message(rendering.template(spec, object.get(_case, check, null)), _facts[check])
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

# The contract the proposal was made under: a version the catalogue keeps for the
# proposals made under it (retained), else today's (whose dispatch then denies a
# proposal of another version as version_mismatch).
_contract := versions.kept(data.capgate.catalogue, _name, _proposal.version) if {
	is_string(_name)
} else := _tools[_name] if {
	is_object(_tools[_name])
}

_is_known_tool if is_object(_contract)
