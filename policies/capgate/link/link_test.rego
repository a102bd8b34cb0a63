package capgate.link_test

import data.capgate.fixtures_test
import data.capgate.link

# The fixture catalogue, with a sales manager who may link opportunities and
# contacts to the tasks of their tenant.
_catalogue := json.patch(fixtures_test.catalogue, [{
	"op": "add",
	"path": "/roles/sales_manager/links",
	"value": {"opportunity": true, "contact": true},
}])

# The baseline: a sales manager's agent, working in its own coordination task,
# links an opportunity to a sales agent's task.
_input := {
	"principal": {"agent": "coordinator", "role": "sales_manager", "tenant": "acme", "acts_for": null},
	"authenticated_by": "token:coordinator",
	"task": {"id": "coord-1", "type": "coordination"},
	"link": {"action": "link", "task_id": "deal-7", "resource": {"type": "opportunity", "id": "opp-42"}},
}

_summary(decision) := {"allow": decision.allow, "codes": {r.code | some r in decision.reasons}}

_facts(patch) := object.union(_input, patch)

test_allow_a_listed_type_on_another_task if {
	decision := link.decision with input as _input with data.capgate.catalogue as _catalogue
	decision == {"allow": true, "reasons": set(), "catalogue_digest": fixtures_test.digest}
}

test_allow_unlink_on_the_same_terms if {
	facts := _facts({"link": {"action": "unlink"}})
	decision := link.decision with input as facts with data.capgate.catalogue as _catalogue
	decision.allow
}

test_allow_every_listed_type if every kind in ["opportunity", "contact"] {
	facts := _facts({"link": {"resource": {"type": kind}}})
	link.decision.allow with input as facts with data.capgate.catalogue as _catalogue
}

# One fact changed per case; each case asserts the exact set of codes.
_deny_cases := {
	"a type the role does not list": {
		"patch": {"link": {"resource": {"type": "repository"}}},
		"codes": {"link_not_permitted"},
	},
	"a role that links nothing": {
		"patch": {"principal": {"role": "sales"}},
		"codes": {"link_not_permitted"},
	},
	"a role the catalogue does not declare": {
		"patch": {"principal": {"role": "intruder"}},
		"codes": {"link_not_permitted"},
	},
	"a role that is not a string": {
		"patch": {"principal": {"role": ["sales_manager"]}},
		"codes": {"link_not_permitted"},
	},
	"a resource type that is not a string": {
		"patch": {"link": {"resource": {"type": {"opportunity": true}}}},
		"codes": {"link_not_permitted"},
	},
	"the agent's own task": {
		"patch": {"link": {"task_id": "coord-1"}},
		"codes": {"link_own_task"},
	},
	"unlinking from the agent's own task": {
		"patch": {"link": {"task_id": "coord-1", "action": "unlink"}},
		"codes": {"link_own_task"},
	},
	"the agent's task unnamed": {
		"patch": {"task": {"id": null}},
		"codes": {"link_own_task"},
	},
	"the agent's task not an object": {
		"patch": {"task": "coord-1"},
		"codes": {"link_own_task"},
	},
	"the target task unnamed": {
		"patch": {"link": {"task_id": ""}},
		"codes": {"link_own_task"},
	},
	"an action that is neither": {
		"patch": {"link": {"action": "relink"}},
		"codes": {"link_action_invalid"},
	},
	"no link at all": {
		"patch": {"link": null},
		"codes": {"link_not_permitted", "link_own_task", "link_action_invalid"},
	},
	"no principal": {
		"patch": {"principal": "coordinator"},
		"codes": {"link_not_permitted"},
	},
}

test_deny_matrix if {
	got := {note: _summary(decision) |
		some note, case in _deny_cases
		decision := link.decision with input as _facts(case.patch) with data.capgate.catalogue as _catalogue
	}
	want := {note: {"allow": false, "codes": case.codes} | some note, case in _deny_cases}
	got == want
}

test_deny_everything_without_a_catalogue if {
	decision := link.decision with input as _input with data.capgate.catalogue as {}
	decision.allow == false
	decision.catalogue_digest == null
	{r.code | some r in decision.reasons} == {"link_not_permitted"}
}

test_deny_an_input_that_is_not_an_object if {
	decision := link.decision with input as "link everything" with data.capgate.catalogue as _catalogue
	decision.allow == false
	{r.code | some r in decision.reasons} == {"link_not_permitted", "link_own_task", "link_action_invalid"}
}

test_messages_name_the_role_the_type_and_what_it_may_link if {
	facts := _facts({"link": {"resource": {"type": "repository"}}})
	decision := link.decision with input as facts with data.capgate.catalogue as _catalogue
	[reason] := [r | some r in decision.reasons]
	want := `role "sales_manager" may not link resources of type "repository" (it may link: %s)`
	reason.message == sprintf(want, [`["contact","opportunity"]`])
}

test_messages_say_when_the_role_is_undeclared if {
	facts := _facts({"principal": {"role": "intruder"}})
	decision := link.decision with input as facts with data.capgate.catalogue as _catalogue
	[reason] := [r | some r in decision.reasons]
	reason.message == `the agent's role "intruder" is not declared in the catalogue`
}

test_messages_name_the_agent_and_its_own_task if {
	facts := _facts({"link": {"task_id": "coord-1"}})
	decision := link.decision with input as facts with data.capgate.catalogue as _catalogue
	[reason] := [r | some r in decision.reasons]
	reason.message == `agent "coordinator" works in task "coord-1", and may not change the links of the task it works in`
}
