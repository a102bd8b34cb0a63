package system.log_test

import data.system.log

# Every value planted here that the log must not keep contains this marker.
_secret := "SECRET-7f3a"

_digest := concat("", ["sha256:", crypto.sha256(_secret)])

_principal := {"agent": concat("-", ["agent", _secret]), "role": "sales", "tenant": concat("-", ["tenant", _secret])}

_task := {
	"type": "customer_quote",
	"id": concat("-", ["task", _secret]),
	"needs": [concat("-", ["need", _secret])],
	"linked_resources": [{"type": "contact", "id": concat("-", ["c", _secret])}],
}

_compose_input := {
	"principal": _principal,
	"task": _task,
	"connections": {concat("-", ["crm", _secret]): "active"},
	"environment": "production",
	"budget_class": "standard",
	"quarantined": [concat("-", ["tool", _secret])],
}

_execute_input := object.union(_compose_input, {
	"call": {
		"tool": "quote.send",
		"version": 1,
		"operation_id": "op-1",
		"subject": {"type": "contact", "id": concat("-", ["c", _secret])},
		"params_digest": _digest,
	},
	"stage": "dispatch",
	"approval": {
		"kind": "exact_content_and_recipient",
		"tool": "quote.send",
		"operation_id": "op-1",
		"tenant": concat("-", ["tenant", _secret]),
		"digest": _digest,
		"expires_at": "2030-01-01T00:00:00Z",
		"approved_by": concat("-", ["reviewer", _secret]),
		"used": false,
	},
	"evidence": [concat("-", ["evidence", _secret])],
	"budget": {"remaining": 7, "cost": 1},
	"operation": {"status": "none"},
	"proposal": {"id": concat("-", ["pr", _secret]), "status": "approved"},
	# a field the facts may gain later: erased until the mask names it
	"message": concat(" ", ["hello", _secret]),
})

_reasons := [
	{"code": "subject_not_linked", "message": concat(" ", ["contact", _secret, "is not linked"])},
	{"code": "tenant_mismatch", "message": concat(" ", ["tenant", _secret])},
]

_execute_result := {
	"allow": false,
	"reasons": _reasons,
	"obligations": [{"code": "idempotency_key", "params": {"key": concat("-", ["op", _secret])}}],
	"catalogue_digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000",
}

_compose_result := {
	"visible": ["contact.read"],
	"excluded": {"quote/send~x": _reasons, "quote.send": [_reasons[1]]},
	"catalogue_digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000",
	"debug": _secret,
}

_review_input := {
	"reviewer": {"agent": concat("-", ["maria", _secret]), "role": "sales_manager", "tenant": concat("-", ["t", _secret])},
	"proposal": {
		"id": concat("-", ["pr", _secret]),
		"tenant": concat("-", ["t", _secret]),
		"tool": "quote.send",
		"status": "pending",
		"proposer": _principal,
	},
	"verdict": "approved",
}

_event(path, facts, result) := {
	"decision_id": "4ca636c1-55e4-417a-b1d8-4aceb67960d1",
	"path": path,
	"input": facts,
	"result": result,
	"bundles": {"capgate": {"revision": "sha256:1"}},
}

# The event as OPA writes it: every pointer of the mask erased.
_masked(event) := json.remove(event, log.mask) if every pointer in log.mask {
	is_string(pointer)
}

# Nothing in the masked event, keys included, holds the marker.
_clean(event) if not contains(json.marshal(_masked(event)), _secret)

# The control: unmasked, every event here holds it.
test_deny_unmasked_events_hold_the_marker if {
	contains(json.marshal(_event("capgate/execute/decision", _execute_input, {})), _secret)
	contains(json.marshal(_event("capgate/compose/decision", {}, _compose_result)), _secret)
}

