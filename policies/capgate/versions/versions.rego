# METADATA
# title: Kept contract versions
# description: |
#   Which contract an earlier version of a tool stands for while the catalogue keeps
#   it for the proposals made under it (data.capgate.catalogue.retained, by tool and
#   then version as a string key). Written once, for execute (at dispatch) and
#   review, so the two never read a kept version differently.
package capgate.versions

# METADATA
# title: Kept
# description: |
#   The contract catalogue keeps for tool name at version, when version is not the
#   version of the tool's contract today and the catalogue keeps it as a contract
#   (an object); undefined otherwise, and for a version that is not a number.
kept(catalogue, name, version) := contract if {
	not catalogue.tools[name].version == version
	contract := catalogue.retained[name][format_int(version, 10)]
	is_object(contract)
}
