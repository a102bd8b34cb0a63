# METADATA
# title: Decision log masking
# description: |
#   What a deployed OPA's decision log may keep of each decision. OPA evaluates
#   data.system.log.mask for every decision it logs, with the whole log event as
#   input, and erases every JSON pointer in the set from the event before writing it.
#
#   The log keeps what an auditor needs to find a decision and see its shape, and
#   nothing that names a person, a tenant, a business object or a value derived from
#   a call's parameters: the decision id, path and bundle revision (OPA's own fields);
#   of the input, only catalogue vocabulary (tool, version, operation id, role, task
#   type, environment, budget class, stage, statuses, verdict, a link's action); of
#   the result, the allow, the reason codes, the visible tool names and the
#   catalogue digest. The rest (principal agent and tenant, subject, linked
#   resources, the resource a link names, the parameters' digest, the approval
#   whole, evidence, connections, budget amounts, proposal and task ids, reason
#   messages, obligation parameters) is erased: the gateway's
#   ledger records the same decision id with the facts that the store holds.
#
#   It is an allow-list: an input field or a decision path not named here is erased
#   whole, so a field added to the facts later stays out of the log until it is
#   added here on purpose.
package system.log

# METADATA
# title: Mask
# description: |
#   The JSON pointers OPA erases from the decision log event (input is the event).
# entrypoint: true
mask contains "/input" if not _known

mask contains "/result" if not _known

mask contains "/nd_builtin_cache"

# An input that is not an object (a known path's input always is one) goes whole.
mask contains "/input" if {
	_known
	"input" in object.keys(input)
	not is_object(input.input)
}

# A top-level input field that is not kept, or kept but not of the kept shape.
mask contains _pointer(["input", name]) if {
	_known
	is_object(input.input)
	some name, value in input.input
	not _is_kept_input(name, value)
}

# A field of a kept object that is not kept, or not a scalar.
mask contains _pointer(["input", name, field]) if {
	_known
	some name, fields in _kept
	is_array(fields)
	some field, value in input.input[name]
	not _is_kept_field(fields, field, value)
}

# A result field the decision does not define.
mask contains _pointer(["result", name]) if {
	_known
	is_object(input.result)
	some name, _ in input.result
	not name in _results[_path]
}

# Reason messages name facts (tenants, subjects, resources): codes only.
mask contains _pointer(["result", "reasons", i, "message"]) if some i, _ in input.result.reasons

mask contains _pointer(["result", "excluded", tool, i, "message"]) if {
	some tool, reasons in input.result.excluded
	some i, _ in reasons
}

# An obligation's parameters may repeat call values (an idempotency key, a limit).
mask contains _pointer(["result", "obligations", i, "params"]) if some i, _ in input.result.obligations

# What is kept of each decision's input, by field: "scalar" keeps a string, number
# or boolean; an array keeps those fields (scalars) of an object.
_inputs := {
	"capgate/compose/decision": {
		"principal": ["role"],
		"task": ["type"],
		"environment": "scalar",
		"budget_class": "scalar",
	},
	"capgate/execute/decision": {
		"principal": ["role"],
		"task": ["type"],
		"environment": "scalar",
		"budget_class": "scalar",
		"call": ["tool", "version", "operation_id"],
		"stage": "scalar",
		"operation": ["status"],
		"proposal": ["status"],
	},
	"capgate/review/decision": {
		"reviewer": ["role"],
		"proposal": ["tool", "version", "status"],
		"verdict": "scalar",
	},
	"capgate/link/decision": {
		"principal": ["role"],
		"task": ["type"],
		"link": ["action"],
	},
	"capgate/catalogue/meta/digest": {},
}

# The fields of each decision's result that are kept (with the erasures above).
_results := {
	"capgate/compose/decision": {"visible", "excluded", "catalogue_digest"},
	"capgate/execute/decision": {"allow", "reasons", "obligations", "catalogue_digest"},
	"capgate/review/decision": {"allow", "reasons", "catalogue_digest"},
	"capgate/link/decision": {"allow", "reasons", "catalogue_digest"},
	"capgate/catalogue/meta/digest": set(),
}

# OPA writes the path without a leading slash; tolerate one.
_path := trim_prefix(input.path, "/")

_known if _inputs[_path]

_kept := _inputs[_path]

# Named in _kept, and of the shape kept. (A helper, so that an unnamed field makes it
# false rather than leaving the negation above undefined.)
_is_kept_input(name, value) if _is_kept(_kept[name], value)

_is_kept("scalar", value) if _is_scalar(value)

_is_kept(fields, value) if {
	is_array(fields)
	is_object(value)
}

_is_kept_field(fields, field, value) if {
	field in fields
	_is_scalar(value)
}

_is_scalar(value) if is_string(value)

_is_scalar(value) if is_number(value)

_is_scalar(value) if is_boolean(value)

# A JSON pointer (RFC 6901) from path segments: "~" and "/" in a segment escaped.
_pointer(segments) := concat("/", ["", concat("/", [_escaped(segment) | some segment in segments])])

_escaped(segment) := replace(replace(segment, "~", "~0"), "/", "~1") if is_string(segment)

_escaped(segment) := format_int(segment, 10) if is_number(segment)
