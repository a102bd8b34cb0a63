"""Enforcement: decide, then run.

``dispatcher`` checks a call, asks OPA once and obeys the answer only when it fits
the catalogue and the call (``verify``, which ``capgate eval`` runs too); ``arguments``
checks what it is handed before anything is asked; ``grant`` is what it hands
forward (a call prepared, a call authorised); ``running`` runs an authorised call
through the registry's adapter and normalises what happened into an Outcome.
"""
