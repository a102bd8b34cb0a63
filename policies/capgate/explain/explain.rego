# METADATA
# title: Explain
# description: |
#   Why a decision is what it is, check by check, for people, audits and tools such
#   as `capgate explain` and `capgate diff`. Computed by the same rules as the
#   decisions: explain's compose verdicts are membership in the sets compose
#   intersects, and explain's execute checks are the ones execute's allow requires.
#   Query data.capgate.explain.compose, data.capgate.explain.compose_codes or
#   data.capgate.explain.execute with the input of the decision it explains
#   (docs/policy-interface.md).
package capgate.explain

import data.capgate.execute as execute_policy
import data.capgate.provenance
import data.capgate.visibility

# METADATA
# title: Explain compose
# description: |
#   {"catalogue_digest": digest, "templates": {code: template}, "tools": {name:
#   {"visible": bool, "checks": [...]}}} for every tool of the catalogue, each check
#   {"check", "pass", "code", "facts"} for each compose check capgate.visibility
#   declares, in its declared order. A tool is visible exactly when every check
#   passes and exactly when compose's decision lists it. templates are the declared
#   message templates of the compose codes, which the gateway fills with each failing
#   check's facts: the messages people read come from the policies that decided.
# entrypoint: true
compose := {
	"catalogue_digest": provenance.catalogue_digest,
	"templates": visibility.templates,
	"tools": visibility.tool_checks,
}

# METADATA
# title: Explain compose, codes only
# description: |
#   {"catalogue_digest": digest, "hidden": {name: [code, ...]}}: every tool of the
#   catalogue that compose hides, with the codes of the checks it fails, sorted: the
#   failing codes of explain.compose, without its check objects and facts, at a
#   fraction of its cost. For each check, the tools that fail it are the catalogue
#   minus the tools the check's index set holds (the sets compose intersects); a
#   tool's codes are those its failing checks give it. For capgate diff, which
#   compares reason sets over a whole decision matrix.
# entrypoint: true
compose_codes := {
	"catalogue_digest": provenance.catalogue_digest,
	"hidden": _hidden_codes,
}

# The catalogue's names, the set of names that pass each check and the code a failing
# check gives a tool: capgate.visibility's own, never copied.
_names := visibility.tool_names

_passing := visibility.passing_names

_code(check, name) := visibility.reason_code(check, name)

# For each compose check, the tools that fail it.
_failing[check] := _names - passing if some check, passing in _passing

# Only the tools in some failing set are visited: the hidden ones. A comprehension,
# not a partial object rule, as in capgate.visibility: OPA evaluates it faster.
_hidden_codes := {name: codes | # regal ignore:prefer-set-or-object-rule
	failing := _failing
	some name in union({names | some names in failing})
	codes := sort([_code(check, name) | some check, names in failing; name in names])
}

# METADATA
# title: Explain execute
# description: |
#   {"allow": bool, "catalogue_digest": digest, "checks": [...]}: allow is execute's
#   allow, and checks every check execute made of the call, the tool's compose checks
#   then the call-time checks (capgate.execute.checks).
# entrypoint: true
execute := {
	"allow": execute_policy.allow,
	"catalogue_digest": provenance.catalogue_digest,
	"checks": execute_policy.checks,
}
