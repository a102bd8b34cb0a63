# METADATA
# title: Reasons
# description: |
#   How a failing check becomes a reason, for every package that declares checks
#   (capgate.visibility, capgate.execute, capgate.review): the message template its
#   declaration gives the code, filled with the facts the check read. Also declares
#   the one check every question about a tool makes first, that the catalogue has
#   the tool.
package capgate.reasons

# METADATA
# title: The tool check, declared
# description: |
#   The catalogue has the tool a call (execute) or a proposal (review) names. When
#   it fails, unknown_tool is the only reason: nothing else is derived for a tool the
#   catalogue does not know.
# custom:
#   checks:
#     - check: tool
#       title: Tool
#       description: The catalogue has the tool, and its entry is a contract.
#       facts: [tool, proposal]
#       codes:
#         unknown_tool:
#           title: Unknown tool
#           messages:
#             call: tool {tool} is not in the catalogue
#             proposal: proposal {proposal} is for tool {tool}, which is not in the catalogue
declared := rego.metadata.rule().custom.checks

# METADATA
# title: Templates
# description: The declaration of each code declared here, by code.
templates[code] := spec if {
	some declaration in declared
	some code, spec in declaration.codes
}

# METADATA
# scope: document
# title: Template
# description: |
#   The message template of a code's declaration: its message, or the one its
#   messages give the case.
template(spec, _) := spec.message

template(spec, case) := spec.messages[case]

# METADATA
# title: Message
# description: |
#   The template with every {name} replaced by values[name] as compact JSON (a
#   string shows in quotes, a missing fact as null): gateway.model.reasons renders
#   compose's messages from the same templates the same way.
message(template, values) := strings.replace_n(
	{sprintf("{%s}", [name]): json.marshal(value) | some name, value in values},
	template,
)

# METADATA
# title: Each
# description: |
#   The values to render a code's reasons from: when the code names a fact under
#   `each` (fact, else null) and the values hold a non-empty list under it, one set
#   of values for each element, the element in the list's place (and, for an
#   object, each of its fields under its own name); else the values.
each(fact, values) := [_with_item(values, fact, item) | some item in values[fact]] if {
	is_array(values[fact])
	count(values[fact]) > 0
} else := [values]

# An element that is an object also fills its own fields ({value}, {max}...).
_with_item(values, fact, item) := object.union(object.union(values, {fact: item}), item) if is_object(item)

_with_item(values, fact, item) := object.union(values, {fact: item}) if not is_object(item)
