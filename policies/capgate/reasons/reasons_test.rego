package capgate.reasons_test

import data.capgate.reasons

# Each row renders a template with its values, as the reasons do.
test_allow_message_rows if {
	got := {note: reasons.message(row.template, row.values) | some note, row in _message_rows}
	want := {note: row.want | some note, row in _message_rows}
	got == want
}

_message_rows := {
	"strings quoted": {
		"template": "tool {tool} is not granted to role {role}",
		"values": {"tool": "quote.send", "role": "support"},
		"want": `tool "quote.send" is not granted to role "support"`,
	},
	"lists and null as compact JSON": {
		"template": "needs {needs}, status {status}",
		"values": {"needs": ["a", "b"], "status": null},
		"want": `needs ["a","b"], status null`,
	},
	"a value is not filled in again": {
		"template": "{a} and {b}",
		"values": {"a": "{b}", "b": 1},
		"want": `"{b}" and 1`,
	},
	"a name without a value stays": {
		"template": "tool {tool}: {other}",
		"values": {"tool": "t"},
		"want": `tool "t": {other}`,
	},
}

test_allow_template_picks_the_message_or_the_case if {
	reasons.template({"message": "one"}, null) == "one"
	reasons.template({"messages": {"a": "first", "b": "second"}}, "b") == "second"
	not reasons.template({"messages": {"a": "first"}}, "c")
}

# One set of values per element of the list an `each` names; else the values.
test_allow_each_rows if {
	got := {note: reasons.each(row.fact, row.values) | some note, row in _each_rows}
	want := {note: row.want | some note, row in _each_rows}
	got == want
}

_each_rows := {
	"one per element": {
		"fact": "missing",
		"values": {"tool": "t", "missing": ["a", "b"]},
		"want": [{"tool": "t", "missing": "a"}, {"tool": "t", "missing": "b"}],
	},
	"an empty list: the values": {
		"fact": "missing",
		"values": {"tool": "t", "missing": []},
		"want": [{"tool": "t", "missing": []}],
	},
	"not a list: the values": {
		"fact": "missing",
		"values": {"tool": "t", "missing": "a"},
		"want": [{"tool": "t", "missing": "a"}],
	},
	"no each": {
		"fact": null,
		"values": {"tool": "t"},
		"want": [{"tool": "t"}],
	},
}

# The tool check is declared once, for both of its questions.
test_allow_the_tool_check_is_declared_with_a_message_per_question if {
	[declaration] := reasons.declared
	declaration.check == "tool"
	object.keys(reasons.templates) == {"unknown_tool"}
	object.keys(reasons.templates.unknown_tool.messages) == {"call", "proposal"}
}
