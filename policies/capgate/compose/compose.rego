# METADATA
# title: Compose
# description: |
#   Which tools may this agent see now? Runs the visibility checks once over the
#   whole of data.capgate.catalogue and answers with the visible names and, for every
#   other tool, all the reasons that hide it. Query data.capgate.compose.decision.
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
#     - tool_quarantined
package capgate.compose

import data.capgate.provenance
import data.capgate.visibility

# METADATA
# title: Compose decision
# description: |
#   {"visible": [name, ...], "excluded": {name: [{"code", "message"}, ...]},
#   "catalogue_digest": digest}. Every tool in the catalogue appears in exactly one
#   of the two lists. catalogue_digest is the digest of the catalogue the answer was
#   made under (capgate.provenance), which the client checks. Always defined: with no
#   catalogue both lists are empty and the digest is null. Asks the whole-catalogue form of the
#   visibility checks, not is_visible and reasons for each tool: OPA's function calls
#   per tool and check cost more than the checks (OPA 1.22.4, 10,000 tools: 0.65 s
#   against 1.7 s).
# entrypoint: true
# custom:
#   reason_codes:
#     - role_not_granted
#     - not_needed_by_task
#     - connection_missing
#     - tool_not_enabled_for_tenant
#     - connection_revoked
#     - environment_restricted
#     - budget_class_exceeded
#     - tool_quarantined
decision := {
	"visible": visibility.visible_tools,
	"excluded": visibility.excluded_tools,
	"catalogue_digest": provenance.catalogue_digest,
}
