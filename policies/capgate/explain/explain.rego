# METADATA
# title: Explain
# description: |
#   Why a decision is what it is, check by check, for people, audits and tools such
#   as `capgate explain` and `capgate diff`. Computed by the same rules as the
#   decisions: explain's compose verdicts are membership in the sets compose
#   intersects, and explain's execute checks are the ones execute's allow requires.
#   Query data.capgate.explain.compose or data.capgate.explain.execute with the
#   input of the decision it explains (docs/policy-interface.md).
package capgate.explain

import data.capgate.execute as execute_policy
import data.capgate.provenance
import data.capgate.visibility

# METADATA
# title: Explain compose
# description: |
#   {"catalogue_digest": digest, "tools": {name: {"visible": bool, "checks": [...]}}}
#   for every tool of the catalogue, each check {"check", "pass", "code", "facts"}
#   with check one of role, task, connection, environment, budget, quarantine. A
#   tool is visible exactly when every check passes and exactly when compose's
#   decision lists it.
# entrypoint: true
compose := {
	"catalogue_digest": provenance.catalogue_digest,
	"tools": visibility.tool_checks,
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
