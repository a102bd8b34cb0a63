# METADATA
# title: Tool visibility
# description: |
#   The compose checks in every form a question needs, derived from each check's one
#   declaration and definition in checks.rego (declared, _admits, _facts) and never
#   written per check. Per tool, a check passes when one of the index entries it
#   admits from holds the tool's name (is_visible, failed_checks, reasons, checks).
#   For the tool a call names, the same lookups, once per query for every check at
#   once (called_passes, called_failed_checks: what execute asks). Over the whole
#   catalogue, the names the entries hold, intersected across the checks
#   (visible_tools, which compose answers; passing_names and tool_checks, which
#   explain reads). Every form reads the same entries of the same index, so a tool
#   hidden at compose time is never callable.
# schemas:
#   - input: schema.execute
package capgate.visibility

import data.capgate.reasons as rendering

# METADATA
# title: Is the tool visible?
# description: |
#   True only when every declared compose check passes for the tool. Execute also
#   checks that the tool is in the catalogue.
is_visible(name) if count(failed_checks(name)) == 0

# METADATA
# title: The checks that hide the tool
# description: |
#   The names of the declared compose checks that the tool fails: every check that
#   cannot be shown to pass, so one with no entry, or none in the table, fails.
failed_checks(name) := {check | some check in _check_names; not _passes(check, name)}

# METADATA
# title: Why the tool is hidden
# description: |
#   The set of {"code", "message"} reasons that hide the tool: one per failing check,
#   empty exactly when is_visible(name) holds.
reasons(name) := {reason(check, name) | some check in failed_checks(name)}

# METADATA
# title: The reason a failed check gives
# description: |
#   {"code", "message"} for the compose check named check failing for the tool: the
#   code the check gives it, and that code's declared message template filled with
#   the facts the check read.
reason(check, name) := {"code": code, "message": rendering.message(templates[code], values)} if {
	key := _key_of(check, name)
	code := _code_of(check, key)
	values := object.union(_facts_of(check, key), {"tool": name})
}

# METADATA
# title: Every check, for one tool
# description: |
#   [{"check", "pass", "code", "facts"}, ...] for the declared compose checks, in
#   their declared order. code is null exactly when the check passes; facts are the
#   values the check read.
checks(name) := [_check_object(check, _key_of(check, name), _passes_or_false(check, name)) |
	some check in _check_names
]

# METADATA
# scope: document
# title: Does the called tool pass every compose check?
# description: |
#   True when every declared compose check has an entry that holds the tool the call
#   names and no exclusion holds it, so that called_failed_checks is empty: what
#   execute's allow asks, counting the checks the tool passes. The _admits table is
#   one object keyed by the declared checks (a test holds its keys to the
#   declarations), so no other key can make up the count.
default called_passes := false

called_passes if {
	count(_called_admitted) == count(declared)
	count(_called_excluded) == 0
}

# METADATA
# scope: document
# title: The checks that hide the called tool
# description: |
#   failed_checks(input.call.tool), from the same lookups as called_passes: every
#   declared check but those with an entry that holds the called tool, and those
#   with an exclusion that holds it. Execute's compose reasons. A call naming no
#   tool fails every check.
called_failed_checks := (_check_set - _called_admitted) | _called_excluded

# The checks with an entry that holds the called tool, or an exclusion. The entries
# are objects (the index's, or built from it), so a lookup needs no type check.
_called_admitted contains check if {
	tool := input.call.tool
	some check, entries in _admits
	some entry in entries
	_ = entry[tool]
}

_called_excluded contains check if {
	tool := input.call.tool
	some check, entries in _excludes
	some entry in entries
	_ = entry[tool]
}

# METADATA
# scope: document
# title: Every visible tool
# description: |
#   The catalogue's tools that pass every check. The names of the three checks with
#   the smallest entries, which hide most of a large catalogue, are read whole from
#   the index and intersected; the few candidates left are looked up one by one in
#   the entries of the other checks; excluded names are taken out.
#   visibility_forms_test.rego holds this set to the tools for which is_visible
#   holds, on well-formed and malformed data.
visible_tools := {name |
	looked_up := _looked_up_entries
	some name in _candidates
	every entries in looked_up {
		some entry in entries
		_ = entry[name]
	}
	_ = _tools[name]
} - _excluded_anywhere

# The checks in order of the names their entries hold, fewest first. Building a set
# of the keys of an entry costs more per name than looking a candidate up in it
# (OPA 1.22.4, 10,000 tools: 7.5 ms against 11.5 ms in opa bench), so only the
# first three checks' sets are built, and intersected two at a time (OPA hashes
# every set put into a set of sets).
_by_size := sort([[size, check] |
	some check in _check_names
	size := sum([count(entry) | some entry in object.get(_admits, check, []); is_object(entry)])
])

