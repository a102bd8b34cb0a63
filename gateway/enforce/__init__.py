"""Enforcement: decide, then run. The stateless dispatcher checks a call's arguments,
asks OPA once, obeys the answer only when it fits the catalogue and the call
(``verify``, which ``capgate eval`` runs too), and only then runs the tool through
the registry and normalises what happened into an Outcome."""
