package capgate.versions_test

import data.capgate.versions

_catalogue := {
	"tools": {"pay": {"name": "pay", "version": 2}},
	"retained": {"pay": {"1": {"name": "pay", "version": 1}, "0": "not a contract"}},
}

test_allow_a_kept_version_reads_its_contract if {
	versions.kept(_catalogue, "pay", 1) == {"name": "pay", "version": 1}
}

test_deny_todays_version_is_not_a_kept_one if not versions.kept(_catalogue, "pay", 2)

test_deny_what_is_not_kept_as_a_contract if every version in [0, 3, "1", null] {
	not versions.kept(_catalogue, "pay", version)
}

test_deny_a_tool_the_catalogue_keeps_nothing_of if {
	not versions.kept(_catalogue, "refund", 1)
	not versions.kept({"tools": {}}, "pay", 1)
}
