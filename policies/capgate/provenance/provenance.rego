# METADATA
# title: Provenance
# description: |
#   What every decision was made under, for the compose, execute and review decisions
#   to carry. The client compares it with the catalogue it loaded and refuses a decision
#   made under any other, so an OPA restarted with another bundle behind the same
#   address is not obeyed.
package capgate.provenance

# METADATA
# scope: document
# title: Catalogue digest
# description: |
#   data.capgate.catalogue.meta.digest when it is a non-empty string, else null.
#   Never undefined, so the decisions stay defined without a catalogue; a null digest
#   matches no catalogue, and the client refuses the decision.
default catalogue_digest := null

catalogue_digest := digest if {
	meta := data.capgate.catalogue.meta
	digest := meta.digest
	is_string(digest)
	digest != ""
}