test_allow_execute_log_keeps_the_shape_only if {
	event := _event("capgate/execute/decision", _execute_input, _execute_result)
	_clean(event) with input as event
	masked := _masked(event) with input as event
	masked.input == {
		"principal": {"role": "sales"},
		"task": {"type": "customer_quote"},
		"environment": "production",
		"budget_class": "standard",
		"call": {"tool": "quote.send", "version": 1, "operation_id": "op-1"},
		"stage": "dispatch",
		"operation": {"status": "none"},
		"proposal": {"status": "approved"},
	}
	masked.result == {
		"allow": false,
		"reasons": [{"code": "subject_not_linked"}, {"code": "tenant_mismatch"}],
		"obligations": [{"code": "idempotency_key"}],
		"catalogue_digest": _execute_result.catalogue_digest,
	}
	masked.decision_id == event.decision_id
	masked.bundles == event.bundles
}

test_allow_compose_log_keeps_tools_and_codes if {
	event := _event("/capgate/compose/decision", _compose_input, _compose_result)
	_clean(event) with input as event
	masked := _masked(event) with input as event
	masked.input == {
		"principal": {"role": "sales"},
		"task": {"type": "customer_quote"},
		"environment": "production",
		"budget_class": "standard",
	}
	masked.result == {
		"visible": ["contact.read"],
		"excluded": {
			"quote/send~x": [{"code": "subject_not_linked"}, {"code": "tenant_mismatch"}],
			"quote.send": [{"code": "tenant_mismatch"}],
		},
		"catalogue_digest": _compose_result.catalogue_digest,
	}
}

test_allow_review_log_keeps_roles_tool_status_and_verdict if {
	result := {"allow": true, "reasons": [], "catalogue_digest": "sha256:0"}
	event := _event("capgate/review/decision", _review_input, result)
	_clean(event) with input as event
	masked := _masked(event) with input as event
	masked.input == {
		"reviewer": {"role": "sales_manager"},
		"proposal": {"tool": "quote.send", "status": "pending"},
		"verdict": "approved",
	}
}

test_allow_link_log_keeps_role_task_type_and_action if {
	facts := {
		"principal": _principal,
		"authenticated_by": concat(":", ["token", _secret]),
		"task": _task,
		"link": {
			"action": "link",
			"task_id": concat("-", ["task", _secret]),
			"resource": {"type": "repository", "id": concat("-", ["repo", _secret])},
		},
	}
	result := {"allow": false, "reasons": [{"code": "link_own_task", "message": _secret}], "catalogue_digest": "sha256:0"}
	event := _event("capgate/link/decision", facts, result)
	_clean(event) with input as event
	masked := _masked(event) with input as event
	masked.input == {"principal": {"role": "sales"}, "task": {"type": "customer_quote"}, "link": {"action": "link"}}
	masked.result == {"allow": false, "reasons": [{"code": "link_own_task"}], "catalogue_digest": "sha256:0"}
}

test_allow_the_catalogue_digest_is_kept if {
	event := {"path": "capgate/catalogue/meta/digest", "result": "sha256:0", "decision_id": "x"}
	log.mask == {"/nd_builtin_cache"} with input as event
}

test_deny_unknown_paths_keep_nothing if {
	every path in ["capgate/other/decision", "system/authz/allow", "", "capgate"] {
		event := _event(path, _execute_input, _execute_result)
		{"/input", "/result"} & log.mask == {"/input", "/result"} with input as event
		_clean(event) with input as event
	}
}

test_deny_kept_fields_of_another_shape_are_erased if {
	odd := object.union(_execute_input, {
		"environment": {"name": _secret},
		"stage": [_secret],
		"call": {"tool": {"name": _secret}, "version": 1, "operation_id": [_secret]},
		"principal": [_secret],
	})
	event := _event("capgate/execute/decision", odd, _execute_result)
	_clean(event) with input as event
	masked := _masked(event) with input as event
	masked.input.call == {"version": 1}
	not masked.input.environment
	not masked.input.principal
}

test_deny_an_input_that_is_not_an_object_is_erased if {
	every odd in [_secret, [_secret, {"id": _secret}], 7, false, null] {
		event := _event("capgate/execute/decision", odd, _execute_result)
		"/input" in log.mask with input as event
		_clean(event) with input as event
	}
}

test_allow_kept_scalars_of_any_json_type if {
	facts := {"stage": true, "environment": 7, "call": {"tool": "quote.send", "version": 1, "operation_id": false}}
	event := _event("capgate/execute/decision", facts, {})
	_masked(event) == event with input as event
}
