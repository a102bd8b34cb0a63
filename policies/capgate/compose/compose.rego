# METADATA
# title: Compose
# description: |
#   Which tools may this agent see now? The intersection of the sets of tools that
#   pass each visibility check, read whole from the catalogue's index. The answer is
#   the visible names and nothing more: why each other tool is hidden is for people
#   and audits, and capgate.explain answers it on request. Query
#   data.capgate.compose.decision.
# schemas:
#   - input: schema.compose
package capgate.compose

import data.capgate.provenance
import data.capgate.visibility

# METADATA
# title: Compose decision
# description: |
#   {"visible": [name, ...], "catalogue_digest": digest}. visible holds exactly the
#   tools of the catalogue that pass every visibility check. catalogue_digest is the
#   digest of the catalogue the answer was made under (capgate.provenance), which
#   the client checks. Always defined: with no catalogue, visible is empty and the
#   digest is null.
# entrypoint: true
decision := {
	"visible": visibility.visible_tools,
	"catalogue_digest": provenance.catalogue_digest,
}
