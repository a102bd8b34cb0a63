package capgate.execute_test

# Table-driven tests compare a table's rows with what the policy answered, and fail
# naming the rows that differ: opa test shows a failing test's print output, so
# `make policy-test` (and `capgate policy-test --watch`) prints for each wrong row
# its name as written in the table, what the policy answered and what the row
# expects. A row the policy gave no answer for (an error, or an undefined decision)
# shows as "no answer".

# The rows of a table whose answers (got) differ from what they expect (want), keyed
# by the row's name; printed, with the table's name, before the test compares.
_failed_rows(table, got, want) := wrong if {
	wrong := {note: {"got": answer, "want": expected} |
		some note, expected in want
		answer := object.get(got, note, "no answer")
		answer != expected
	}

	# The point of this helper, not a leftover: opa test shows it when the test fails.
	# regal ignore:print-or-trace-call
	print("table", table, "rows that failed:", count(wrong), wrong)
}

test_failed_rows_names_every_wrong_or_missing_row if {
	got := {"same": 1, "differs": 2}
	want := {"same": 1, "differs": 3, "missing": 4}
	_failed_rows("example", got, want) == {
		"differs": {"got": 2, "want": 3},
		"missing": {"got": "no answer", "want": 4},
	}
	_failed_rows("example", got, {"same": 1}) == {}
}
