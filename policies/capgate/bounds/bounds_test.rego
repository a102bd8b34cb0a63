package capgate.bounds_test

import data.capgate.bounds

test_a_number_up_to_the_bound_is_within if {
	bounds.at_most(5, 5)
	bounds.at_most(-1, 0)
	bounds.at_most(2.5, 3)
}

test_a_number_over_the_bound_is_not if {
	not bounds.at_most(6, 5)
	not bounds.at_most(5.000001, 5)
}

test_anything_but_numbers_is_never_within if {
	not bounds.at_most("5", 10)
	not bounds.at_most(5, "10")
	not bounds.at_most(null, 10)
	not bounds.at_most(true, 10)
	not bounds.at_most([5], 10)
}