_candidates := (_names_at(0) & _names_at(1)) & _names_at(2)

# The names the i-th smallest check admits; every tool when there are fewer checks.
_names_at(i) := _admitted_names(check) if {
	[_, check] := _by_size[i]
} else := tool_names

# The object entries of each other check, one list per check.
_looked_up_entries := [entries |
	some [_, check] in array.slice(_by_size, 3, count(_by_size))
	entries := [entry | some entry in object.get(_admits, check, []); is_object(entry)]
]

_excluded_anywhere := union({_excluded_names(check) | some check in _check_names})

# METADATA
# title: Every tool, check by check
# description: |
#   {name: {"visible": bool, "checks": [...]}} for every tool of the catalogue, the
#   checks shaped as checks(name) but decided by membership in passing_names, and
#   the verdict by membership in visible_tools. For people and audits
#   (capgate.explain), not for agents. Each check object is built once for each key
#   its report depends on (_key) and each verdict, not once per tool: under a third
#   of the cost (1,000 tools). A comprehension, not a partial object rule, which OPA
#   evaluates about twice as slowly here.
tool_checks := {name: explained | # regal ignore:prefer-set-or-object-rule
	passing := passing_names
	visible := visible_tools
	built := _check_objects
	some name in tool_names
	explained := {
		"visible": name in visible,
		"checks": [built[check][_key_of(check, name)][name in passing[check]] | some check in _check_names],
	}
}

_check_objects[check] := {key: {
	true: _check_object(check, key, true),
	false: _check_object(check, key, false),
} |
	some key in {_key_of(check, name) | some name in tool_names}
} if {
	some check in _check_names
}

_check_object(check, key, true) := {"check": check, "pass": true, "code": null, "facts": _facts_of(check, key)}

_check_object(check, key, false) := {
	"check": check,
	"pass": false,
	"code": _code_of(check, key),
	"facts": _facts_of(check, key),
}

# METADATA
# title: Reason code
# description: The reason code the failing check gives the tool.
reason_code(check, name) := _code_of(check, _key_of(check, name))

# METADATA
# title: Passing names
# description: |
#   For each declared compose check, the names of the tools that pass it, read whole
#   from the index: the sets compose intersects (and capgate.explain's codes-only
#   answer reads).
passing_names[check] := _admitted_names(check) - _excluded_names(check) if some check in _check_names

# METADATA
# title: Tool names
# description: The names of the catalogue's tools (none without a catalogue).
tool_names := object.keys(_tools)

# What the declarations give the forms above.

_check_names := [declaration.check | some declaration in declared]

_check_set := {check | some check in _check_names}

# METADATA
# title: Message templates
# description: |
#   {code: template} for every code a compose check declares. Execute renders its
#   compose reasons from these; explain's compose answer carries them, so that the
#   gateway renders compose's reasons from the templates of the policies that made
#   the decision, never from a copy of its own.
templates[code] := spec.message if {
	some declaration in declared
	some code, spec in declaration.codes
}

# The one code of a check that declares one; a check that declares several picks
# among them with _code.
_single_code[declaration.check] := code if {
	some declaration in declared
	count(declaration.codes) == 1
	some code, _ in declaration.codes
}

_passes(check, name) if {
	not _is_excluded(check, name)
	some entry in _admits[check]
	is_object(entry)
	_ = entry[name]
}

_is_excluded(check, name) if {
	some entry in _excludes[check]
	_ = entry[name]
}

default _passes_or_false(_, _) := false

_passes_or_false(check, name) if _passes(check, name)

_admitted_names(check) := _union_of_keys(object.get(_admits, check, []))

_excluded_names(check) := _union_of_keys(object.get(_excludes, check, []))

# The names the entries hold. One entry's keys need no set of sets.
_union_of_keys(entries) := _members(entry) if {
	count(entries) == 1
	some entry in entries
} else := union({_members(entry) | some entry in entries})

# The names of an index entry: its keys when it is an object, else none.
_members(entry) := object.keys(entry) if is_object(entry)

else := set()

# What a check reports for a tool, with the defaults of a check that defines none:
# one key for every tool, its one declared code, no facts. The key can be false, so
# it is bound in the body rather than tested there.

_key_of(check, name) := key if {
	# regal ignore:prefer-value-in-head
	key := _key(check, name)
} else := null

_code_of(check, key) := _code(check, key) if _code(check, key)

else := _single_code[check]

_facts_of(check, key) := _facts(check, key) if _facts(check, key)

else := {}

default _tools := {}

_tools := data.capgate.catalogue.tools if is_object(data.capgate.catalogue.tools)
