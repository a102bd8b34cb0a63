# METADATA
# title: Bounds
# description: |
#   One comparison for every rule that holds a call's value against a number the
#   catalogue declares (a role's limit, a quorum rule's threshold), so that what a
#   malformed fact does is decided once: a value or bound that is not a number is
#   never within it.
package capgate.bounds

# METADATA
# title: At most
# description: |
#   True when both are numbers and actual is not over bound. Anything else is
#   false, so a limit reads it as over, and a quorum rule as applying.
at_most(actual, bound) if {
	is_number(actual)
	is_number(bound)
	actual <= bound
}
